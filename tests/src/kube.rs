//! The Kubernetes examples (`examples/kubernetes/`): the offline validator that
//! `scripts/setup-kubernetes-tools.sh` installs, the manifests as JSON, and lookups into them.
//!
//! The validator is `$KUBE_VALIDATE`, else the setup script's default install. It checks every
//! document strictly (unknown fields and unknown kinds fail): built-in kinds against the schemas of
//! the Kubernetes releases asked for, custom resources against their CRD schemas; nothing is fetched.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Kubernetes releases the manifests must be valid for: the oldest they claim (sidecar containers
/// and the preStop `sleep` action on by default) and the newest the validator knows.
pub const VERSIONS: &[&str] = &["1.30", "1.37"];

const SETUP: &str = "scripts/setup-kubernetes-tools.sh";

pub fn workspace() -> PathBuf {
    crate::workspace().canonicalize().expect("workspace dir")
}

/// `examples/kubernetes/`.
pub fn examples() -> PathBuf {
    workspace().join("examples/kubernetes")
}

/// Every `.yaml`/`.yml` under `examples/kubernetes/`, subdirectories included, sorted.
pub fn manifests() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read examples/kubernetes") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&examples(), &mut out);
    out.sort();
    out
}

/// The validator's path; panics, naming the setup script, when it is not installed.
pub fn validator() -> PathBuf {
    let path = match std::env::var_os("KUBE_VALIDATE") {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("SLOTGATE_CACHE").map_or_else(
                || {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/slotgate")
                },
                PathBuf::from,
            );
            cache.join("kubernetes-tools/bin/kube-validate")
        }
    };
    assert!(
        path.is_file(),
        "the Kubernetes manifest validator is not installed at {}: run \
         `eval \"$(bash {SETUP})\"; export KUBE_VALIDATE` first",
        path.display()
    );
    path
}

/// `kube-validate validate -k V... FILES` for every version in [`VERSIONS`].
pub fn validate(files: &[PathBuf]) -> Output {
    let mut cmd = Command::new(validator());
    cmd.arg("validate");
    for v in VERSIONS {
        cmd.args(["-k", v]);
    }
    cmd.args(files)
        .output()
        .expect("run the Kubernetes validator")
}

/// stdout and stderr of a run, for messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The YAML documents of `path`, as JSON.
pub fn documents(path: &Path) -> Vec<Value> {
    let out = Command::new(validator())
        .arg("to-json")
        .arg(path)
        .output()
        .expect("run the Kubernetes validator");
    assert!(
        out.status.success(),
        "{} does not parse as YAML: {}",
        path.display(),
        text(&out)
    );
    match serde_json::from_slice(&out.stdout).expect("to-json prints JSON") {
        Value::Array(docs) => docs,
        other => panic!("to-json printed {other}"),
    }
}

/// The one document of `kind` in `path` (relative to `examples/kubernetes/`).
pub fn object(path: &str, kind: &str) -> Value {
    let file = examples().join(path);
    let mut found: Vec<Value> = documents(&file)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "{path} must hold exactly one {kind}");
    found.remove(0)
}

/// An entry of a list of named things (containers, ports, volumes, env) by its `name`.
pub fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|l| l.iter().find(|x| x["name"] == name))
        .unwrap_or_else(|| panic!("no entry named {name} in {list}"))
}

/// The `slotgate.toml` of a ConfigMap.
pub fn slotgate_toml(config_map: &Value) -> toml::Table {
    let text = config_map["data"]["slotgate.toml"]
        .as_str()
        .expect("the ConfigMap has data.slotgate.toml");
    toml::from_str(text).unwrap_or_else(|e| panic!("slotgate.toml does not parse: {e}\n{text}"))
}

/// The port of a `tcp:HOST:PORT` (or `HOST:PORT`) address, with its host.
pub fn tcp_port(addr: &str) -> (String, u16) {
    let hostport = addr.strip_prefix("tcp:").unwrap_or(addr);
    let (host, port) = hostport
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{addr} is not tcp:HOST:PORT"));
    (host.to_owned(), port.parse().expect("a port number"))
}

/// Seconds of a duration such as `30s`, `2m` or `500ms`.
pub fn seconds(duration: &str) -> f64 {
    let (n, unit) = duration
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((duration, "s"), |i| duration.split_at(i));
    let n: f64 = n.parse().expect("a number");
    match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => panic!("unknown duration unit {other} in {duration}"),
    }
}
