//! Routes: every allow-listed slot path is forwarded to the same upstream path, and a long stream arrives
//! byte-complete.

use std::time::Duration;

use slotgate_tests::fake_upstream::GENERATION_PATHS;
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_slot_path_is_forwarded_as_is() {
    let (up, gate) = Gate::new().slots(1).start_instant().await;
    let client = gate.client();

    for path in GENERATION_PATHS {
        let body = serde_json::json!({"input": "x", "prompt": "x", "query": "q", "documents": ["d"],
                                      "messages": [{"role": "user", "content": "hi"}], "fake_tag": path});
        let resp = client.post_json(path, &body).await;
        assert_eq!(resp.status, 200, "POST {path}: {}", resp.body);
        assert!(
            resp.header("x-slotgate-queue-wait-ms").is_some(),
            "POST {path} lacks the wait header"
        );
    }
    let seen: Vec<String> = up.requests_seen().into_iter().map(|r| r.path).collect();
    assert_eq!(seen, GENERATION_PATHS);
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("ok", GENERATION_PATHS.len() as u64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_fast_stream_arrives_complete_and_in_order() {
    let (up, gate) = Gate::new().slots(1).start_instant().await;

    let sse = gate
        .client()
        .stream(
            "/v1/completions",
            &Req::chat("long").chunks(300, ms(0)).json(),
        )
        .await
        .read_sse(Duration::from_secs(5))
        .await;
    assert!(sse.complete(), "{:?}", sse.error);
    assert_eq!(sse.data.len(), 301, "300 chunks + usage");
    for (i, d) in sse.data[..300].iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(d).unwrap();
        assert_eq!(
            v["choices"][0]["text"],
            format!("tok{i} "),
            "chunk {i} out of order or altered"
        );
    }
    gate.assert_settled(&up, 1).await;
}
