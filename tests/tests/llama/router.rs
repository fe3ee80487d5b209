//! slotgate before llama-server's router mode (issue 21, first step): the router is recognised
//! (`/status` says `role: router` and lists its models with their states), a request for a model it
//! serves is forwarded and answered, and one for a model it does not serve is a 404
//! `model_not_found` in the API's own error shape at once, never queued.

use std::time::{Duration, Instant};

use serde_json::json;
use slotgate_tests::llama::{chat, serial, LlamaServer};
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_router_is_recognised_and_an_unknown_model_is_refused_at_once() {
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha", "beta"], 2, &[]).await;
    let gate = Gate::new()
        .queue_timeout("60s")
        .upstream_path(llama.socket())
        .start()
        .await;
    let s = gate
        .wait_status(Duration::from_secs(10), "the router and its models", |s| {
            s["upstream"]["router"]["models"]
                .as_array()
                .is_some_and(|m| m.len() == 2)
        })
        .await;
    assert_eq!(s["upstream"]["role"], "router", "{s}");
    assert_eq!(s["upstream"]["router"]["max_instances"], 2, "{s}");
    let ids: Vec<&str> = s["upstream"]["router"]["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta"], "{s}");
    assert_eq!(
        s["upstream"]["router"]["models"][0]["status"], "unloaded",
        "{s}"
    );

    // A model it serves: loaded on demand and answered.
    let mut body = chat("hello", 8, false);
    body["model"] = json!("alpha");
    let resp = gate.client().post_json(CHAT, &body).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        resp.json()["usage"]["completion_tokens"],
        8,
        "{}",
        resp.body
    );
    let s = gate
        .wait_status(Duration::from_secs(10), "alpha loaded", |s| {
            s["upstream"]["router"]["models"][0]["status"] == "loaded"
        })
        .await;
    assert_eq!(
        s["upstream"]["router"]["models"][1]["status"], "unloaded",
        "{s}"
    );
    // Its own slots and context, from its /props (never asked of beta: that would load it).
    let s = gate
        .wait_status(Duration::from_secs(10), "alpha's slots", |s| {
            s["upstream"]["router"]["models"][0]["slots"] == 2
        })
        .await;
    let models = &s["upstream"]["router"]["models"];
    assert_eq!(models[0]["n_ctx_slot"], 2048, "{s}");
    assert!(models[1]["slots"].is_null(), "{s}");
    assert_eq!(models[1]["status"], "unloaded", "{s}");

    // One it does not: 404 at once, in the OpenAI shape, naming what it serves.
    body["model"] = json!("gamma");
    let t0 = Instant::now();
    let resp = gate.client().post_json(CHAT, &body).await;
    assert_eq!(resp.status, 404, "{}", resp.body);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(
        resp.header("x-slotgate-reason").as_deref(),
        Some("bad_request")
    );
    let e = &resp.json()["error"];
    assert_eq!(e["code"], "model_not_found", "{}", resp.body);
    assert_eq!(e["type"], "invalid_request_error", "{}", resp.body);
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("`gamma`") && message.contains("alpha, beta"),
        "{message}"
    );
    // The Anthropic dialect answers in its own shape.
    let resp = gate
        .client()
        .post_json(
            "/v1/messages",
            &json!({"model": "gamma", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status, 404, "{}", resp.body);
    assert_eq!(resp.json()["type"], "error", "{}", resp.body);

    gate.assert_idle().await;
    // The router's /slots and /metrics need a model: alpha's slots are idle.
    let slots = llama.get("/slots?model=alpha").await.json();
    let slots = slots.as_array().unwrap_or_else(|| panic!("{slots}"));
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert!(
        slots.iter().all(|s| s["is_processing"] == false),
        "{slots:?}"
    );
}
