//! `slotgate wrap -- llama-server ...` with the real llama-server: one command starts both; slots
//! follow `-np`; the child's output comes through prefixed; a child that is killed is restarted
//! while a request waits for it; SIGTERM drains, then stops the child, and nothing is left behind.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use slotgate_tests::llama::{chat, chat_usage, library_path, server_argv, PROMPT};
use slotgate_tests::*;

/// The children of `pid` (from every thread's `/proc/<pid>/task/<tid>/children`).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
    {
        let path = task.expect("task entry").path().join("children");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        out.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        // A zombie (state Z) is dead already, only not reaped.
        .is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
}

/// The one child of the gate, once there is one.
async fn child_of(gate: &RunningGate) -> u32 {
    eventually(
        Duration::from_secs(10),
        "the wrapped llama-server",
        || async {
            match children(gate.pid()).as_slice() {
                [one] => Some(*one),
                _ => None,
            }
        },
    )
    .await
}

async fn ask(client: &Client, tag: &str) -> Response {
    let body = chat(&format!("{PROMPT} ({tag})"), 8, false);
    tokio::time::timeout(Duration::from_secs(60), client.post_json(CHAT, &body))
        .await
        .unwrap_or_else(|_| panic!("{tag}: no answer within 60 s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_command_serves_restarts_a_killed_child_and_drains_before_stopping_it() {
    let _serial = slotgate_tests::llama::serial().await;
    let mut gate = Gate::new()
        .wrapping(server_argv(2))
        .env("LD_LIBRARY_PATH", library_path().to_str().unwrap())
        .queue_depth(8)
        .start()
        .await;

    // Slots follow the child's -np; the upstream is a socket in a private directory.
    let st = gate
        .wait_status(Duration::from_secs(10), "slots.total == 2", |s| {
            s["slots"]["total"] == 2
        })
        .await;
    assert_eq!(st["slots"]["configured"], "auto", "{st}");
    let target = st["upstream"]["target"].as_str().unwrap().to_owned();
    let socket = PathBuf::from(target.strip_prefix("unix:").expect("a Unix socket"));
    let private = socket.parent().unwrap().to_path_buf();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&private).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", private.display());
    }

    let client = gate.client();
    let resp = ask(&client, "first").await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    chat_usage(&resp, 8);
    let log = gate.stderr_text();
    assert!(
        log.lines().any(|l| l.starts_with("llama-server| ")),
        "the child's output, prefixed:\n{log}"
    );

    // SIGKILL the child: a request sent at once waits for the restart and is answered.
    let first = child_of(&gate).await;
    let status = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let sent = Instant::now();
    let resp = ask(&client, "during-restart").await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(
        sent.elapsed() >= Duration::from_millis(500),
        "answered in {:?}: it cannot have waited for a restart",
        sent.elapsed()
    );
    let second = child_of(&gate).await;
    assert_ne!(first, second, "a new process");
    assert!(!alive(first));
    assert_eq!(
        gate.metric("slotgate_child_restarts_total", &[]).await,
        Some(1.0)
    );
    gate.assert_idle().await;

    // SIGTERM during a stream: the stream finishes, then the child is stopped.
    let max_tokens = 64;
    let stream = client.stream(CHAT, &chat(PROMPT, max_tokens, true)).await;
    assert_eq!(stream.status, 200);
    gate.sigterm();
    let sse = stream.read_sse(Duration::from_secs(60)).await;
    assert!(sse.done, "the stream ran to [DONE] through the drain");
    llama::stream_usage(&sse, max_tokens);
    let exit = gate.wait_exit(Duration::from_secs(30)).await;
    assert!(exit.success(), "{exit}; stderr:\n{}", gate.stderr_text());
    assert!(!alive(second), "the child outlived slotgate");
    assert!(!private.exists(), "{} left behind", private.display());
    let log = gate.stderr_text();
    let drained = log.find("drained; exiting").expect("drained");
    let stopping = log
        .find("stopping the wrapped llama-server")
        .expect("child stopped");
    assert!(
        drained < stopping,
        "the child was stopped before the drain:\n{log}"
    );
}

/// A command that names its own address (`--host`/`--port`, as llama.cpp's own test suite starts
/// it) is served there by slotgate, llama-server behind it on its private socket; a program that
/// cannot start is an error that names it.
#[tokio::test]
async fn a_command_that_names_its_own_address_is_served_there_by_slotgate() {
    let _serial = slotgate_tests::llama::serial().await;
    let port = slotgate_tests::gate::free_port();
    let admin = slotgate_tests::gate::free_port();
    let mut argv = server_argv(1);
    argv.extend(["--host", "127.0.0.1", "--port", &port.to_string()].map(String::from));
    let mut wrap = gate::command()
        .args(["wrap", "--state-dir", "off", "--admin-listen"])
        .arg(format!("127.0.0.1:{admin}"))
        .arg("--")
        .args(&argv)
        .env("LD_LIBRARY_PATH", library_path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run slotgate wrap");
    let client = Client::tcp(([127, 0, 0, 1], port).into());
    let started = Instant::now();
    let body = chat(&format!("{PROMPT} (port)"), 8, false);
    let resp = loop {
        let sent = client.try_send(slotgate_tests::client::post(CHAT, &body));
        match tokio::time::timeout(Duration::from_secs(30), sent).await {
            Ok(Ok(r)) if r.status == 200 => break r,
            _ if started.elapsed() > Duration::from_secs(60) => {
                let _ = wrap.kill();
                panic!("nothing served on the wrapped command's --port {port} within 60 s");
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    chat_usage(&resp, 8);
    // slotgate answered it: its own header is on the answer.
    assert!(
        resp.header("x-slotgate-queue-wait-ms").is_some(),
        "{:?}",
        resp.headers
    );
    unsafe_sigterm(wrap.id());
    let status = tokio::task::spawn_blocking(move || wrap.wait())
        .await
        .unwrap()
        .expect("wait for slotgate wrap");
    assert!(status.success(), "{status}");

    let out = gate::command()
        .args([
            "wrap",
            "--state-dir",
            "off",
            "--",
            "/nonexistent/llama-server",
        ])
        .output()
        .expect("run slotgate wrap");
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot start `/nonexistent/llama-server`"),
        "{err}"
    );
}

/// SIGTERM to `pid`, as an operator's `kill`.
fn unsafe_sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}
