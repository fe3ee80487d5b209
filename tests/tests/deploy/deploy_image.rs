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
use slotgate_tests::package::{ok, run};
use slotgate_tests::podman::Podman;
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

/// The image's user, entry point and `PATH`; its size, printed.
fn assert_config(podman: &Podman) {
    let format = "{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Env}}|{{.Size}}";
    let inspect = podman.run(&["image", "inspect", "--format", format, IMAGE]);
    let inspect = ok("podman image inspect", &inspect);
    let fields: Vec<&str> = inspect.trim().split('|').collect();
    assert_eq!(fields[0], format!("{USER}:{USER}"), "{inspect}");
    assert_eq!(fields[1], r#"["/usr/local/bin/slotgate"]"#, "{inspect}");
    assert!(fields[2].contains("PATH=/usr/local/bin"), "{inspect}");
    eprintln!("image {IMAGE}: {} bytes", fields[3]);
}

/// The files of a container of the image (`podman export`) are exactly those `stage.sh` listed.
fn assert_contents(podman: &Podman, staged: &str) {
    let created = ok("podman create", &podman.run(&["create", IMAGE]));
    let export = unique_dir("image-export").join("image.tar");
    let out = podman.run(&["export", "-o", export.to_str().unwrap(), created.trim()]);
    ok("podman export", &out);
    let tar = ok("tar -t", &run(Command::new("tar").arg("-tvf").arg(&export)));
    let _ = std::fs::remove_dir_all(export.parent().unwrap());
    let _ = podman.run(&["rm", created.trim()]);
    let files: BTreeSet<&str> = tar
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches("./"))
        .collect();
    let expected: BTreeSet<&str> = staged.lines().filter(|l| !l.is_empty()).collect();
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
}

/// A pod's volumes for the slotgate container, laid out in a temp dir as the kubelet would: the
/// ConfigMap's slotgate.toml, the Secret's tokens (root's, group 65532, 0440), the state and socket
/// emptyDirs (the pod user's). The policies are those `scripts/build-policies.sh` built.
struct PodVolumes {
    dir: std::path::PathBuf,
    read_token: String,
}

impl PodVolumes {
    fn new() -> Self {
        let dir = unique_dir("pod");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for sub in ["config", "secrets", "state", "sockets"] {
            std::fs::create_dir(dir.join(sub)).unwrap();
        }
        let config = slotgate_toml(&object("configmap.yaml", "ConfigMap"));
        let toml = toml::to_string(&config).unwrap();
        std::fs::write(dir.join("config/slotgate.toml"), toml).unwrap();
        let (admin_token, read_token) = ("a".repeat(32), "r".repeat(32));
        for (key, token) in [("admin-token", &admin_token), ("read-token", &read_token)] {
            let file = dir.join("secrets").join(key);
            std::fs::write(&file, format!("{token}\n")).unwrap();
            give(&file, Some(0), 0o440);
        }
        give(&dir.join("state"), Some(USER), 0o700);
        give(&dir.join("sockets"), Some(USER), 0o770);
        PodVolumes { dir, read_token }
    }

    /// `--volume` options: each at the slotgate container's mount of the pod volume.
    fn options(&self, container: &Value) -> Vec<String> {
        let policy = slotgate_tests::wat::built("request-guard");
        let policies = policy.parent().unwrap().to_path_buf();
        [
            (self.dir.join("config"), "slotgate-config", "ro"),
            (policies, "slotgate-policies", "ro"),
            (self.dir.join("secrets"), "slotgate-admin", "ro"),
            (self.dir.join("state"), "slotgate-state", "rw"),
            (self.dir.join("sockets"), "sockets", "rw"),
        ]
        .into_iter()
        .map(|(host, volume, mode)| {
            format!(
                "--volume={}:{}:{mode}",
                host.display(),
                kube_mount(container, volume)
            )
        })
        .collect()
    }
}

impl Drop for PodVolumes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `podman run --detach` of the image as `container` (the Kubernetes example's slotgate container)
/// runs: its command, args and environment, with `volumes`, a read-only root, its user, no
/// capabilities and no privilege escalation; on the host's network, listening on `port` and the
/// admin `admin_port` instead of 8081 and 9464.
fn pod_run(container: &Value, volumes: &PodVolumes, port: u16, admin_port: u16) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--detach",
        "--read-only",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
    ]
    .map(String::from)
    .to_vec();
    args.push(format!("--user={USER}:{USER}"));
    args.extend(Podman::run_options());
    args.extend(volumes.options(container));
    args.push(format!("--env=SLOTGATE_LISTEN=tcp:127.0.0.1:{port}"));
    args.push(format!(
        "--env=SLOTGATE_ADMIN_LISTEN=tcp:127.0.0.1:{admin_port}"
    ));
    for env in container["env"].as_array().into_iter().flatten() {
        let (name, value) = (
            env["name"].as_str().unwrap(),
            env["value"].as_str().unwrap(),
        );
        args.push(format!("--env={name}={value}"));
    }
    let command = container["command"][0].as_str().expect("command");
    args.push(format!("--entrypoint={command}"));
    args.push(IMAGE.into());
    let container_args = container["args"].as_array().expect("args");
    args.extend(
        container_args
            .iter()
            .map(|a| a.as_str().unwrap().to_owned()),
    );
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_image_from_scratch_holds_no_shell_runs_as_non_root_and_serves_the_pod_config() {
    let podman = Podman::new();
    let staged = stage(&podman);
    assert_config(&podman);
    assert_contents(&podman, &staged);

    let podman_run = |extra: &[&str]| {
        let mut args: Vec<String> = vec!["run".into(), "--rm".into()];
        args.extend(Podman::run_options());
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        podman.run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let version = ok("IMAGE --version", &podman_run(&[IMAGE, "--version"]));
    assert!(version.starts_with("slotgate "), "{version}");
    let shell = podman_run(&["--entrypoint", "/bin/sh", IMAGE, "-c", "true"]);
    assert!(!shell.status.success(), "the image has a shell");
    let check = ok(
        "IMAGE check",
        &podman_run(&[IMAGE, "check", "--admin-listen", "off"]),
    );
    assert!(check.contains("upstream"), "{check}");

    // As the Kubernetes example runs it, a fake llama-server on the socket volume.
    let deployment = object("deployment.yaml", "Deployment");
    let gate = slotgate_container(&deployment);
    let volumes = PodVolumes::new();
    let up = FakeUpstream::instant()
        .at(volumes.dir.join("sockets/llama.sock"))
        .start()
        .await;
    give(up.socket_path(), None, 0o660);
    let (port, admin_port) = (free_port(), free_port());
    let args = pod_run(gate, &volumes, port, admin_port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // conmon and slotgate outlive the call: hold off the systemd tests' socket hand-overs.
    let spawning = slotgate_tests::systemd::spawning().await;
    let id = ok("podman run --detach", &podman.run(&args))
        .trim()
        .to_owned();
    drop(spawning);

    let logs = || {
        let out = podman.run(&["logs", &id]);
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        format!("{o}{e}")
    };

    let admin = Client::tcp(([127, 0, 0, 1], admin_port).into());
    let live = tokio::time::timeout(Duration::from_secs(30), async {
        while !matches!(admin.try_send(client::get_request("/livez")).await, Ok(r) if r.status == 200)
        {
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
    let metrics = admin
        .clone()
        .with_bearer(&volumes.read_token)
        .get("/metrics")
        .await;
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    assert!(metrics.body.contains("slotgate_"), "{}", metrics.body);

    // The process is uid 65532, without capabilities.
    let pid = podman.run(&["inspect", "--format", "{{.State.Pid}}", &id]);
    let pid = ok("podman inspect", &pid);
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
    let line = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap()
            .to_owned()
    };
    let uids = line("Uid:");
    assert!(
        uids.split_whitespace()
            .skip(1)
            .all(|u| u == USER.to_string()),
        "{uids}"
    );
    assert_eq!(
        line("CapEff:").split_whitespace().nth(1),
        Some("0000000000000000")
    );

    // SIGTERM drains and exits 0, as when the kubelet stops the sidecar.
    ok("podman stop", &podman.run(&["stop", "--time", "20", &id]));
    let code = podman.run(&["inspect", "--format", "{{.State.ExitCode}}", &id]);
    assert_eq!(ok("podman inspect", &code).trim(), "0", "{}", logs());
    let state = std::fs::read_dir(volumes.dir.join("state")).unwrap().next();
    assert!(state.is_some(), "no state in the state volume");
    let _ = podman.run(&["rm", "--force", &id]);
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
