//! A program the tests run in the background with its output in a file (LiteLLM's proxy, SMG): its
//! environment kept to what it needs, and the tail of its log in a failure's message.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tokio::process::Command;

use crate::client::{Client, Response};

/// `program`, run in `dir`, seeing nothing of this environment but `PATH`, `HOME` and `TMPDIR` (no
/// proxy, provider key or telemetry endpoint of the machine may configure it), with stdin closed,
/// stdout and stderr to `log`, and killed on drop. The caller adds its arguments and variables.
pub fn command(program: &Path, dir: &Path, log: &Path) -> Command {
    let out =
        std::fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    let mut cmd = Command::new(program);
    cmd.current_dir(dir).env_clear();
    for keep in ["PATH", "HOME", "TMPDIR"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone log fd"))
        .stderr(out)
        .kill_on_drop(true);
    cmd
}

/// The last `lines` lines of the file at `log` (empty while there is none).
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `req` sent to `who` over `client`, answered within `within`; a transport error or no answer fails
/// the test with the tail of `who`'s `log`.
pub async fn send(
    client: &Client,
    req: http::Request<Full<Bytes>>,
    within: Duration,
    who: &str,
    log: &Path,
) -> Response {
    let what = format!("{} {}", req.method(), req.uri());
    match tokio::time::timeout(within, client.try_send(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => panic!("{what} to {who}: {e:#}\n{}", tail(log, 40)),
        Err(_) => panic!(
            "{what} to {who}: no answer in {within:?}\n{}",
            tail(log, 40)
        ),
    }
}
