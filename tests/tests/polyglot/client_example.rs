//! `examples/clients/retry_client.py` against a real slotgate (fake upstream): turned away by a full
//! queue, it waits what `retry-after-ms` said plus at most 10 % jitter, never less, and gets its
//! answer; with a deadline shorter than the wait it is told, it gives up at once with a message and
//! exit status 1. Its unit tests (`test_retry_client.py`, the wait and jitter arithmetic) run here too.
//!
//! The client promises the standard library only, so it runs under `python3 -S` (no site-packages).

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::gate::free_port;
use slotgate_tests::*;

/// How much sooner than told a retry may be sent: the rounding of the client's log (0.1 ms).
const CLOCK_SLACK_S: f64 = 0.002;
/// A loose bound over the 10 % jitter: a sleeping thread wakes late on a busy machine.
const OVERSLEEP_S: f64 = 0.3;
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

fn examples_dir() -> PathBuf {
    slotgate_tests::workspace().join("examples/clients")
}

/// Runs `python3 -S` with `args` in `examples/clients`.
async fn python3(args: &[String]) -> Output {
    let run = tokio::process::Command::new("python3")
        .arg("-S")
        .args(args)
        .current_dir(examples_dir())
        // No __pycache__ left in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(RUN_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("python3 {args:?} did not finish within {RUN_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("cannot run python3 (the examples need Python 3): {e}"))
}

/// Starts the interpreter and its imports, says `ready`, and on a line from stdin runs the example
/// unchanged as `__main__`: the client's first request then comes as soon as the test says go, not
/// after however long Python takes to start on a busy machine.
const ON_CUE: &str = "\
import sys, runpy, argparse, email.utils, http.client, json, random, socket, time, urllib.parse
print('ready', flush=True)
sys.stdin.readline()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
";

/// What one run of the example client did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    /// Its JSON log lines, in order.
    events: Vec<Value>,
}

/// Runs the example client with `args` once `scene` (which sets up the gate's load) has run,
/// returning what the client did and what `scene` returned.
async fn retry_client<T>(args: &[String], scene: impl std::future::Future<Output = T>) -> (Run, T) {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.args(["-S", "-c", ON_CUE, "retry_client.py"])
        .args(args)
        .current_dir(examples_dir())
        // No __pycache__ left in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let what = format!("python3 retry_client.py {args:?} (the examples need Python 3)");
    let (out, scene) = slotgate_tests::python::run_on_cue(cmd, &what, RUN_TIMEOUT, scene).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let events = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line ({e}): {l}")))
        .collect();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        events,
    };
    (run, scene)
}

fn f64_at(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is missing or not a number in {v}"))
}

/// `retry-after-ms` of a logged attempt, in seconds.
fn told_s(attempt: &Value) -> f64 {
    let ms: f64 = attempt["retry_after_ms"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a 429 without retry-after-ms: {attempt}"));
    ms / 1000.0
}

fn attempts(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["event"] == "attempt").collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_tests_of_the_wait_and_jitter_pass() {
    let out = python3(&[
        "-m".into(),
        "unittest".into(),
        "discover".into(),
        "-s".into(),
        ".".into(),
        "-p".into(),
        "test_*.py".into(),
        "-v".into(),
    ])
    .await;
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "unit tests failed:\n{report}");
    let ran: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `Ran N tests` line:\n{report}"));
    assert!(ran >= 10, "only {ran} unit tests ran:\n{report}");
    assert!(report.trim_end().ends_with("OK"), "{report}");
}

/// One slot busy, one waiter: the client finds the queue full, sleeps as told (plus jitter), and
/// gets in; every refusal it saw was one slotgate counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_waits_as_told_and_gets_its_answer_over_a_unix_socket() {
    let service = Duration::from_millis(300);
    let (up, gate) = Gate::one_slot(1)
        .start_with(FakeUpstream::sse(["hello", " from", " the fake"], ms(1)).delay(service))
        .await;
    // Answers that report usage first, so slotgate's estimate is learnt and has milliseconds.
    gate.learn_service_time(service).await;
    let socket = gate.socket_path().display().to_string();
    let args = [
        "--unix-socket".into(),
        socket,
        "--deadline".into(),
        "30".into(),
        "--max-tokens".into(),
        "8".into(),
    ];
    // One answer under way and one waiting when the client asks.
    let (run, (held, queued)) = retry_client(&args, async {
        let held = gate.hold_slot(&Req::chat("held").delay(service * 2)).await;
        let queued = gate.enqueue(&Req::chat("queued").delay(service)).await;
        (held, queued)
    })
    .await;
    let Run {
        code,
        stdout,
        stderr,
        events,
    } = run;
    assert_eq!(code, 0, "stderr:\n{stderr}");
    assert_eq!(stdout.trim(), "hello from the fake");

    let tries = attempts(&events);
    let last = tries.last().expect("at least one attempt");
    assert_eq!(last["status"], 200, "{stderr}");
    let refusals = &tries[..tries.len() - 1];
    assert!(!refusals.is_empty(), "never turned away:\n{stderr}");
    for (refused, retry) in refusals.iter().zip(&tries[1..]) {
        assert_eq!(refused["status"], 429, "{stderr}");
        assert_eq!(refused["code"], "queue_full", "{stderr}");
        let told = told_s(refused);
        assert_eq!(f64_at(refused, "told_s"), told, "it read retry-after-ms");
        let secs: f64 = refused["retry_after"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("Retry-After beside it");
        assert!(told <= secs && told > secs - 1.0, "{refused}");
        let wait = f64_at(refused, "wait_s");
        assert!(
            wait >= told && wait <= told * 1.1 + 1e-9,
            "wait {wait} for told {told}"
        );
        let waited = f64_at(retry, "sent_s") - f64_at(refused, "received_s");
        assert!(
            waited >= told - CLOCK_SLACK_S,
            "retried {waited:.4} s after being told {told} s:\n{stderr}"
        );
        assert!(
            waited <= told * 1.1 + OVERSLEEP_S,
            "retried {waited:.4} s after being told {told} s:\n{stderr}"
        );
    }
    assert_eq!(events.last().expect("events")["event"], "answer");
    eprintln!(
        "{} refusals, then an answer: {}",
        refusals.len(),
        refusals
            .iter()
            .map(|r| format!(
                "told {:.3} s, waited {:.3} s",
                told_s(r),
                f64_at(r, "wait_s")
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );

    for task in [held, queued] {
        let (resp, _) = task.await.expect("request task");
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.wait_outcome("queue_full", refusals.len() as u64).await;
    gate.wait_outcome("ok", 6).await;
    gate.assert_settled(&up, 1).await;
}

/// The only slot busy for seconds, no queue place, a deadline well under the wait slotgate names:
/// one attempt, no sleep, exit status 1 and a message saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_too_short_a_deadline_it_gives_up_at_once_over_tcp() {
    let port = free_port();
    let (up, gate) = Gate::one_slot(0)
        .listen(format!("tcp:127.0.0.1:{port}"))
        .start_instant()
        .await;
    let args = [
        "--url".into(),
        format!("http://127.0.0.1:{port}/v1/chat/completions"),
        "--deadline".into(),
        "0.3".into(),
    ];
    // A one-element tuple: the scene hands back a task handle, not something to await in it.
    let (run, (held,)) = retry_client(&args, async {
        let held = gate
            .hold_slot(&Req::chat("held").delay(Duration::from_secs(2)))
            .await;
        (held,)
    })
    .await;
    let Run {
        code,
        stdout,
        stderr,
        events,
    } = run;
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout, "");
    let tries = attempts(&events);
    assert_eq!(tries.len(), 1, "{stderr}");
    assert_eq!(tries[0]["status"], 429);
    let told = told_s(tries[0]);
    assert!(told > 0.3, "slotgate said {told} s, not past the deadline");
    let give_up = events.last().expect("events");
    assert_eq!(give_up["event"], "give_up", "{stderr}");
    let reason = give_up["reason"].as_str().expect("a reason");
    assert!(
        reason.contains(&format!("come back in {told:.3} s")) && reason.contains("0.3 s deadline"),
        "{reason}"
    );
    assert!(
        stderr.contains("retry_client: gave up after 1 attempts"),
        "no plain message:\n{stderr}"
    );
    // Given up at once, not after sleeping.
    let gave_up_after = f64_at(give_up, "at_s") - f64_at(tries[0], "received_s");
    assert!(
        gave_up_after < 0.1,
        "gave up {gave_up_after} s after the 429"
    );

    let (resp, _) = held.await.expect("held request");
    assert_eq!(resp.status, 200, "{}", resp.body);
    gate.wait_outcome("queue_full", 1).await;
    gate.assert_settled(&up, 1).await;
}
