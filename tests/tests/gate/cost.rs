//! Exact prompt counting, against the fake llama-server (whose tokenizer counts one token per 4
//! characters plus one): a request with a free slot is forwarded at once, uncounted, and settled from
//! its usage; a request that waits is counted while it waits (the count reaches the response header,
//! the cache and its place in the queue); a chain with a policy that asks for the count has every
//! request counted first; the estimate mode asks llama-server nothing; and a prompt longer than a
//! slot's context gets the same 400 whichever way it went. The real tokenizer's agreement with
//! llama-server is e2e_llama_cost.rs.

use std::time::Duration;

use slotgate_tests::fake_upstream::{Scripted, BAD_REQUEST_MESSAGE, CHAT_COUNT};

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
    up.wait_readiness_calls().await;
    (up, gate)
}

/// Sends `body` while the one slot is held by a slow request, so it waits (and is counted meanwhile).
async fn post_behind_busy_slot(gate: &RunningGate, body: &serde_json::Value) -> Response {
    static HOLDERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = HOLDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let held = gate
        .hold_slot(&Req::chat(&format!("busy{n}")).delay(Duration::from_millis(300)))
        .await;
    let resp = gate.client().post_json(CHAT, body).await;
    let (busy, _) = held.await.expect("slot holder");
    assert_eq!(busy.status, 200, "{}", busy.body);
    resp
}

/// 40 characters of prompt (10 tokens by the estimate, 11 by the fake's tokenizer) and `max_tokens`
/// 100; the fake reports a usage of 11 + 30.
fn forty_chars_using_41(tag: &str) -> Req {
    Req::chat(tag)
        .set(
            "messages",
            json!([{"role": "user", "content": "z".repeat(40)}]),
        )
        .set("max_tokens", 100)
        .prompt_tokens(11)
        .completion_tokens(30)
}

fn counts(up: &RunningUpstream, path: &str) -> usize {
    up.internal_seen().iter().filter(|p| *p == path).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_with_a_free_slot_is_forwarded_at_once_uncounted_and_settled_from_usage() {
    let (up, gate) = start_with_slot_context(1000).await;
    let resp = gate
        .client()
        .post_json(CHAT, &forty_chars_using_41("now").json())
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header(PROMPT_HEADER), None, "not counted");
    assert_eq!(
        (
            counts(&up, CHAT_COUNT),
            counts(&up, "/apply-template"),
            counts(&up, "/tokenize")
        ),
        (0, 0, 0),
        "no round trip to llama-server before forwarding: {:?}",
        up.internal_seen()
    );
    gate.assert_settled(&up, 1).await;
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero("slotgate_prompt_counts_total", &[("source", "forwarded")]),
        1.0
    );
    // Reserved on the estimate (40 chars / 4 = 10, + 100), refunded to the usage (11 + 30).
    assert_eq!(
        m.value_or_zero("slotgate_tokens_reserved_total", &[]),
        110.0
    );
    assert_eq!(
        m.value_or_zero("slotgate_tokens_refunded_total", &[]),
        110.0 - 41.0
    );
    // The tenant is charged what was used, not what was estimated.
    assert_eq!(
        m.sum("slotgate_tenant_tokens_total", &[]),
        41.0,
        "{}",
        m.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prompts_are_counted_by_the_upstream_once_and_then_from_the_cache() {
    let (up, gate) = Gate::new().slots(1).start_instant().await;
    let text = "twelve chars";
    let first = post_behind_busy_slot(&gate, &chat(text)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        first.header(PROMPT_HEADER).as_deref(),
        Some("4"),
        "12 chars / 4 + 1"
    );
    assert_eq!(
        up.own_calls_after_readiness().len(),
        1,
        "one call to llama-server's count endpoint: {:?}",
        up.internal_seen()
    );
    // Only max_tokens differs: the same prompt, counted from the cache.
    let mut again = chat(text);
    again["max_tokens"] = 99.into();
    let second = post_behind_busy_slot(&gate, &again).await;
    assert_eq!(second.header(PROMPT_HEADER).as_deref(), Some("4"));
    let calls: Vec<_> = up.own_calls_after_readiness();
    assert_eq!(calls, [CHAT_COUNT], "counted once");
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
    assert_eq!(
        m.value_or_zero("slotgate_prompt_counts_total", &[("source", "forwarded")]),
        2.0,
        "the two slot holders went at once"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_estimate_mode_asks_llama_server_nothing() {
    let (up, gate) = Gate::new()
        .slots(1)
        .opt("--cost-tokenizer", "estimate")
        .start_instant()
        .await;
    let resp = post_behind_busy_slot(&gate, &chat("hello there")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header(PROMPT_HEADER), None);
    assert!(
        !up.internal_seen()
            .iter()
            .any(|p| p == "/tokenize" || p == CHAT_COUNT),
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
async fn a_waiting_prompt_longer_than_a_slot_leaves_the_queue_with_400() {
    let (up, gate) = start_with_slot_context(64).await;
    // 400 characters: 101 tokens, more than the 64 a slot holds; counted while it waits.
    let resp = post_behind_busy_slot(&gate, &chat(&"x".repeat(400))).await;
    // slotgate's own refusal, in llama-server's words and shape.
    assert_context_refusal(&resp, Some(101), 64);
    assert_eq!(
        up.count(),
        1,
        "only the slot holder reached the upstream, never the refused request"
    );
    // 40 characters: 11 tokens, served.
    let ok = post_behind_busy_slot(&gate, &chat(&"y".repeat(40))).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.header(PROMPT_HEADER).as_deref(), Some("11"));
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prompt_forwarded_at_once_that_cannot_fit_gets_the_same_400_from_llama_server() {
    let (up, gate) = start_with_slot_context(64).await;
    let resp = gate.client().post_json(CHAT, &chat(&"x".repeat(400))).await;
    assert_context_refusal(&resp, Some(101), 64);
    assert_eq!(up.count(), 1, "forwarded once, refused by the upstream");
    // llama-server's own answer, byte for byte.
    let theirs = serde_json::json!({"error": {"code": 400, "type": "exceed_context_size_error",
        "message": "request (101 tokens) exceeds the available context size (64 tokens), try increasing it",
        "n_prompt_tokens": 101, "n_ctx": 64}});
    assert_eq!(resp.body, theirs.to_string());
    gate.wait_outcome("upstream_4xx", 1).await;
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_other_400_from_llama_server_reaches_the_client_unchanged() {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::errors([Scripted::BadRequest]))
        .await;
    let resp = gate.client().post_json(CHAT, &chat("hello")).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    let body: serde_json::Value = serde_json::from_str(&resp.body).expect("JSON");
    assert_eq!(body["error"]["message"], BAD_REQUEST_MESSAGE, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_that_asks_for_the_exact_count_has_every_request_counted_first() {
    let guard = wat::built("request-guard");
    let (up, gate) = Gate::new()
        .slots(1)
        .policies(&[(&guard, Some("{ max_prompt_tokens = 20 }"))])
        .start_with(FakeUpstream::instant().n_ctx(1000))
        .await;
    // A free slot, and still counted before the chain: 40 characters are 11 tokens exactly.
    let ok = gate.client().post_json(CHAT, &chat(&"y".repeat(40))).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.header(PROMPT_HEADER).as_deref(), Some("11"));
    assert_eq!(counts(&up, CHAT_COUNT), 1);
    // 80 characters: 20 tokens by the estimate (within the limit), 21 exactly: refused on the exact
    // count, which the policy's message shows (no "about").
    let over = gate.client().post_json(CHAT, &chat(&"w".repeat(80))).await;
    assert_error(&over, 403, "policy_denied");
    assert!(
        over.body.contains("has 21 tokens"),
        "decided on the exact count: {}",
        over.body
    );
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
    // Forwarded at once, so reserved on the estimate: 40 characters are 10 tokens; 100 more reserved
    // for the answer. It uses 11 + 30.
    let resp = client
        .post_json(CHAT, &forty_chars_using_41("r").json())
        .await;
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
        110.0 + 1000.0
    );
    assert_eq!(
        m.value_or_zero("slotgate_tokens_refunded_total", &[]),
        (110.0 - 41.0) + (1000.0 - 16.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_answers_429_without_asking_llama_server_to_count() {
    let (up, gate) = Gate::one_slot(1).start_instant().await;
    let held = gate
        .hold_slot(&Req::chat("busy").delay(std::time::Duration::from_millis(800)))
        .await;
    let queued = gate.enqueue(&Req::chat("queued")).await;
    // The waiter is counted while it waits.
    eventually(Duration::from_secs(5), "the waiter counted", || async {
        (counts(&up, CHAT_COUNT) == 1).then_some(())
    })
    .await;
    let counted = 1;
    let resp = gate
        .client()
        .post_json(CHAT, &chat("a different prompt, never counted"))
        .await;
    assert_error(&resp, 429, "queue_full");
    assert_eq!(
        counts(&up, CHAT_COUNT),
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
    let (up, gate) = Gate::new().slots(1).start_instant().await;
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
    let whole = client.post_chat(&Req::chat("whole")).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_llama_server_without_the_count_endpoint_is_counted_by_template_and_tokenizer() {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::instant().without_count_endpoint())
        .await;
    for round in 0..2 {
        let resp = post_behind_busy_slot(&gate, &chat(&format!("round {round} of twelve"))).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert_eq!(
            resp.header(PROMPT_HEADER).as_deref(),
            Some("6"),
            "21 chars / 4 + 1"
        );
    }
    let calls: Vec<_> = up.own_calls_after_readiness();
    // Asked once, refused (404): the endpoint is not asked again for a while.
    assert_eq!(
        calls,
        [
            CHAT_COUNT,
            "/apply-template",
            "/tokenize",
            "/apply-template",
            "/tokenize"
        ],
        "{calls:?}"
    );
    gate.assert_settled(&up, 1).await;
}
