//! Prompt counting before admission, against the fake llama-server (whose tokenizer counts one token
//! per 4 characters plus one): exact counts reach the response header and the cache, the estimate
//! mode asks llama-server nothing, and a prompt longer than a slot's context is refused with 400
//! before it could queue. The real tokenizer's agreement with llama-server is e2e_llama_cost.rs.

use serde_json::json;
use slotgate_tests::*;

const PROMPT_HEADER: &str = "x-slotgate-prompt-tokens";

fn chat(content: &str) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 8})
}

/// One slot in front of an instant fake whose slots hold `n_ctx` tokens, once slotgate has read that
/// from the fake's `/props`.
async fn start_with_slot_context(n_ctx: u64) -> (RunningUpstream, RunningGate) {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::instant().n_ctx(n_ctx))
        .await;
    eventually(
        std::time::Duration::from_secs(10),
        "slotgate read /props",
        || async {
            up.internal_seen()
                .iter()
                .any(|p| p == "/props")
                .then_some(())
        },
    )
    .await;
    (up, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prompts_are_counted_by_the_upstream_once_and_then_from_the_cache() {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::instant())
        .await;
    let client = gate.client();
    let text = "twelve chars";
    let first = client.post_json(CHAT, &chat(text)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        first.header(PROMPT_HEADER).as_deref(),
        Some("4"),
        "12 chars / 4 + 1"
    );
    assert_eq!(
        up.internal_seen().iter().filter(|p| *p != "/props").count(),
        2
    );
    // Only max_tokens differs: the same prompt, counted from the cache.
    let mut again = chat(text);
    again["max_tokens"] = 99.into();
    let second = client.post_json(CHAT, &again).await;
    assert_eq!(second.header(PROMPT_HEADER).as_deref(), Some("4"));
    let calls: Vec<_> = up
        .internal_seen()
        .into_iter()
        .filter(|p| p != "/props")
        .collect();
    assert_eq!(calls, ["/apply-template", "/tokenize"], "counted once");
    assert!(
        up.passthrough_seen().is_empty(),
        "slotgate's own calls are not client passthroughs"
    );
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero("slotgate_prompt_counts_total", &[("source", "upstream")]),
        1.0
    );
    assert_eq!(
        m.value_or_zero("slotgate_prompt_counts_total", &[("source", "cache")]),
        1.0
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_estimate_mode_asks_llama_server_nothing() {
    let (up, gate) = Gate::new()
        .slots(1)
        .opt("--cost-tokenizer", "estimate")
        .start_with(FakeUpstream::instant())
        .await;
    let resp = gate.client().post_json(CHAT, &chat("hello there")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header(PROMPT_HEADER), None);
    assert!(
        !up.internal_seen().iter().any(|p| p == "/tokenize"),
        "{:?}",
        up.internal_seen()
    );
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero("slotgate_prompt_counts_total", &[("source", "estimate")]),
        1.0
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prompt_longer_than_a_slot_is_refused_before_it_queues() {
    let (up, gate) = start_with_slot_context(64).await;
    let client = gate.client();
    // 400 characters: 101 tokens, more than the 64 a slot holds.
    let resp = client.post_json(CHAT, &chat(&"x".repeat(400))).await;
    assert_error(&resp, 400, "context_length_exceeded");
    assert!(
        resp.body.contains("101 tokens") && resp.body.contains("64"),
        "{}",
        resp.body
    );
    // 40 characters: 11 tokens, served.
    let ok = client.post_json(CHAT, &chat(&"y".repeat(40))).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(
        up.count(),
        1,
        "the refused request never reached the upstream"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_are_counted_and_what_was_not_used_is_refunded() {
    let (up, gate) = start_with_slot_context(1000).await;
    let client = gate.client();
    // 40 characters: 11 prompt tokens; 100 more reserved for the answer, of which it uses 30.
    let body = Req::chat("r")
        .set(
            "messages",
            json!([{"role": "user", "content": "z".repeat(40)}]),
        )
        .set("max_tokens", 100)
        .prompt_tokens(11)
        .completion_tokens(30);
    let resp = client.post_json(CHAT, &body.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    // No max_tokens: the rest of the slot's context is reserved (1000 in all).
    let open = Req::chat("open")
        .set(
            "messages",
            json!([{"role": "user", "content": "z".repeat(40)}]),
        )
        .prompt_tokens(11)
        .completion_tokens(5);
    assert_eq!(client.post_json(CHAT, &open.json()).await.status, 200);
    gate.assert_settled(&up, 1).await;
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero("slotgate_tokens_reserved_total", &[]),
        111.0 + 1000.0
    );
    assert_eq!(
        m.value_or_zero("slotgate_tokens_refunded_total", &[]),
        (111.0 - 41.0) + (1000.0 - 16.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_answers_429_without_asking_llama_server_to_count() {
    let (up, gate) = Gate::one_slot(1).start_with(FakeUpstream::instant()).await;
    let held = gate
        .hold_slot(&Req::chat("busy").delay(std::time::Duration::from_millis(800)))
        .await;
    let queued = gate.enqueue(&Req::chat("queued")).await;
    let counted = up
        .internal_seen()
        .iter()
        .filter(|p| *p == "/tokenize")
        .count();
    let resp = gate
        .client()
        .post_json(CHAT, &chat("a different prompt, never counted"))
        .await;
    assert_error(&resp, 429, "queue_full");
    assert_eq!(
        up.internal_seen()
            .iter()
            .filter(|p| *p == "/tokenize")
            .count(),
        counted,
        "the turned-away request was not counted"
    );
    for (resp, _) in join_all(vec![held, queued]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_streams_always_ask_llama_server_for_usage() {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::instant())
        .await;
    let client = gate.client();
    let plain = Req::chat("plain").chunks(2, ms(5));
    let sse = client
        .stream(CHAT, &plain.json())
        .await
        .read_sse(std::time::Duration::from_secs(3))
        .await;
    assert!(sse.complete(), "{sse:?}");
    let asked = Req::chat("asked")
        .chunks(2, ms(5))
        .set("stream_options", json!({"include_usage": true}));
    let sse = client
        .stream(CHAT, &asked.json())
        .await
        .read_sse(std::time::Duration::from_secs(3))
        .await;
    assert!(sse.complete(), "{sse:?}");
    let whole = client.post_json(CHAT, &Req::chat("whole").json()).await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    let seen = up.requests_seen();
    let include = |tag: &str| {
        seen.iter()
            .find(|r| r.tag.as_deref() == Some(tag))
            .map(|r| r.body["stream_options"]["include_usage"].clone())
            .unwrap()
    };
    assert_eq!(include("plain"), true, "slotgate asked for the client");
    assert_eq!(include("asked"), true, "the client's own request kept");
    assert_eq!(
        include("whole"),
        serde_json::Value::Null,
        "not a stream: untouched"
    );
    gate.assert_settled(&up, 1).await;
}
