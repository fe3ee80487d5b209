//! Keep-alive: several requests on one client connection each take and release the slot; towards the
//! upstream, streamed generation requests each get a connection of their own, and whole answers and
//! everything else reuse the pool (unless `--upstream-reuse-connections false`).

use std::time::Duration;

use http::Method;
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_connection_carries_many_requests() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let client = gate.client();
    let mut conn = client.connect().await.unwrap();

    for i in 0..3 {
        let resp = conn
            .post_json(CHAT, &Req::chat(&format!("k{i}")).json())
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert_eq!(resp.tag(), Some(format!("k{i}")));
    }
    let models = conn.get("/v1/models").await.unwrap();
    assert_eq!(models.status, 200);
    // An error answer must leave the connection usable too.
    let bad = conn
        .send(client::json_request(
            Method::POST,
            CHAT,
            bytes::Bytes::from_static(b"{bad"),
        ))
        .await
        .unwrap();
    assert_error(&bad, 400, "invalid_json");
    let last = conn.post_json(CHAT, &Req::chat("k3").json()).await;
    match last {
        Ok(resp) => assert_eq!(resp.status, 200, "{}", resp.body),
        // Closing after an error is allowed; the next connection must work.
        Err(_) => {
            let resp = client.post_chat(&Req::chat("k3")).await;
            assert_eq!(resp.status, 200, "{}", resp.body);
        }
    }

    // A stream on a kept-alive connection, then another request on a second one.
    let stream = client.stream_chat(&Req::chat("s").chunks(3, ms(10))).await;
    assert!(stream.read_sse(Duration::from_secs(3)).await.complete());
    assert_eq!(up.tags(), ["k0", "k1", "k2", "k3", "s"]);
    drop(conn);
    gate.assert_settled(&up, 1).await;
}

/// Connections the fake accepted for forwarded requests: slotgate's own calls (reading /props,
/// counting a prompt) use and close one each and are left out. With an hourly health probe, only the
/// first one runs.
fn forwarding(up: &RunningUpstream) -> usize {
    up.connections() - up.internal_seen().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_get_their_own_upstream_connection_and_whole_answers_reuse_the_pool() {
    let (up, gate) = Gate::new()
        .slots(1)
        .health_interval("1h")
        .start_instant()
        .await;
    let client = gate.client();
    let opened = || async {
        gate.metrics()
            .await
            .value_or_zero("slotgate_upstream_connections_total", &[])
    };

    // Every streamed request opens a connection of its own and closes it after (`Connection:
    // close`): llama-server closes it after a stream anyway, while announcing keep-alive.
    up.wait_readiness_calls().await;
    let start = forwarding(&up);
    let metric_start = opened().await;
    for i in 0..5 {
        let sse = client
            .stream_chat(&Req::chat(&format!("s{i}")).chunks(3, ms(5)))
            .await
            .read_sse(Duration::from_secs(3))
            .await;
        assert!(sse.complete(), "{sse:?}");
    }
    assert_eq!(forwarding(&up), start + 5, "one connection per stream");

    // Whole answers reuse a pooled connection, and so do passthroughs.
    let before = forwarding(&up);
    for i in 0..5 {
        let resp = client.post_chat(&Req::chat(&format!("u{i}"))).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert_eq!(client.get("/v1/models").await.status, 200);
    }
    // Each of slotgate's runtimes (one per core) keeps its own pool, so a request and its upstream
    // connection stay on one thread: at most one new connection per runtime.
    let runtimes = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        forwarding(&up) <= before + runtimes,
        "5 whole answers and 5 passthroughs opened {} connections ({runtimes} runtimes)",
        forwarding(&up) - before
    );
    assert_eq!(up.count(), 10);
    // slotgate's own count agrees: 5 streams, at most one pooled connection per runtime.
    let metric = opened().await - metric_start;
    assert!(
        (5.0..=(5 + runtimes) as f64).contains(&metric),
        "counted {metric} connections"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_reuse_off_every_generation_request_gets_its_own_upstream_connection() {
    let (up, gate) = Gate::new()
        .slots(1)
        .health_interval("1h")
        .opt("--upstream-reuse-connections", "false")
        .start_instant()
        .await;
    let client = gate.client();
    up.wait_readiness_calls().await;
    let start = forwarding(&up);
    for i in 0..5 {
        let resp = client.post_chat(&Req::chat(&format!("u{i}"))).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(forwarding(&up), start + 5, "one connection per request");
    gate.assert_settled(&up, 1).await;
}
