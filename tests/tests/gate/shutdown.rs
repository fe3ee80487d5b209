//! Graceful shutdown: SIGTERM stops accepting, unlinks the socket, answers the queue 503 `shutting_down`,
//! lets in-flight streams finish within `--drain-timeout`, and exits 0.

use std::time::{Duration, Instant};

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_inflight_and_rejects_the_queue() {
    let (up, mut gate) = Gate::one_slot(4).drain_timeout("5s").start_instant().await;
    let client = gate.client();
    let socket = gate.socket_path();

    // 10 chunks 100 ms apart: about 1 s of streaming.
    let mut stream = client
        .stream_chat(&Req::chat("inflight").chunks(10, ms(100)))
        .await;
    assert_eq!(stream.status, 200);
    stream.first_event(Duration::from_secs(2)).await;
    let q1 = spawn_post(&client, CHAT, &Req::chat("q1"));
    let q2 = spawn_post(&client, CHAT, &Req::chat("q2"));
    gate.wait_queue_depth(2).await;

    gate.sigterm();
    let t0 = Instant::now();
    for (resp, _) in join_all(vec![q1, q2]).await {
        assert_error(&resp, 503, "shutting_down");
        retry_after(&resp);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "queued requests answered after {:?}",
        t0.elapsed()
    );
    eventually(
        Duration::from_secs(1),
        "the listen socket is unlinked",
        || async { (!socket.exists()).then_some(()) },
    )
    .await;

    let sse = stream.read_sse(Duration::from_secs(5)).await;
    assert!(
        sse.complete(),
        "the in-flight stream must finish intact: {sse:?}"
    );
    assert_eq!(sse.data.len(), 11, "10 chunks + usage: {:?}", sse.data);

    let status = gate.wait_exit(Duration::from_secs(5)).await;
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        gate.stderr_text()
    );
    assert_eq!(
        up.tags(),
        ["inflight"],
        "queued requests must not be forwarded during shutdown"
    );
    assert!(up.max_concurrency() <= 1);
}

/// One slot, `drain` as the drain timeout, and one request that llama-server never answers, in
/// flight; its client's task.
async fn one_request_in_flight(
    drain: &str,
) -> (
    RunningUpstream,
    RunningGate,
    tokio::task::JoinHandle<anyhow::Result<slotgate_tests::client::Response>>,
) {
    let (up, gate) = Gate::new()
        .slots(1)
        .drain_timeout(drain)
        .start_with(FakeUpstream::hang())
        .await;
    let client = gate.client();
    let stuck =
        tokio::spawn(async move { client.try_post_json(CHAT, &Req::chat("stuck").json()).await });
    gate.wait_status(Duration::from_secs(3), "one request in flight", |s| {
        s["inflight"] == 1
    })
    .await;
    (up, gate, stuck)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_timeout_bounds_a_hanging_upstream() {
    let (up, mut gate, stuck) = one_request_in_flight("500ms").await;
    gate.sigterm();
    let t0 = Instant::now();
    let status = gate.wait_exit(Duration::from_secs(4)).await;
    let took = t0.elapsed();
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        gate.stderr_text()
    );
    assert!(
        took >= ms(400) && took < Duration::from_secs(2),
        "exited {took:?} after SIGTERM with --drain-timeout 500ms"
    );
    // The client gets an answer or a closed connection, not a hang.
    let outcome = tokio::time::timeout(Duration::from_secs(2), stuck)
        .await
        .expect("the stuck client must be released when slotgate exits")
        .unwrap();
    eprintln!("stuck client after drain: {:?}", outcome.map(|r| r.status));
    // Its line blames the drain, not a client that never left.
    let log = gate.stderr_text();
    let line = log
        .lines()
        .find(|l| l.contains("slotgate::access") && l.contains(CHAT))
        .unwrap_or_else(|| panic!("no access line for the stuck request:\n{log}"));
    assert!(line.contains("outcome=drain_timeout"), "{line}");
    assert!(up.max_concurrency() <= 1);
}

/// A stream still running when the drain timeout runs out is cut, and its line says so: the client
/// never left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_cut_by_the_drain_timeout_is_logged_as_such() {
    let (up, mut gate) = Gate::new()
        .slots(1)
        .drain_timeout("500ms")
        .start_instant()
        .await;
    let mut stream = gate
        .client()
        .stream_chat(&Req::chat("long").chunks(100, ms(100)))
        .await;
    let first = stream.first_event(Duration::from_secs(3)).await;
    assert!(!first.is_empty());
    gate.sigterm();
    let status = gate.wait_exit(Duration::from_secs(4)).await;
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        gate.stderr_text()
    );
    drop(stream);
    let log = gate.stderr_text();
    let line = log
        .lines()
        .find(|l| l.contains("slotgate::access") && l.contains(CHAT))
        .unwrap_or_else(|| panic!("no access line for the stream:\n{log}"));
    assert!(line.contains("outcome=drain_timeout"), "{line}");
    assert!(!line.contains("client_gone"), "{line}");
    assert!(up.max_concurrency() <= 1);
}

/// A second signal during the drain stops at once, however long the drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_signal_during_the_drain_stops_at_once() {
    let (up, mut gate, stuck) = one_request_in_flight("30s").await;
    gate.sigterm();
    // Draining: the hanging request holds it open for the whole 30 s.
    tokio::time::sleep(ms(300)).await;
    assert!(
        gate.try_exited().is_none(),
        "exited on the first signal with a request in flight"
    );
    gate.signal("INT");
    let t0 = Instant::now();
    let status = gate.wait_exit(Duration::from_secs(3)).await;
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        gate.stderr_text()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        gate.stderr_text()
            .contains("second signal: stopping at once"),
        "{}",
        gate.stderr_text()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), stuck)
        .await
        .expect("the stuck client is released when slotgate exits");
    assert!(
        gate.stderr_text().contains("outcome=drain_timeout"),
        "{}",
        gate.stderr_text()
    );
    assert!(up.max_concurrency() <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_when_idle_exits_promptly_and_unlinks() {
    idle_shutdown("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigint_when_idle_exits_promptly_and_unlinks() {
    idle_shutdown("INT").await;
}

async fn idle_shutdown(signal: &str) {
    let (up, mut gate) = Gate::new().start_instant().await;
    let socket = gate.socket_path();
    assert_eq!(gate.client().post_chat(&Req::chat("one")).await.status, 200);
    gate.assert_settled(&up, 1).await;

    gate.signal(signal);
    let status = gate.wait_exit(Duration::from_secs(2)).await;
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        gate.stderr_text()
    );
    assert!(!socket.exists(), "socket file left behind after shutdown");
}
