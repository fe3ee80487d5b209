//! Keep-alive: several requests on one client connection each take and release the slot; towards the
//! upstream, generation requests each get a connection of their own and everything else reuses the pool.

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
async fn generation_requests_get_their_own_upstream_connection_and_the_rest_reuse_the_pool() {
    // The fake counts every connection it accepts; slotgate's own calls (reading /props, counting a
    // prompt) use and close one each, and are left out of the count below. With an hourly health
    // probe, only the first one runs.
    let (up, gate) = Gate::new()
        .slots(1)
        .health_interval("1h")
        .start_with(FakeUpstream::instant())
        .await;
    let client = gate.client();
    let forwarding = || up.connections() - up.internal_seen().len();

    // Every generation request, whole or streamed, opens a connection of its own and closes it after
    // (`Connection: close`), so none can be written on a pooled connection llama-server is closing.
    let start = forwarding();
    for i in 0..5 {
        let resp = client
            .post_json(CHAT, &Req::chat(&format!("u{i}")).json())
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        let sse = client
            .stream(CHAT, &Req::chat(&format!("s{i}")).chunks(3, ms(5)).json())
            .await
            .read_sse(Duration::from_secs(3))
            .await;
        assert!(sse.complete(), "{sse:?}");
    }
    assert_eq!(up.count(), 10);
    assert_eq!(
        forwarding(),
        start + 10,
        "one connection per generation request"
    );

    // Passthroughs (model lists and the like) reuse one pooled connection.
    let before = forwarding();
    for _ in 0..5 {
        assert_eq!(client.get("/v1/models").await.status, 200);
    }
    assert!(
        forwarding() <= before + 1,
        "5 passthroughs opened {} connections",
        forwarding() - before
    );
    gate.assert_settled(&up, 1).await;
}
