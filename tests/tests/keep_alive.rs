//! Keep-alive on both sides: several requests on one client connection each take and release the slot,
//! and slotgate reuses its connections to the upstream instead of opening one per request.

use std::time::Duration;

use http::{Method, Request};
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_connection_carries_many_requests() {
    let (up, gate) = Gate::one_slot(4).start_with(FakeUpstream::instant()).await;
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
        .send(
            Request::builder()
                .method(Method::POST)
                .uri(CHAT)
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    b"{bad",
                )))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_error(&bad, 400, "invalid_json");
    let last = conn.post_json(CHAT, &Req::chat("k3").json()).await;
    match last {
        Ok(resp) => assert_eq!(resp.status, 200, "{}", resp.body),
        // Closing after an error is allowed; the next connection must work.
        Err(_) => {
            let resp = client.post_json(CHAT, &Req::chat("k3").json()).await;
            assert_eq!(resp.status, 200, "{}", resp.body);
        }
    }

    // A stream on a kept-alive connection, then another request on a second one.
    let stream = client
        .stream(CHAT, &Req::chat("s").chunks(3, ms(10)).json())
        .await;
    assert!(stream.read_sse(Duration::from_secs(3)).await.complete());
    assert_eq!(up.tags(), ["k0", "k1", "k2", "k3", "s"]);
    drop(conn);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_connections_are_reused() {
    // The fake counts every connection it accepts, health probes' included, and probes share slotgate's
    // pool. With an hourly probe the only one runs at start, so the count below is every connection
    // slotgate opened, unfiltered: the probe's (which the first request may reuse) and any the requests
    // needed. A fresh connection per request would make it 10 or 11.
    let (up, gate) = Gate::new()
        .slots(1)
        .health_interval("1h")
        .start_with(FakeUpstream::instant())
        .await;
    let client = gate.client();

    for i in 0..10 {
        let resp = client
            .post_json(CHAT, &Req::chat(&format!("u{i}")).json())
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.count(), 10);
    // slotgate's own calls (reading /props, counting the prompt once: the ten share it) each use a
    // connection of their own, closed after, so they never leave a closing one in the pool.
    let forwarding = || up.connections() - up.internal_seen().len();
    let whole = forwarding();
    assert!(
        whole <= 2,
        "10 sequential requests through one slot opened {whole} upstream connections (health probes: {})",
        up.health_checks()
    );

    // Streamed requests go out with `Connection: close` on purpose: llama-server closes the connection
    // after every streamed answer, and reusing one it is closing would fail the next request. The first
    // stream takes the pooled connection and closes it; each further stream needs one of its own.
    for i in 0..3 {
        let sse = client
            .stream(CHAT, &Req::chat(&format!("s{i}")).chunks(3, ms(5)).json())
            .await
            .read_sse(Duration::from_secs(3))
            .await;
        assert!(sse.complete(), "{sse:?}");
    }
    assert_eq!(forwarding(), whole + 2, "no connection outlives its stream");
    for i in 0..3 {
        let resp = client
            .post_json(CHAT, &Req::chat(&format!("w{i}")).json())
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(
        forwarding(),
        whole + 3,
        "whole answers are back on one pooled connection"
    );
    gate.assert_settled(&up, 1).await;
}
