//! The Kubernetes examples (`examples/kubernetes/`, `fleet/` included) are deployable as written:
//! schema-valid and strict for the Kubernetes releases they claim, custom resources valid against
//! their CRDs, the ConfigMaps' slotgate.toml accepted by the real binary, the probes and ports
//! pointing at what slotgate serves, the admin tokens coming from the Secret the README tells to
//! create (and the PodMonitor sending the read-only one), and the PrometheusRule carrying exactly
//! `alerts.yml`'s rules.
//!
//! Needs the offline validator: `eval "$(bash scripts/setup-kubernetes-tools.sh)"; export
//! KUBE_VALIDATE`, and the example policies built (`scripts/build-policies.sh`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::gate::command;
use slotgate_tests::kube::{self, named, object, seconds, slotgate_toml, tcp_port};
use slotgate_tests::*;

/// The single pod and the fleet: (deployment file, its ConfigMap file).
const VARIANTS: &[(&str, &str)] = &[
    ("deployment.yaml", "configmap.yaml"),
    ("fleet/deployment.yaml", "fleet/configmap.yaml"),
];

/// The Secret holding the admin tokens, which README.md tells the operator to create (no manifest
/// carries a token).
const ADMIN_SECRET: &str = "slotgate-admin";

/// slotgate.toml's token settings and the Secret's key each reads (a Secret volume without `items`
/// makes each key a file of its own name).
const TOKEN_FILES: &[(&str, &str)] = &[
    ("admin-token-file", "admin-token"),
    ("admin-read-token-file", "read-token"),
];

fn pod_spec(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]
}

fn slotgate_container(deployment: &Value) -> &Value {
    named(&pod_spec(deployment)["initContainers"], "slotgate")
}

fn llama_container(deployment: &Value) -> &Value {
    named(&pod_spec(deployment)["containers"], "llama-server")
}

fn container_port(container: &Value, name: &str) -> u16 {
    let port = named(&container["ports"], name)["containerPort"]
        .as_u64()
        .expect("containerPort");
    u16::try_from(port).expect("a port number")
}

/// The value following `flag` in a container's args.
fn arg_after<'a>(container: &'a Value, flag: &str) -> &'a str {
    let args = container["args"].as_array().expect("args");
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} missing from {args:?}"));
    args[i + 1].as_str().expect("a string argument")
}

fn str_of<'a>(t: &'a toml::Table, key: &str) -> &'a str {
    t.get(key)
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("slotgate.toml lacks `{key}`"))
}

/// The directory a volume is mounted at in a container.
fn mount_path<'a>(container: &'a Value, volume: &str) -> &'a str {
    container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == volume))
        .and_then(|m| m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("volume {volume} is not mounted in {}", container["name"]))
}

/// The pod's volume that holds Secret `secret`.
fn secret_volume<'a>(deployment: &'a Value, secret: &str) -> &'a Value {
    pod_spec(deployment)["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["secret"]["secretName"] == secret))
        .unwrap_or_else(|| panic!("no volume holds the Secret {secret}"))
}

/// A token as `openssl rand -hex 32` makes one.
fn random_token() -> String {
    (0..32)
        .map(|_| format!("{:02x}", fastrand::u8(..)))
        .collect()
}

/// [`local_config`]'s file and the tokens written in place of the Secret's.
struct LocalConfig {
    file: PathBuf,
    admin_token: String,
    read_token: String,
}

impl LocalConfig {
    fn remove(&self) {
        let _ = std::fs::remove_dir_all(self.file.parent().unwrap());
    }
}

/// The ConfigMap's slotgate.toml with each `[[policy]]` path moved from the pod's policy mount to
/// the policy as `scripts/build-policies.sh` built it, and each admin token file moved from the
/// slotgate container's mount of the `slotgate-admin` Secret to a file holding a token the test
/// made (a different one each), written to a temp dir.
fn local_config(deployment: &Value, config_map: &Value) -> LocalConfig {
    let mount = mount_path(slotgate_container(deployment), "slotgate-policies");
    let mut table = slotgate_toml(config_map);
    let dir = unique_dir("kube");

    let secret_volume = secret_volume(deployment, ADMIN_SECRET)["name"]
        .as_str()
        .expect("a volume name");
    let secret_mount = Path::new(mount_path(slotgate_container(deployment), secret_volume));
    let (admin_token, read_token) = (random_token(), random_token());
    assert_ne!(admin_token, read_token);
    for ((setting, key), token) in TOKEN_FILES.iter().zip([&admin_token, &read_token]) {
        let path = PathBuf::from(str_of(&table, setting));
        assert_eq!(
            path.parent(),
            Some(secret_mount),
            "{setting} = {}: not in the mount {} of the Secret {ADMIN_SECRET}",
            path.display(),
            secret_mount.display()
        );
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some(*key),
            "{setting} must read the Secret's key {key}"
        );
        let file = dir.join(key);
        std::fs::write(&file, format!("{token}\n")).unwrap();
        table.insert((*setting).into(), file.display().to_string().into());
    }

    let policies = table
        .get_mut("policy")
        .and_then(|p| p.as_array_mut())
        .expect("the example configures policies");
    for policy in policies {
        let policy = policy.as_table_mut().expect("[[policy]] is a table");
        let path = Path::new(policy["path"].as_str().expect("a policy path"));
        assert_eq!(
            path.parent(),
            Some(Path::new(mount)),
            "{} is not in the policies mount {mount}",
            path.display()
        );
        let stem = path.file_stem().and_then(|s| s.to_str()).expect("a name");
        let built = slotgate_tests::wat::built(stem);
        assert_eq!(
            built.file_name(),
            path.file_name(),
            "the ConfigMap names {}, the build makes {}",
            path.display(),
            built.display()
        );
        policy.insert("path".into(), built.display().to_string().into());
    }
    let file = dir.join("slotgate.toml");
    std::fs::write(&file, toml::to_string(&table).expect("serialise TOML")).unwrap();
    LocalConfig {
        file,
        admin_token,
        read_token,
    }
}

/// The slotgate container's environment as the kubelet would set it, Secrets resolved from the
/// manifests next to the deployment.
fn container_env(deployment_file: &str, container: &Value) -> Vec<(String, String)> {
    let Some(env) = container["env"].as_array() else {
        return Vec::new();
    };
    env.iter()
        .map(|e| {
            let name = e["name"].as_str().expect("env name").to_owned();
            if let Some(v) = e["value"].as_str() {
                return (name, v.to_owned());
            }
            let secret = &e["valueFrom"]["secretKeyRef"];
            let dir = Path::new(deployment_file).parent().expect("a directory");
            let found = kube::manifests()
                .iter()
                .filter(|f| f.parent() == Some(&kube::examples().join(dir)))
                .flat_map(|f| kube::documents(f))
                .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == secret["name"])
                .unwrap_or_else(|| panic!("no Secret {} beside {deployment_file}", secret["name"]));
            let key = secret["key"].as_str().expect("secretKeyRef.key");
            let value = found["stringData"][key]
                .as_str()
                .unwrap_or_else(|| panic!("Secret {} has no stringData.{key}", secret["name"]));
            (name, value.to_owned())
        })
        .collect()
}

#[test]
fn every_manifest_is_valid_for_recent_kubernetes_with_unknown_fields_rejected() {
    let files = kube::manifests();
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(kube::examples())
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    for expected in [
        "configmap.yaml",
        "deployment.yaml",
        "service.yaml",
        "podmonitor.yaml",
        "prometheusrule.yaml",
        "fleet/configmap.yaml",
        "fleet/deployment.yaml",
        "fleet/secret.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing: {names:?}"
        );
    }

    let out = kube::validate(&files);
    let report = kube::text(&out);
    assert!(out.status.success(), "invalid manifests:\n{report}");
    // Every document of every file was checked, once per version, and none was skipped.
    let documents: usize = files.iter().map(|f| kube::documents(f).len()).sum();
    let ok_lines = report.lines().filter(|l| l.starts_with("OK ")).count();
    assert_eq!(
        ok_lines,
        documents * kube::VERSIONS.len(),
        "one OK line per document and version expected:\n{report}"
    );
    for kind in ["PodMonitor", "PrometheusRule"] {
        assert!(
            report.contains(&format!("{kind}/")),
            "{kind} was not validated:\n{report}"
        );
    }
}

#[test]
fn the_validator_rejects_an_unknown_field_in_a_deployment_and_in_a_custom_resource() {
    let dir = unique_dir("kube-bad");
    let cases = [
        // A misspelt field a lenient validator would let through: the sidecar would silently
        // become an init container that must exit before llama-server starts.
        (
            "deployment.yaml",
            "          restartPolicy: Always\n",
            "          restartPolicyy: Always\n",
            "restartPolicyy",
        ),
        (
            "podmonitor.yaml",
            "      path: /metrics\n",
            "      path: /metrics\n      scrapeEvery: 15s\n",
            "scrapeEvery",
        ),
    ];
    for (file, from, to, field) in cases {
        let text = std::fs::read_to_string(kube::examples().join(file)).unwrap();
        assert!(text.contains(from), "{file} no longer contains {from:?}");
        let broken = dir.join(file);
        std::fs::write(&broken, text.replacen(from, to, 1)).unwrap();
        let out = kube::validate(&[broken]);
        let report = kube::text(&out);
        assert!(
            !out.status.success(),
            "the validator accepted `{field}` in {file}:\n{report}"
        );
        assert!(
            report.contains(field),
            "the error does not name `{field}`:\n{report}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_configmaps_slotgate_toml_passes_slotgate_check() {
    for (deployment_file, config_file) in VARIANTS {
        let deployment = object(deployment_file, "Deployment");
        let config_map = object(config_file, "ConfigMap");
        let config = local_config(&deployment, &config_map);
        let mut cmd = command();
        cmd.arg("check").arg("--config").arg(&config.file);
        for (k, v) in container_env(deployment_file, slotgate_container(&deployment)) {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run slotgate check");
        assert!(
            out.status.success(),
            "slotgate check rejects {config_file}'s slotgate.toml (with {deployment_file}'s \
             environment): {}",
            kube::text(&out)
        );
        // The token files were read and checked: their paths are printed, never the tokens.
        let report = kube::text(&out);
        for (setting, key) in TOKEN_FILES {
            let file = config.file.with_file_name(key);
            assert!(
                report.contains(&file.display().to_string()),
                "check does not name {setting}'s file: {report}"
            );
        }
        for token in [&config.admin_token, &config.read_token] {
            assert!(!report.contains(token.as_str()), "check printed a token");
        }
        config.remove();
    }
}

#[test]
fn ports_probes_and_shutdown_agree_with_slotgate_toml() {
    let service = object("service.yaml", "Service");
    let monitor = object("podmonitor.yaml", "PodMonitor");
    for (deployment_file, config_file) in VARIANTS {
        let deployment = object(deployment_file, "Deployment");
        let config = slotgate_toml(&object(config_file, "ConfigMap"));
        let spec = pod_spec(&deployment);
        let gate = slotgate_container(&deployment);
        let llama = llama_container(&deployment);
        let at = |what: &str| format!("{deployment_file}: {what}");

        assert_eq!(gate["restartPolicy"], "Always", "{}", at("native sidecar"));

        // Client and admin ports: the listeners of slotgate.toml, on the pod's address.
        let listen: Vec<&str> = config["listen"]
            .as_array()
            .expect("listen is a list")
            .iter()
            .filter_map(|l| l.as_str())
            .collect();
        let (host, port) = tcp_port(
            listen
                .iter()
                .find(|l| l.starts_with("tcp:"))
                .expect("a TCP listener for the Service"),
        );
        assert_eq!(
            host,
            "0.0.0.0",
            "{}",
            at("client listener reachable from the Service")
        );
        assert_eq!(port, container_port(gate, "http"), "{}", at("port http"));
        let (host, admin_port) = tcp_port(str_of(&config, "admin-listen"));
        assert_eq!(host, "0.0.0.0", "{}", at("admin reachable by the kubelet"));
        assert_eq!(
            admin_port,
            container_port(gate, "admin"),
            "{}",
            at("port admin")
        );

        // Probes: on the admin port; startup and liveness on /livez (not waiting for the model),
        // readiness on /readyz.
        for (probe, path) in [
            ("startupProbe", "/livez"),
            ("livenessProbe", "/livez"),
            ("readinessProbe", "/readyz"),
        ] {
            let get = &gate[probe]["httpGet"];
            assert_eq!(get["path"], path, "{}", at(probe));
            assert_eq!(get["port"], "admin", "{}", at(probe));
        }

        // The Service and the PodMonitor select these pods and use ports they have.
        let labels = &deployment["spec"]["template"]["metadata"]["labels"];
        for (what, selector) in [
            ("Service", &service["spec"]["selector"]),
            ("PodMonitor", &monitor["spec"]["selector"]["matchLabels"]),
        ] {
            for (k, v) in selector.as_object().expect("a label selector") {
                assert_eq!(&labels[k], v, "{}", at(&format!("{what} selects the pod")));
            }
        }
        for port in service["spec"]["ports"].as_array().unwrap() {
            let target = port["targetPort"].as_str().expect("named target ports");
            container_port(gate, target);
        }
        for endpoint in monitor["spec"]["podMetricsEndpoints"].as_array().unwrap() {
            assert_eq!(endpoint["port"], "admin", "{}", at("PodMonitor port"));
            assert_eq!(endpoint["path"], "/metrics", "{}", at("PodMonitor path"));
        }

        // llama-server: as many slots as slotgate forwards at once, on the socket slotgate dials,
        // in a volume both containers mount.
        let np: i64 = arg_after(llama, "-np").parse().expect("-np N");
        assert_eq!(
            Some(np),
            config["slots"].as_integer(),
            "{}",
            at("-np = slots")
        );
        let socket = arg_after(llama, "--host");
        assert!(socket.ends_with(".sock"), "{}", at("--host is a socket"));
        assert_eq!(
            format!("unix:{socket}"),
            str_of(&config, "upstream"),
            "{}",
            at("upstream")
        );
        let dir = Path::new(socket).parent().unwrap().to_str().unwrap();
        assert_eq!(mount_path(llama, "sockets"), dir, "{}", at("socket dir"));
        assert_eq!(mount_path(gate, "sockets"), dir, "{}", at("socket dir"));
        assert!(
            llama["args"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "--metrics"),
            "{}",
            at("--metrics")
        );

        // Shutdown: llama-server outlives slotgate's drain, the grace period covers both.
        let drain = seconds(str_of(&config, "drain-timeout"));
        let sleep = llama["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_f64()
            .expect("llama-server preStop sleep");
        let grace = spec["terminationGracePeriodSeconds"]
            .as_f64()
            .expect("terminationGracePeriodSeconds");
        assert!(sleep > drain, "{}", at("preStop sleep > drain-timeout"));
        assert!(
            grace >= sleep + drain + 10.0,
            "{}",
            at("grace period covers the sleep, the drain and a margin")
        );

        // Hardening and scheduling.
        assert_eq!(
            spec["securityContext"]["runAsNonRoot"],
            true,
            "{}",
            at("non-root")
        );
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault",
            "{}",
            at("a seccomp profile that lets wasmtime's JIT map code")
        );
        assert_eq!(
            spec["enableServiceLinks"],
            false,
            "{}",
            at("no SLOTGATE_* service links")
        );
        for c in [gate, llama] {
            let sc = &c["securityContext"];
            let name = c["name"].as_str().unwrap();
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", at(name));
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", at(name));
            assert_eq!(
                sc["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{}",
                at(name)
            );
            for r in ["cpu", "memory"] {
                assert!(
                    c["resources"]["requests"][r].is_string(),
                    "{}",
                    at(&format!("{name} requests {r}"))
                );
            }
        }
    }
}

#[test]
fn the_admin_tokens_come_from_the_secret_and_the_podmonitor_sends_the_read_token() {
    // No manifest carries a token: the operator creates the Secret (README.md).
    for file in kube::manifests() {
        for doc in kube::documents(&file) {
            assert!(
                !(doc["kind"] == "Secret" && doc["metadata"]["name"] == ADMIN_SECRET),
                "{} holds the Secret {ADMIN_SECRET}: create it with kubectl instead",
                file.display()
            );
        }
    }
    let readme = std::fs::read_to_string(kube::examples().join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("kubectl create secret generic {ADMIN_SECRET}")),
        "README.md tells how to create the Secret {ADMIN_SECRET}"
    );
    for (_, key) in TOKEN_FILES {
        assert!(
            readme.contains(&format!("--from-literal={key}=")),
            "README.md's Secret lacks the key {key}"
        );
    }

    for (deployment_file, config_file) in VARIANTS {
        let deployment = object(deployment_file, "Deployment");
        let config = slotgate_toml(&object(config_file, "ConfigMap"));
        let at = |what: &str| format!("{deployment_file}: {what}");

        // slotgate.toml names both files, and they differ (local_config checks where they are).
        let files: Vec<&str> = TOKEN_FILES
            .iter()
            .map(|(s, _)| str_of(&config, s))
            .collect();
        assert_ne!(files[0], files[1], "{config_file}: two token files");

        // The Secret, whole (no items: each key a file of its own name), read-only, mounted into
        // slotgate only (llama-server runs as the same user), without subPath (the kubelet then
        // updates the files on a change, and slotgate's watch follows).
        let volume = secret_volume(&deployment, ADMIN_SECRET);
        let name = volume["name"].as_str().unwrap();
        assert!(volume["secret"]["items"].is_null(), "{}", at("no items"));
        let gate = slotgate_container(&deployment);
        let mount = gate["volumeMounts"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["name"] == name))
            .unwrap_or_else(|| panic!("{}", at("slotgate mounts the Secret")));
        assert_eq!(mount["readOnly"], true, "{}", at("read-only mount"));
        assert!(mount["subPath"].is_null(), "{}", at("no subPath"));
        let llama = llama_container(&deployment);
        assert!(
            !llama["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == name),
            "{}",
            at("llama-server does not mount the tokens")
        );

        // The kubelet writes a Secret's files owned by root, group fsGroup: slotgate (a non-root
        // user in that group) reads them through the group bit, and nobody else may.
        let mode = volume["secret"]["defaultMode"]
            .as_u64()
            .unwrap_or_else(|| panic!("{}", at("the Secret volume sets defaultMode")));
        assert_eq!(mode & 0o040, 0o040, "{}", at("group-readable tokens"));
        assert_eq!(mode & 0o027, 0, "{}", at("no write, nothing for others"));
        assert!(
            pod_spec(&deployment)["securityContext"]["fsGroup"].is_u64(),
            "{}",
            at("fsGroup, which the token files get as their group")
        );
    }

    // Prometheus scrapes with the read-only token, from the same Secret.
    let monitor = object("podmonitor.yaml", "PodMonitor");
    let read_key = TOKEN_FILES
        .iter()
        .find(|(s, _)| *s == "admin-read-token-file")
        .map(|(_, k)| *k)
        .unwrap();
    for endpoint in monitor["spec"]["podMetricsEndpoints"].as_array().unwrap() {
        let auth = &endpoint["authorization"];
        assert!(
            auth["type"]
                .as_str()
                .is_some_and(|t| t.eq_ignore_ascii_case("Bearer")),
            "the PodMonitor sends a bearer token: {endpoint}"
        );
        assert_eq!(
            auth["credentials"],
            serde_json::json!({"name": ADMIN_SECRET, "key": read_key}),
            "the PodMonitor sends the Secret's read-only token"
        );
    }
}

#[test]
fn the_fleet_differs_from_the_single_pod_only_in_replicas_spread_and_the_store() {
    let single = object("deployment.yaml", "Deployment");
    let fleet = object("fleet/deployment.yaml", "Deployment");
    assert!(
        fleet["spec"]["replicas"].as_u64() > Some(1),
        "a fleet has several replicas"
    );

    // The pod: the same, but for the spread and the store's URL.
    let mut fleet_pod = pod_spec(&fleet).clone();
    fleet_pod
        .as_object_mut()
        .unwrap()
        .remove("topologySpreadConstraints")
        .expect("the fleet spreads its replicas");
    let gate = fleet_pod["initContainers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == "slotgate")
        .unwrap();
    let env = gate["env"].as_array_mut().unwrap();
    let before = env.len();
    env.retain(|e| e["name"] != "SLOTGATE_STATE_REDIS_URL");
    assert_eq!(env.len() + 1, before, "the fleet passes the store's URL");
    assert_eq!(
        &fleet_pod,
        pod_spec(&single),
        "fleet/deployment.yaml's pod drifted from deployment.yaml's"
    );

    // slotgate.toml: the same, plus the redis state and token-budget last in the chain.
    let mut single_toml = slotgate_toml(&object("configmap.yaml", "ConfigMap"));
    let mut fleet_toml = slotgate_toml(&object("fleet/configmap.yaml", "ConfigMap"));
    let state = fleet_toml
        .remove("state")
        .expect("the fleet configures [state]");
    assert_eq!(state["backend"].as_str(), Some("redis"));
    assert!(
        state.get("fleet").and_then(|f| f.as_str()).is_some(),
        "the fleet names itself (state.fleet)"
    );
    assert!(
        state.get("redis-url").is_none(),
        "the store's URL comes from the Secret, not the ConfigMap"
    );
    let single_state = single_toml
        .remove("state")
        .expect("the pod keeps budgets on disk");
    assert!(single_state
        .get("backend")
        .is_none_or(|b| b.as_str() != Some("redis")));
    // Budgets on disk, in the volume the pod mounts there for them.
    let dir = single_state
        .get("dir")
        .and_then(|d| d.as_str())
        .expect("[state] dir");
    assert_eq!(
        mount_path(slotgate_container(&single), "slotgate-state"),
        dir,
        "state.dir is the slotgate-state mount"
    );
    let single_chain = single_toml.remove("policy").unwrap();
    let fleet_chain = fleet_toml.remove("policy").unwrap();
    let (single_chain, fleet_chain) = (
        single_chain.as_array().unwrap(),
        fleet_chain.as_array().unwrap(),
    );
    assert_eq!(&fleet_chain[..single_chain.len()], &single_chain[..]);
    assert_eq!(
        fleet_chain
            .last()
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str()),
        Some("token-budget"),
        "token-budget goes last in the chain"
    );
    assert_eq!(
        fleet_toml, single_toml,
        "fleet slotgate.toml drifted from the single pod's"
    );

    let pdb = object("fleet/poddisruptionbudget.yaml", "PodDisruptionBudget");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        fleet["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn the_prometheus_rule_carries_exactly_the_groups_of_alerts_yml() {
    let alerts = kube::workspace().join("examples/prometheus/alerts.yml");
    assert!(
        alerts.exists(),
        "{} is missing: the PrometheusRule must carry its groups",
        alerts.display()
    );
    let alerts = kube::documents(&alerts);
    assert_eq!(alerts.len(), 1, "alerts.yml is one document");
    let rule = object("prometheusrule.yaml", "PrometheusRule");
    let (ours, theirs) = (&rule["spec"]["groups"], &alerts[0]["groups"]);
    if ours != theirs {
        // Name the first rule that differs rather than printing both files.
        let rules = |groups: &Value| -> Vec<Value> {
            groups
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect()
        };
        let (a, b) = (rules(ours), rules(theirs));
        let first = (0..a.len().max(b.len()))
            .find(|&i| a.get(i) != b.get(i))
            .map(|i| {
                format!(
                    "rule {i}:\n  prometheusrule.yaml: {:?}\n  alerts.yml:          {:?}",
                    a.get(i),
                    b.get(i)
                )
            })
            .unwrap_or_else(|| "the groups' names or fields".to_owned());
        panic!(
            "prometheusrule.yaml's spec.groups differ from examples/prometheus/alerts.yml's \
             groups (copy them over, indented under `spec:`); first difference at {first}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_paths_answer_as_the_deployment_expects_on_a_real_slotgate() {
    let deployment = object("deployment.yaml", "Deployment");
    let config = local_config(&deployment, &object("configmap.yaml", "ConfigMap"));
    let gate_spec = slotgate_container(&deployment).clone();
    let path = |probe: &str| {
        gate_spec[probe]["httpGet"]["path"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let monitor = object("podmonitor.yaml", "PodMonitor");
    let metrics_path = monitor["spec"]["podMetricsEndpoints"][0]["path"]
        .as_str()
        .unwrap()
        .to_owned();

    // The ConfigMap's settings, policies and tokens, with slotgate's own TCP admin listener as in
    // the pod (the harness picks a free port instead of 9464). As in the pod, slotgate starts
    // first: llama-server's socket does not exist yet.
    let sockets = unique_dir("kube-sockets");
    let socket = sockets.join("llama.sock");
    let mut gate = Gate::new()
        .opt("--config", config.file.display())
        .upstream_path(&socket)
        .no_wait_ready()
        .start()
        .await;
    assert!(gate.admin_addr().starts_with("tcp:"));
    // The kubelet's probes carry no token.
    let admin = gate.admin().clone().without_bearer();

    // Before llama-server is up: started and live (so the kubelet starts llama-server), not ready
    // (so the Service sends nothing yet).
    for probe in ["startupProbe", "livenessProbe"] {
        let r = admin.get(&path(probe)).await;
        assert_eq!(
            r.status,
            200,
            "{probe} {} before llama-server: {}",
            path(probe),
            r.body
        );
    }
    let r = admin.get(&path("readinessProbe")).await;
    assert_eq!(r.status, 503, "readiness before llama-server: {}", r.body);

    let _up = FakeUpstream::instant().at(&socket).start().await;
    // llama-server up: ready.
    let readiness = path("readinessProbe");
    eventually(Duration::from_secs(5), "readiness probe 200", || async {
        (admin.get(&readiness).await.status == 200).then_some(())
    })
    .await;
    let r = admin.get(&path("livenessProbe")).await;
    assert_eq!(r.status, 200);

    // The PodMonitor's path needs a token (the ConfigMap's token files are in force); with the
    // read-only token, as the PodMonitor sends it, it is slotgate's Prometheus text, policies from
    // the ConfigMap loaded.
    let r = admin.get(&metrics_path).await;
    assert_eq!(r.status, 401, "{metrics_path} without a token: {}", r.body);
    gate.use_admin_token(&config.read_token);
    let r = gate.admin().get(&metrics_path).await;
    assert_eq!(r.status, 200, "{metrics_path}: {}", r.body);
    let ready = Metrics::parse(&r.body).value("slotgate_upstream_ready", &[]);
    assert_eq!(ready, Some(1.0), "{}", r.body);
    let chain = &gate.status().await["policies"]["chain"];
    assert_eq!(
        chain[0]["name"], "request-guard",
        "the ConfigMap's policy chain is loaded: {chain}"
    );
    // What admin-read-token-file holds changes nothing (the two files are not swapped); what
    // admin-token-file holds opens the admin routes too.
    let r = gate
        .admin()
        .post_json("/slots/0?action=erase", &serde_json::json!({}))
        .await;
    assert_eq!(
        r.status, 403,
        "a change with the read-only token: {}",
        r.body
    );
    gate.use_admin_token(&config.admin_token);
    assert!(gate.status().await["slots"].is_object());
    config.remove();
    let _ = std::fs::remove_dir_all(sockets);
}
