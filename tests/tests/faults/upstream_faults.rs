//! Upstream faults: an upstream never reached gets a fast 503; a loading one, or one that answered
//! before, is waited for within the queue deadline; a crash mid-stream
//! never looks like a complete answer, and an upstream that never comes back ends in 503/504.

use std::path::Path;
use std::time::{Duration, Instant};

use slotgate_tests::*;

/// A one-slot gate pointed at an upstream socket that does not exist (yet).
async fn gate_before_upstream(path: &Path, queue_timeout: &str) -> RunningGate {
    Gate::new()
        .upstream_path(path)
        .slots(1)
        .queue_timeout(queue_timeout)
        .no_wait_ready()
        .start()
        .await
}

/// An upstream slotgate has never reached (a wrong `--upstream`, a server not started yet) is not
/// waited for: requests get a fast 503 that names the address and what failed, the log and `/status`
/// say it; once it answers, requests are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_never_reached_gets_a_fast_503_naming_it_until_it_answers() {
    let dir = unique_dir("late");
    let path = dir.join("llama.sock");
    let gate = gate_before_upstream(&path, "30s").await;
    let client = gate.client();

    let t0 = Instant::now();
    let resp = client.post_chat(&Req::chat("early")).await;
    let took = t0.elapsed();
    assert_error(&resp, 503, "upstream_unavailable");
    retry_after(&resp);
    assert!(
        took < Duration::from_secs(3),
        "a 30 s deadline waited {took:?}"
    );
    let shown = path.display().to_string();
    assert!(
        resp.body.contains(&shown),
        "the 503 names the address: {}",
        resp.body
    );
    assert!(
        resp.body.contains("No such file"),
        "and what failed: {}",
        resp.body
    );
    let status = gate.status().await;
    assert_eq!(status["upstream"]["reached"], false, "{status}");
    let last = status["upstream"]["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(last.contains("No such file"), "{status}");
    let log = gate.stderr_text();
    assert!(
        log.lines()
            .any(|l| l.contains("upstream not reachable") && l.contains(&shown)),
        "the log names the address:\n{log}"
    );

    let up = FakeUpstream::instant().at(&path).start().await;
    let resp = eventually(Duration::from_secs(5), "served once it answers", || async {
        let r = client.post_chat(&Req::chat("late")).await;
        (r.status == 200).then_some(r)
    })
    .await;
    assert_eq!(resp.tag().as_deref(), Some("late"));
    assert_eq!(gate.status().await["upstream"]["reached"], true);
    // The next probe finds it ready, and the error is gone.
    gate.wait_status(Duration::from_secs(5), "no upstream error", |s| {
        s["upstream"]["last_error"].is_null()
    })
    .await;
    gate.assert_settled(&up, 1).await;
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The most attempts that can start within `window` of the first one if every pause is the shortest the
/// contract allows: the lower end of the upper-half jitter of `min(50ms·2ⁿ, 2s)`.
fn most_attempts_within(window: Duration) -> usize {
    let mut attempts = 0u32;
    let mut next_start = Duration::ZERO;
    while next_start < window {
        let ceiling = (ms(50) * 2u32.pow(attempts.min(16))).min(Duration::from_secs(2));
        next_start += ceiling / 2;
        attempts += 1;
    }
    attempts as usize
}

#[test]
fn backoff_bound_follows_the_contract() {
    // Shortest pauses 25, 50, 100, 200, 400 ms: attempts may start at 0, 25, 75, 175, 375 and 775 ms.
    assert_eq!(most_attempts_within(Duration::from_secs(1)), 6);
    assert_eq!(most_attempts_within(ms(1)), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loading_upstream_is_waited_for() {
    const LOADING: Duration = Duration::from_secs(1);
    let dir = unique_dir("loading");
    let path = dir.join("llama.sock");
    let gate = gate_before_upstream(&path, "5s").await;
    // The load starts right before the request, so however slowly the gate started, the request meets
    // (almost) the whole second of "Loading model".
    let up = FakeUpstream::loading_then_ready(LOADING)
        .at(&path)
        .start()
        .await;

    let resp = gate.client().post_chat(&Req::chat("early")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.tag().as_deref(), Some("early"));
    let seen = up.requests_seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].arrived >= up.ready_at(),
        "served before the upstream was ready"
    );

    // The request kept its slot and was tried again with backoff while llama-server was loading.
    let rejected = up.rejection_times();
    let offsets_ms: Vec<u128> = rejected
        .iter()
        .map(|t| t.duration_since(rejected[0]).as_millis())
        .collect();
    eprintln!("attempts turned away while loading, ms after the first: {offsets_ms:?}");
    assert!(
        !rejected.is_empty(),
        "the request arrived during the load but was never tried before the upstream was ready"
    );
    assert!(
        rejected.iter().all(|t| *t < up.ready_at()),
        "an attempt was turned away after the load ended: {offsets_ms:?} ms"
    );
    // Attempts start no earlier than the fake's start and the rejected ones before it is ready, so a
    // retry that honours the backoff cannot fit more than this into the load.
    let most = most_attempts_within(LOADING);
    assert!(
        rejected.len() <= most,
        "{} attempts turned away during a {LOADING:?} load (at {offsets_ms:?} ms); backoff \
         min(50ms·2ⁿ, 2s) with upper-half jitter allows at most {most}",
        rejected.len()
    );
    let retries = gate
        .metric("slotgate_upstream_retries_total", &[])
        .await
        .unwrap_or(0.0);
    assert!(
        retries >= rejected.len() as f64,
        "slotgate_upstream_retries_total is {retries} after {} attempts answered \"Loading model\"",
        rejected.len()
    );
    gate.assert_settled(&up, 1).await;
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_mid_stream_is_never_a_clean_response() {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::crash_mid_stream(2))
        .await;

    let stream = gate
        .client()
        .stream_chat(&Req::chat("crash").stream())
        .await;
    assert_eq!(
        stream.status, 200,
        "the crash happens after the head was sent"
    );
    let sse = stream.read_sse(Duration::from_secs(5)).await;
    assert!(
        !sse.done,
        "a stream whose upstream crashed must not end with [DONE]: {sse:?}"
    );
    assert!(
        sse.data.len() <= 2,
        "more chunks than the fake sent: {:?}",
        sse.data
    );
    eprintln!(
        "client saw: error={:?}, {} chunks",
        sse.error,
        sse.data.len()
    );

    gate.assert_settled(&up, 1).await;
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero("slotgate_requests_total", &[("outcome", "ok")]),
        0.0,
        "a truncated stream counted as ok; /metrics:\n{}",
        m.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_absent_for_the_whole_deadline_gets_503_or_504() {
    let dir = unique_dir("absent");
    let gate = gate_before_upstream(&dir.join("never.sock"), "1s").await;

    let t0 = Instant::now();
    let resp = gate.client().post_chat(&Req::chat("nobody")).await;
    let took = t0.elapsed();
    match resp.status.as_u16() {
        503 => {
            assert_error(&resp, 503, "upstream_unavailable");
            retry_after(&resp);
        }
        504 => {
            assert_error(&resp, 504, "queue_timeout");
        }
        other => panic!(
            "expected 503 upstream_unavailable or 504, got {other}: {}",
            resp.body
        ),
    }
    assert!(
        took < Duration::from_secs(4),
        "answered after {took:?} with a 1 s queue timeout"
    );
    gate.assert_idle().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_lost_after_sending_is_502_and_not_retried() {
    let (up, gate) = Gate::new()
        .slots(1)
        .queue_timeout("5s")
        .start_with(FakeUpstream::reset_on_request())
        .await;

    let t0 = Instant::now();
    let resp = gate.client().post_chat(&Req::chat("once")).await;
    assert_error(&resp, 502, "upstream_error");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "502 after {:?}",
        t0.elapsed()
    );
    // The upstream may have started the work: resending it could run a generation twice.
    tokio::time::sleep(ms(200)).await;
    assert_eq!(
        up.tags(),
        ["once"],
        "a request that reached the upstream must not be retried"
    );
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("upstream_error", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_leaving_during_upstream_retries_frees_the_slot() {
    let dir = unique_dir("gone");
    let path = dir.join("llama.sock");
    let gate = gate_before_upstream(&path, "10s").await;
    let client = gate.client();
    // An upstream that answered once and then went away is retried (one never reached is not).
    let up = FakeUpstream::instant().at(&path).start().await;
    gate.wait_status(Duration::from_secs(5), "the upstream reached", |s| {
        s["upstream"]["reached"] == true
    })
    .await;
    up.stop();
    let _ = std::fs::remove_file(&path);

    let waiting = spawn_post(&client, CHAT, &Req::chat("patient"));
    gate.wait_busy(1).await;
    tokio::time::sleep(ms(300)).await;
    waiting.abort();
    let t0 = Instant::now();
    gate.assert_idle().await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "slot held {:?} after the client left during upstream retries",
        t0.elapsed()
    );
    gate.wait_outcome("client_gone", 1).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An upstream that closes every connection after its response without saying so (no `Connection:
/// close`), as llama-server does after a stream: queued requests forwarded at the instant of each close
/// all get through. With reuse off every request gets a connection of its own (what such an upstream
/// needs); with reuse on, streams still do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_closing_each_connection_after_its_response_is_harmless() {
    closing_upstream_serves_every_handover("false", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_closing_each_connection_after_a_stream_is_harmless_with_reuse_on() {
    closing_upstream_serves_every_handover("true", true).await;
}

async fn closing_upstream_serves_every_handover(reuse: &str, stream: bool) {
    let (up, gate) = Gate::one_slot(32)
        .opt("--upstream-reuse-connections", reuse)
        .start_with(FakeUpstream::instant().one_request_per_connection())
        .await;
    // Each hand-over is one chance for the race; two dozen make it show up reliably.
    const QUEUED: u64 = 24;
    let req = |tag: &str| match stream {
        true => Req::chat(tag).chunks(2, ms(5)),
        false => Req::chat(tag).delay(ms(10)),
    };

    // Queued requests are forwarded the instant the previous response ends: exactly when the
    // upstream's close of the previous connection is in flight.
    // The first holds the slot long enough for all of them to queue, even on a loaded machine.
    let mut handles = vec![gate.hold_slot(&Req::chat("r0").delay(ms(2500))).await];
    for i in 1..=QUEUED {
        handles.push(gate.enqueue(&req(&format!("r{i}"))).await);
    }
    let results = join_all(handles).await;
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(_, (r, _))| r.status != 200)
        .map(|(i, (r, _))| {
            let tag = format!("r{i}");
            let seen = if up.saw_tag(&tag) {
                "reached"
            } else {
                "never reached"
            };
            format!("{tag}: {} ({seen} the upstream) {}", r.status, r.body)
        })
        .collect();
    assert!(
        failed.is_empty(),
        "requests failed although the upstream only closed idle connections:\n  {}\nslotgate stderr:\n{}",
        failed.join("\n  "),
        gate.stderr_text()
    );
    let want: Vec<String> = (0..=QUEUED).map(|i| format!("r{i}")).collect();
    assert_eq!(up.tags(), want);
    gate.assert_settled(&up, 1).await;
}
