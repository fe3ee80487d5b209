//! What llama-server's router would refuse before it loads a model, slotgate refuses before its own
//! load (docs/router.md#loads): a request for a model not loaded when the router loads only when
//! asked (`--no-models-autoload`), one whose credentials the router refuses; and a request naming a
//! conversation parked while its model waits for a load, which a stop ends in the router's words
//! (docs/endpoints.md#resumable-streams). llama.cpp's own suite checks the same through `slotgate
//! wrap` (`scripts/test-llama-suite.sh`); these hold it in slotgate's own.

use std::time::Duration;

use http::Method;
use serde_json::json;
use slotgate_tests::llama::{serial, LlamaServer};
use slotgate_tests::*;

use crate::router::{chat_for, pool, router_state};

/// An error in llama-server's own shape: `{"error":{"code":N,"message":...,"type":...}}`.
fn assert_llama_error(resp: &Response, status: u16, message: &str, kind: &str) {
    assert_eq!(resp.status, status, "{}", resp.body);
    let e = &resp.json()["error"];
    assert_eq!(e["code"], status, "{}", resp.body);
    assert_eq!(e["message"], message, "{}", resp.body);
    assert_eq!(e["type"], kind, "{}", resp.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_that_loads_only_when_asked_gets_no_load_from_slotgate() {
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha"], 2, &["--no-models-autoload"]).await;
    let gate = Gate::new()
        .queue_timeout("60s")
        .opt("--client-admin-routes", "models")
        .start_before(&llama)
        .await;
    gate.wait_status(Duration::from_secs(10), "alpha listed", |s| {
        router_state(s, "alpha") == "unloaded"
    })
    .await;
    let refused = gate.client().post_json(CHAT, &chat_for("alpha", 4)).await;
    assert_llama_error(
        &refused,
        400,
        "model is not loaded",
        "invalid_request_error",
    );
    let s = gate.status().await;
    assert_eq!(router_state(&s, "alpha"), "unloaded", "{s}");

    // The client loads it itself (its route forwarded on the client listener): then it serves,
    // at once, without waiting for slotgate's next health check.
    let load = gate
        .client()
        .post_json("/models/load", &json!({"model": "alpha"}))
        .await;
    assert_eq!(load.status, 200, "{}", load.body);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !llama
        .get("/models")
        .await
        .body
        .contains(r#""value":"loaded""#)
    {
        assert!(std::time::Instant::now() < deadline, "alpha never loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let served = gate.client().post_json(CHAT, &chat_for("alpha", 4)).await;
    assert_eq!(served.status, 200, "{}", served.body);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_the_router_would_refuse_for_its_key_loads_no_model() {
    const KEY: &str = "sk-router-secret";
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha"], 2, &["--api-key", KEY]).await;
    let file = unique_dir("router-asks-key").join("llama.key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    let gate = Gate::new()
        .queue_timeout("60s")
        .opt("--upstream-api-key-file", file.display())
        .start_before(&llama)
        .await;
    gate.wait_status(Duration::from_secs(10), "alpha listed", |s| {
        router_state(s, "alpha") == "unloaded"
    })
    .await;
    for auth in [vec![], vec![("authorization", "Bearer sk-wrong")]] {
        let refused = gate
            .client()
            .send_with(Method::POST, CHAT, &auth, chat_for("alpha", 4).to_string())
            .await;
        assert_llama_error(&refused, 401, "Invalid API Key", "authentication_error");
    }
    let s = gate.status().await;
    assert_eq!(router_state(&s, "alpha"), "unloaded", "{s}");
    assert!(
        pool(&s, "alpha").is_none_or(|p| p["load"]["doing"].is_null()),
        "{s}"
    );
    let key = format!("Bearer {KEY}");
    let served = gate
        .client()
        .send_with(
            Method::POST,
            CHAT,
            &[("authorization", key.as_str())],
            chat_for("alpha", 4).to_string(),
        )
        .await;
    assert_eq!(served.status, 200, "{}", served.body);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_while_its_model_waits_for_a_load_ends_a_parked_conversation() {
    let _one = serial().await;
    // One model at a time: beta's load waits for room while alpha is busy.
    let llama = LlamaServer::start_router(&["alpha", "beta"], 1, &[]).await;
    let gate = Gate::new().queue_timeout("120s").start_before(&llama).await;
    let warm = gate.client().post_json(CHAT, &chat_for("alpha", 4)).await;
    assert_eq!(warm.status, 200, "{}", warm.body);
    let busy = {
        let (client, body) = (gate.client(), chat_for("alpha", 1800));
        tokio::spawn(async move { client.post_json(CHAT, &body).await })
    };
    gate.wait_status(Duration::from_secs(10), "alpha busy", |s| {
        pool(s, "alpha").is_some_and(|p| p["busy"] == 1)
    })
    .await;
    let parked = {
        let client = gate.client();
        let mut body = chat_for("beta", 8);
        body["stream"] = json!(true);
        tokio::spawn(async move {
            client
                .send_with(
                    Method::POST,
                    CHAT,
                    &[("x-conversation-id", "conv-parked")],
                    body.to_string(),
                )
                .await
        })
    };
    gate.wait_status(Duration::from_secs(10), "beta waiting for room", |s| {
        pool(s, "beta").is_some_and(|p| p["load"]["doing"] == "waiting for room")
    })
    .await;
    let resume = gate.client().get("/v1/stream?conv_id=conv-parked").await;
    assert_llama_error(
        &resume,
        503,
        "Stream owner model is loading, retry later",
        "unavailable_error",
    );
    let stop = gate
        .client()
        .send_with(Method::DELETE, "/v1/stream?conv_id=conv-parked", &[], "")
        .await;
    assert_eq!(stop.status, 204, "the router's own answer: {}", stop.body);
    let stopped = tokio::time::timeout(Duration::from_secs(10), parked)
        .await
        .expect("the parked request ended")
        .unwrap();
    assert_llama_error(
        &stopped,
        400,
        "request cancelled by a stop while the model was loading",
        "invalid_request_error",
    );
    let gone = gate.client().get("/v1/stream?conv_id=conv-parked").await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    let done = busy.await.unwrap();
    assert_eq!(done.status, 200, "{}", done.body);
    gate.assert_idle().await;
}
