//! The container image (`packaging/image/`): staged by `stage.sh` from the binary this test run
//! built, built `FROM scratch` with podman, holding the binary, the libraries `ldd` names, the loader
//! and a passwd entry and nothing else (no shell), running as the non-root user 65532; run as the
//! Kubernetes example runs it (its command and args, its ConfigMap's slotgate.toml, the policies,
//! the Secret's tokens, a read-only root, no capabilities), it serves /livez, /readyz, a chat through
//! the fake upstream and /metrics with the read-only token, and drains on SIGTERM.
//!
//! Needs podman and runc (`eval "$(bash scripts/setup-package.sh)"; export CARGO_DEB PODMAN`), the
//! built binary and the Rust example policies (`scripts/build-policies.sh`).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::gate::{binary_path, free_port};
use slotgate_tests::kube::{named, object, slotgate_toml};
use slotgate_tests::package::{ok, run, Podman};
use slotgate_tests::*;

/// The tag docs/packaging.md builds and the Kubernetes example runs.
const IMAGE: &str = "registry.example.com/slotgate:0.1.0";
/// The user the image runs as, and the example pod's runAsUser, runAsGroup and fsGroup.
const USER: u32 = 65532;

fn slotgate_container(deployment: &Value) -> &Value {
    named(
        &deployment["spec"]["template"]["spec"]["initContainers"],
        "slotgate",
    )
}

/// Makes `path` the pod user's, with `mode`, as the kubelet makes an emptyDir or a Secret's files.
fn give(path: &Path, uid: Option<u32>, mode: u32) {
    std::os::unix::fs::chown(path, uid, Some(USER)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn stage(podman: &Podman) -> String {
    let context = unique_dir("image");
    let stage = workspace().join("packaging/image/stage.sh");
    let staged = run(Command::new("bash")
        .arg(&stage)
        .arg(binary_path())
        .arg(&context));
    let listing = ok("packaging/image/stage.sh", &staged);
    ok(
        "podman build",
        &podman.run(&["build", "--quiet", "-t", IMAGE, context.to_str().unwrap()]),
    );
    let _ = std::fs::remove_dir_all(&context);
    listing
}

#[test]
fn the_kubernetes_example_runs_the_image_docs_packaging_builds() {
    let docs = std::fs::read_to_string(workspace().join("docs/packaging.md")).unwrap();
    assert!(
        docs.contains(&format!("podman build -t {IMAGE} ")),
        "docs/packaging.md builds {IMAGE}"
    );
    for file in ["deployment.yaml", "fleet/deployment.yaml"] {
        let deployment = object(file, "Deployment");
        let gate = slotgate_container(&deployment);
        assert_eq!(gate["image"], IMAGE, "{file}");
        assert_eq!(gate["command"], serde_json::json!(["slotgate"]), "{file}");
        let security = &deployment["spec"]["template"]["spec"]["securityContext"];
        for key in ["runAsUser", "runAsGroup", "fsGroup"] {
            assert_eq!(security[key], USER, "{file}: {key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_image_from_scratch_holds_no_shell_runs_as_non_root_and_serves_the_pod_config() {
    let podman = Podman::new();
    let staged = stage(&podman);

    // What the image is: its user, entry point, and exactly the staged files.
    let inspect = ok(
        "podman image inspect",
        &podman.run(&[
            "image",
            "inspect",
            "--format",
            "{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Env}}|{{.Size}}",
            IMAGE,
        ]),
    );
    let fields: Vec<&str> = inspect.trim().split('|').collect();
    assert_eq!(fields[0], format!("{USER}:{USER}"), "{inspect}");
    assert_eq!(fields[1], r#"["/usr/local/bin/slotgate"]"#, "{inspect}");
    assert!(fields[2].contains("PATH=/usr/local/bin"), "{inspect}");
    let size: u64 = fields[3].parse().unwrap();
    eprintln!("image {IMAGE}: {size} bytes");

    let created = ok("podman create", &podman.run(&["create", IMAGE]));
    let export = unique_dir("image-export").join("image.tar");
    ok(
        "podman export",
        &podman.run(&["export", "-o", export.to_str().unwrap(), created.trim()]),
    );
    let tar = ok("tar -t", &run(Command::new("tar").arg("-tvf").arg(&export)));
    let files: BTreeSet<String> = tar
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches("./").to_owned())
        .collect();
    let expected: BTreeSet<String> = staged
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    assert_eq!(
        files, expected,
        "the image holds what stage.sh staged, only"
    );
    for must in [
        "usr/local/bin/slotgate",
        "etc/passwd",
        "lib64/ld-linux-x86-64.so.2",
    ] {
        assert!(files.contains(must), "{must} missing: {files:?}");
    }
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with("/sh") || f.ends_with("bash")),
        "{files:?}"
    );
    let _ = std::fs::remove_dir_all(export.parent().unwrap());

    let opts = Podman::run_options();
    let podman_run = |extra: &[&str]| {
        let mut args: Vec<&str> = vec!["run", "--rm"];
        args.extend(opts.iter().map(String::as_str));
        args.extend(extra);
        podman.run(&args)
    };
    let version = ok(
        "podman run IMAGE --version",
        &podman_run(&[IMAGE, "--version"]),
    );
    assert!(version.starts_with("slotgate "), "{version}");
    let shell = podman_run(&["--entrypoint", "/bin/sh", IMAGE, "-c", "true"]);
    assert!(!shell.status.success(), "the image has a shell");
    let check = ok(
        "podman run IMAGE check",
        &podman_run(&[IMAGE, "check", "--admin-listen", "off"]),
    );
    assert!(check.contains("upstream"), "{check}");

    // As the Kubernetes example runs it: its command, args and settings; the ConfigMap's
    // slotgate.toml, the policies, the Secret's tokens (root's, group 65532, 0440), the state and
    // socket emptyDirs; a read-only root, no capabilities, no privilege escalation.
    let deployment = object("deployment.yaml", "Deployment");
    let gate = slotgate_container(&deployment);
    let pod = unique_dir("pod");
    std::fs::set_permissions(&pod, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config_dir = pod.join("config");
    std::fs::create_dir(&config_dir).unwrap();
    let config = slotgate_toml(&object("configmap.yaml", "ConfigMap"));
    std::fs::write(
        config_dir.join("slotgate.toml"),
        toml::to_string(&config).unwrap(),
    )
    .unwrap();
    let secrets = pod.join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    let (admin_token, read_token) = ("a".repeat(32), "r".repeat(32));
    for (key, token) in [("admin-token", &admin_token), ("read-token", &read_token)] {
        std::fs::write(secrets.join(key), format!("{token}\n")).unwrap();
        give(&secrets.join(key), Some(0), 0o440);
    }
    let state = pod.join("state");
    std::fs::create_dir(&state).unwrap();
    give(&state, Some(USER), 0o700);
    let sockets = pod.join("sockets");
    std::fs::create_dir(&sockets).unwrap();
    give(&sockets, Some(USER), 0o770);
    let up = FakeUpstream::instant()
        .at(sockets.join("llama.sock"))
        .start()
        .await;
    give(up.socket_path(), None, 0o660);
    let policy = slotgate_tests::wat::built("request-guard");
    let policies = policy.parent().unwrap();

    let mounts = [
        (config_dir.as_path(), "slotgate-config", "ro"),
        (policies, "slotgate-policies", "ro"),
        (secrets.as_path(), "slotgate-admin", "ro"),
        (state.as_path(), "slotgate-state", "rw"),
        (sockets.as_path(), "sockets", "rw"),
    ];
    let mut args: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        "--read-only".into(),
        format!("--user={USER}:{USER}"),
        "--cap-drop=all".into(),
        "--security-opt=no-new-privileges".into(),
    ];
    args.extend(opts.iter().cloned());
    for (host, volume, mode) in mounts {
        let at = kube_mount(gate, volume);
        args.push(format!("--volume={}:{at}:{mode}", host.display()));
    }
    // The pod's ports on this host's network: free ones instead of 8081 and 9464.
    let (port, admin_port) = (free_port(), free_port());
    args.push(format!("--env=SLOTGATE_LISTEN=tcp:127.0.0.1:{port}"));
    args.push(format!(
        "--env=SLOTGATE_ADMIN_LISTEN=tcp:127.0.0.1:{admin_port}"
    ));
    for env in gate["env"].as_array().into_iter().flatten() {
        args.push(format!(
            "--env={}={}",
            env["name"].as_str().unwrap(),
            env["value"].as_str().unwrap()
        ));
    }
    let command = gate["command"][0].as_str().expect("command");
    args.push(format!("--entrypoint={command}"));
    args.push(IMAGE.into());
    args.extend(
        gate["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().unwrap().to_owned()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = ok("podman run --detach", &podman.run(&args))
        .trim()
        .to_owned();
    let logs = || {
        let out = podman.run(&["logs", &id]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };

    let admin = Client::tcp(([127, 0, 0, 1], admin_port).into());
    let probe = admin.clone();
    let live = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(r) = probe.try_send(client::get_request("/livez")).await {
                if r.status == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(live.is_ok(), "no /livez within 30 s:\n{}", logs());
    eventually(Duration::from_secs(10), "/readyz 200", || {
        let c = admin.clone();
        async move { (c.get("/readyz").await.status == 200).then_some(()) }
    })
    .await;
    let chat = Client::tcp(([127, 0, 0, 1], port).into())
        .post_chat(&Req::chat("image"))
        .await;
    assert_eq!(chat.status, 200, "{}\n{}", chat.body, logs());
    assert_eq!(admin.get("/metrics").await.status, 401);
    let metrics = admin.clone().with_bearer(&read_token).get("/metrics").await;
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    assert!(metrics.body.contains("slotgate_"), "{}", metrics.body);

    // The process is uid 65532, without capabilities.
    let pid = ok(
        "podman inspect",
        &podman.run(&["inspect", "--format", "{{.State.Pid}}", &id]),
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
    let line = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap()
            .to_owned()
    };
    assert!(
        line("Uid:")
            .split_whitespace()
            .skip(1)
            .all(|u| u == USER.to_string()),
        "{}",
        line("Uid:")
    );
    assert_eq!(
        line("CapEff:").split_whitespace().nth(1),
        Some("0000000000000000")
    );

    // SIGTERM drains and exits 0, as when the kubelet stops the sidecar.
    ok("podman stop", &podman.run(&["stop", "--time", "20", &id]));
    let code = ok(
        "podman inspect",
        &podman.run(&["inspect", "--format", "{{.State.ExitCode}}", &id]),
    );
    assert_eq!(code.trim(), "0", "{}", logs());
    assert!(
        std::fs::read_dir(&state).unwrap().next().is_some(),
        "no state in the state volume"
    );
    let _ = podman.run(&["rm", "--force", &id]);
    drop(up);
    let _ = std::fs::remove_dir_all(&pod);
}

/// Where the slotgate container mounts `volume` in the Kubernetes example.
fn kube_mount(container: &Value, volume: &str) -> String {
    container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == volume))
        .and_then(|m| m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("the slotgate container does not mount {volume}"))
        .to_owned()
}
