//! Test harness for slotgate: a fake llama-server, a launcher for the real `slotgate` binary, and clients.
//!
//! Every test drives real sockets end to end:
//!
//! ```text
//!   test ──Client──▶ unix/tcp listen socket ──▶ slotgate (child process) ──▶ unix socket ──▶ FakeUpstream
//!     └──────────Client──▶ admin listener (/status, /metrics, /readyz, /livez)
//! ```
//!
//! - [`fake_upstream`]: a scriptable llama-server stand-in that counts concurrency and cancellations honestly.
//! - [`gate`]: builds the command line, starts `slotgate`, waits for `/livez`, scrapes admin endpoints.
//! - [`client`]: HTTP/1.1 over Unix or TCP, whole or streamed responses, and raw sockets for abuse tests.
//! - [`llama`]: launcher for a real llama-server, and the requests and checks of the end-to-end tests.
//! - [`request`]: fluent request bodies carrying the fake's knobs (`fake_tag`, `fake_delay_ms`, ...).
//! - [`otlp`]: an OTLP/HTTP trace receiver that decodes what slotgate exports, for the trace tests.
//! - [`metrics`]: a small Prometheus text parser for asserting counters, gauges and histograms.
//! - [`errors`]: the OpenAI error shape every slotgate-made response must have.
//! - [`agents`]: Claude Code, the Codex CLI and opencode run headless against slotgate or llama-server.
//! - [`litellm`]: LiteLLM's proxy from the example config, in front of two slotgates.
//! - [`budget`]: waiting out the token-budget policy's refusals until a refund has landed.
//! - [`redis`]: a real redis-server per test, on a Unix socket, for the fleet state.
//! - [`soak`]: long mixed traffic against a real llama-server, with RSS, fds and invariants.
//! - [`systemd`]: a notify socket, sockets handed over as systemd does, the example units verified.
//! - [`package`]: the Debian package built from the test run's binary, a throwaway root dpkg installs
//!   it into.
//! - [`podman`]: podman with the flags this machine needs, on a storage of its own.
//! - [`tmux`]: a terminal of a given size for `slotgate top`: keys in, the screen out as text.
//! - [`flood`]: a slow-loris flood on its own thread and runtime, and a kubelet-like probe.
//! - [`wait`]: polling with deadlines instead of sleeps, and unique temp paths.

pub mod agents;
pub mod budget;
pub mod client;
pub mod errors;
pub mod fake_upstream;
pub mod flood;
pub mod gate;
pub mod kube;
pub mod litellm;
pub mod llama;
pub mod logged;
pub mod metrics;
pub mod otlp;
pub mod package;
pub mod pair;
pub mod podman;
pub mod python;
pub mod redis;
pub mod request;
pub mod smg;
pub mod soak;
pub mod systemd;
pub mod tmux;
pub mod wait;
pub mod wat;

pub use client::{queue_wait_ms, Client, Conn, Response, SseRead, Streaming, Target};
pub use errors::{
    assert_context_refusal, assert_error, assert_error_says, parse_error, retry_after,
};
pub use fake_upstream::{FakeUpstream, RunningUpstream, SeenRequest};
pub use gate::{Exited, Gate, RunningGate};
pub use metrics::Metrics;
pub use request::{join_all, spawn_post, Req, CHAT};
pub use wait::{current_uid, eventually, unique_dir};

/// Runs a benchmark's `main` future on two async workers, as slotgate itself runs on this machine.
pub fn bench_main<F: std::future::Future>(run: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run)
}

/// The workspace root (the folder above `tests/`), for the examples, scripts and sources tests read.
pub fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else the workspace's `target/`.
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace().join("target"), std::path::PathBuf::from)
}

/// Runs `scripts/<script>`, a setup script that installs or finds a tool (cached after the first run)
/// and prints `KEY=value` lines, and returns what it printed; a failure is the script's exit status
/// and the end of its stderr. A test that needs the tool fails with that: it never skips.
pub fn setup_script(script: &str) -> Result<String, String> {
    let path = workspace().join("scripts").join(script);
    let out = std::process::Command::new("bash")
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        return Err(format!(
            "{} failed ({}); its stderr (last 60 lines):\n{}",
            path.display(),
            out.status,
            lines[lines.len().saturating_sub(60)..].join("\n")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of `key` in a setup script's `KEY=value` lines (see [`setup_script`]), or why not.
pub fn setup_value(script: &str, stdout: &str, key: &str) -> Result<std::path::PathBuf, String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(std::path::PathBuf::from)
        .ok_or_else(|| format!("scripts/{script} printed no {key}= line; stdout:\n{stdout}"))
}

/// Milliseconds, for terse timings in tests.
pub fn ms(n: u64) -> std::time::Duration {
    std::time::Duration::from_millis(n)
}
