//! Bad input is answered by slotgate itself with the JSON error shape and never reaches the upstream:
//! oversized and malformed bodies, unknown paths, wrong methods, slow headers and bodies, too many connections.

use std::time::Duration;

use slotgate_tests::client::{raw_body, raw_status};
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_body_gets_413() {
    let (up, gate) = Gate::new().max_body("1KiB").start_instant().await;
    let client = gate.client();

    let big = Req::chat("big").set("padding", "x".repeat(2048));
    let resp = client.post_json(CHAT, &big.json()).await;
    assert_error(&resp, 413, "body_too_large");

    let small = Req::chat("small").set("padding", "x".repeat(600));
    assert!(small.json().to_string().len() < 1024);
    let resp = client.post_json(CHAT, &small.json()).await;
    assert_eq!(
        resp.status, 200,
        "a body under --max-body must pass: {}",
        resp.body
    );

    assert_eq!(
        up.tags(),
        ["small"],
        "the oversized body must never be forwarded"
    );
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("bad_request", 1).await;
}

/// A chat body of exactly `len` bytes.
fn body_of_len(tag: &str, len: usize) -> String {
    let base = Req::chat(tag).set("padding", "").json().to_string();
    let body = Req::chat(tag)
        .set("padding", "x".repeat(len - base.len()))
        .json()
        .to_string();
    assert_eq!(body.len(), len);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_body_boundary_is_inclusive() {
    let (up, gate) = Gate::new().max_body("1KiB").start_instant().await;
    let client = gate.client();

    let resp = client.post_raw(CHAT, body_of_len("exact", 1024)).await;
    assert_eq!(
        resp.status, 200,
        "a body of exactly --max-body bytes: {}",
        resp.body
    );
    let resp = client.post_raw(CHAT, body_of_len("over", 1025)).await;
    assert_error(&resp, 413, "body_too_large");
    assert_eq!(up.tags(), ["exact"]);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_chunked_body_gets_413() {
    let (up, gate) = Gate::new().max_body("1KiB").start_instant().await;

    // No Content-Length: the limit must be enforced while the body streams in.
    let body = body_of_len("chunked", 3000);
    let mut req = String::from(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    for part in body.as_bytes().chunks(500) {
        req.push_str(&format!(
            "{:x}\r\n{}\r\n",
            part.len(),
            String::from_utf8_lossy(part)
        ));
    }
    req.push_str("0\r\n\r\n");
    let (got, _) = gate
        .client()
        .raw_exchange(req.as_bytes(), Duration::from_secs(3))
        .await
        .expect("slotgate answers and closes");
    assert_eq!(
        raw_status(&got),
        Some(413),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(
        up.count(),
        0,
        "the oversized chunked body reached the upstream"
    );
    gate.assert_settled(&up, 1).await;
}

/// Neither a generation request nor a passthrough reached the upstream.
fn assert_nothing_forwarded(up: &RunningUpstream) {
    assert_eq!(
        up.count(),
        0,
        "rejected requests reached the upstream: {:?}",
        up.requests_seen()
    );
    assert!(
        up.passthrough_seen().is_empty(),
        "rejected passthroughs reached the upstream: {:?}",
        up.passthrough_seen()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_json_gets_400_and_is_never_forwarded() {
    let (up, gate) = Gate::new().start_instant().await;
    let client = gate.client();

    // A slot route's body is what admission reads: it must be a JSON object.
    for body in ["{not json", "", "[1, 2, 3]", "\"just a string\""] {
        let resp = client.post_raw(CHAT, body.to_owned()).await;
        assert_error(&resp, 400, "invalid_json");
    }
    // In Anthropic's shape on its API.
    let resp = client.post_raw("/v1/messages", "{oops".to_owned()).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    let v: serde_json::Value = serde_json::from_str(&resp.body).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("invalid_request_error")),
        "{v}"
    );
    assert_nothing_forwarded(&up);
    // A passthrough's is llama-server's to judge: forwarded as it came.
    let resp = client.post_raw("/tokenize", "{oops").await;
    assert_eq!(resp.status, 200, "the fake answers anything: {}", resp.body);
    assert_eq!(up.passthrough_seen(), ["/tokenize"]);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_path_gets_404_and_wrong_method_405() {
    let (up, gate) = Gate::new().start_instant().await;
    let client = gate.client();

    let resp = client
        .post_json("/v1/unknown", &Req::chat("x").json())
        .await;
    let ty = assert_error(&resp, 404, "not_found");
    assert_eq!(ty, "not_found_error");
    let resp = client.get("/v1/files").await;
    assert_error_says(
        &resp,
        404,
        "not_found",
        "slotgate forwards every route llama-server serves",
    );
    // llama-server's whole-server endpoints belong to the admin listener.
    for path in ["/slots", "/metrics", "/lora-adapters"] {
        let resp = client.get(path).await;
        let ty = assert_error(&resp, 403, "admin_endpoint");
        assert_eq!(ty, "permission_error");
        assert!(resp.body.contains("admin listener"), "{}", resp.body);
    }

    let resp = client.get(CHAT).await;
    assert_error(&resp, 405, "method_not_allowed");
    let resp = client.post_json("/v1/models", &serde_json::json!({})).await;
    assert_error(&resp, 405, "method_not_allowed");

    assert_nothing_forwarded(&up);
    gate.assert_settled(&up, 1).await;
}

/// Sends the start of a request and stops; returns what slotgate sent before closing the connection
/// (within 4 s) and how long that took, or `None` if it kept the connection open.
async fn stall(gate: &RunningGate, partial: &[u8]) -> Option<(Vec<u8>, Duration)> {
    gate.client()
        .raw_exchange(partial, Duration::from_secs(4))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slowloris_headers_are_cut_off() {
    let (up, gate) = Gate::new().header_timeout("500ms").start_instant().await;

    let (got, took) = stall(
        &gate,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: ",
    )
    .await
    .expect("a connection stuck in its headers must be closed within a few seconds");
    assert!(
        took >= ms(300),
        "closed after {took:?}, before the 500 ms header timeout"
    );
    if let Some(status) = raw_status(&got) {
        assert_eq!(
            status,
            408,
            "unexpected answer to a slowloris: {}",
            String::from_utf8_lossy(&got)
        );
    }
    assert_eq!(up.count(), 0);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_body_gets_408_or_is_closed() {
    let (up, gate) = Gate::new().body_timeout("500ms").start_instant().await;

    let (got, took) = stall(
        &gate,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"model\":",
    )
    .await
    .expect("a connection stuck in its body must be answered and closed within a few seconds");
    assert!(
        took >= ms(300),
        "answered after {took:?}, before the 500 ms body timeout"
    );
    match raw_status(&got) {
        Some(status) => {
            assert_eq!(status, 408, "{}", String::from_utf8_lossy(&got));
            let body = raw_body(&got);
            let (_, code) = parse_error(&body);
            assert_eq!(code, "body_timeout");
        }
        None => eprintln!("slotgate closed the slow-body connection without a 408"),
    }
    assert_eq!(up.count(), 0);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_connections_holds_back_the_extra_connection() {
    let (up, gate) = Gate::new().max_connections(2).start_instant().await;
    let client = gate.client();

    let mut c1 = client.connect().await.unwrap();
    let mut c2 = client.connect().await.unwrap();
    assert_eq!(c1.get("/v1/models").await.unwrap().status, 200);
    assert_eq!(c2.get("/v1/models").await.unwrap().status, 200);

    let third = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut c3 = client.connect().await?;
            c3.post_json(CHAT, &Req::chat("third").json()).await
        })
    };
    tokio::time::sleep(ms(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was handled while two were open with --max-connections 2: {:?}",
        third.await
    );
    assert!(!up.saw_tag("third"));

    drop(c1);
    let resp = tokio::time::timeout(Duration::from_secs(3), third)
        .await
        .expect("the third connection must be served once one closes")
        .unwrap()
        .expect("the third connection must be served, not reset");
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        c2.get("/v1/models").await.unwrap().status,
        200,
        "the kept connection still works"
    );
    drop(c2);
    gate.assert_settled(&up, 1).await;
}
