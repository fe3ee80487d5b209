//! What a request really costs, as slotgate accounts it:
//! - a stream whose client did not ask for `stream_options.include_usage` gets no `usage` from
//!   llama-server, only `timings` on its last chunk; its tokens (prompt = `prompt_n` + `cache_n`,
//!   completion = `predicted_n`) still reach the metrics and the policies' `on_complete`, so a
//!   token budget is not refunded for a stream that used its tokens;
//! - `n_predict` overrides `max_tokens` in llama-server, so a policy sees the value that bounds
//!   generation, not the smaller one a client put beside it.

use std::time::Duration;

use serde_json::json;
use slotgate_tests::budget::send_until_refunded;
use slotgate_tests::*;

/// One slot in front of an instant fake, with the built example policy `name` and its `settings`
/// (inline TOML).
async fn start_with_policy(name: &str, settings: &str) -> (RunningUpstream, RunningGate) {
    Gate::new()
        .slots(1)
        .policies(&[(&wat::built(name), Some(settings))])
        .start_instant()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timings_only_answers_are_counted_in_the_token_metrics() {
    let (up, gate) = Gate::one_slot(1).start_instant().await;
    let client = gate.client();

    // A chat stream: 300 prompt tokens of which 280 came from the prompt cache, 6 generated.
    let sse = client
        .stream_chat(
            &Req::chat("chat-stream")
                .chunks(6, ms(5))
                .prompt_tokens(300)
                .usage_in_timings_only(280),
        )
        .await
        .read_sse(Duration::from_secs(5))
        .await;
    assert!(sse.complete(), "{sse:?}");
    assert!(!sse.raw.contains("\"usage\""), "{}", sse.raw);
    // A native /completion stream and a whole chat answer, both with timings only.
    let native = client
        .stream(
            "/completion",
            &json!({"prompt": "x", "stream": true, "fake_tag": "native", "fake_chunks": 2,
                    "fake_prompt_tokens": 21, "fake_usage": "timings", "fake_cached_tokens": 20}),
        )
        .await
        .read_sse(Duration::from_secs(5))
        .await;
    assert!(native.complete(), "{native:?}");
    let whole = client
        .post_chat(
            &Req::chat("whole")
                .prompt_tokens(40)
                .completion_tokens(9)
                .usage_in_timings_only(0),
        )
        .await;
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert!(whole.json().get("usage").is_none(), "{}", whole.body);

    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("ok", 3).await;
    assert_eq!(up.usage_totals(), (300 + 21 + 40, 6 + 2 + 9));
    gate.wait_tokens("prompt", 361.0).await;
    gate.wait_tokens("completion", 17.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_budget_charges_a_stream_that_reported_only_timings() {
    let (up, gate) =
        start_with_policy("token-budget", "{ capacity = 1000, refill_per_second = 0 }").await;
    let client = gate.client();

    // Charged 901 up front (1 estimated prompt token + 900); really used 300 + 400 = 700, reported
    // only as timings. Settled, the bucket holds 1000 - 700 = 300. Had the stream been accounted as
    // using nothing, it would hold 999.
    let first = Req::chat("first")
        .stream()
        .set("max_tokens", 900)
        .prompt_tokens(300)
        .completion_tokens(400)
        .usage_in_timings_only(200);
    let sse = client
        .stream(CHAT, &first.json())
        .await
        .read_sse(Duration::from_secs(5))
        .await;
    assert!(sse.complete(), "{sse:?}");

    // A probe costing 290 fits only once the first request is settled (99 left before), and uses
    // exactly what it is charged, so it changes nothing on settling.
    let probe = Req::chat("probe")
        .set("max_tokens", 289)
        .prompt_tokens(1)
        .completion_tokens(289);
    let resp = send_until_refunded(
        &client,
        &probe.json(),
        "the first request was never settled",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);

    // 10 tokens are left: a request that may cost 101 is refused. (Had the first stream been counted
    // as free, 709 would be left and it would pass.)
    let over = client
        .post_chat(&Req::chat("over").set("max_tokens", 100))
        .await;
    assert_error(&over, 429, "policy_denied");
    assert_eq!(
        up.tags(),
        ["first", "probe"],
        "refused requests never reach the upstream"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policies_see_the_max_tokens_llama_server_obeys() {
    let (up, gate) = start_with_policy(
        "request-guard",
        r#"{ max_tokens = 100, over_max_tokens = "deny" }"#,
    )
    .await;
    let client = gate.client();

    // llama-server generates up to n_predict = 500 here, whatever max_tokens says.
    let sneaky = Req::chat("sneaky")
        .set("max_tokens", 1)
        .set("n_predict", 500);
    // Builds differ on which OpenAI name wins; the larger one counts.
    let both = Req::chat("both")
        .set("max_completion_tokens", 1)
        .set("max_tokens", 500);
    for denied in [sneaky, both] {
        assert_error(&client.post_chat(&denied).await, 403, "policy_denied");
    }
    assert_eq!(up.count(), 0, "denied requests never reach the upstream");

    // The other way round it generates at most 1 token and is let through; the guard's cap still
    // lowers every key present.
    let modest = Req::chat("modest")
        .set("max_tokens", 500)
        .set("n_predict", 1);
    let resp = client.post_json(CHAT, &modest.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let seen = up.request_with_tag("modest").expect("forwarded");
    assert_eq!(
        (&seen.body["max_tokens"], &seen.body["n_predict"]),
        (&json!(100), &json!(1)),
        "{}",
        seen.body
    );
    assert_eq!(up.count(), 1);
    gate.assert_settled(&up, 1).await;
}
