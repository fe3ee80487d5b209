//! The SDKs clients run against llama-server, from PyPI, through slotgate to the real llama-server:
//! the Anthropic SDK (messages, a stream, `count_tokens`, a burst on a saturated slot that its own
//! retries of slotgate's 529s carry through, honouring slotgate's `retry-after-ms`, and its typed
//! errors with slotgate's words) and the OpenAI SDK's Responses API, whole and streamed.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use slotgate_tests::llama::{chat, LlamaServer, PROMPT};
use slotgate_tests::python::{arg, assert_anthropic_whole, driver, driver_on_cue, python, Attempt};
use slotgate_tests::*;

use super::{assert_both_idle, gate_before, learned, serial};

const BURST: usize = 8;

#[derive(Debug, Deserialize)]
struct BurstClient {
    index: usize,
    ok: bool,
    raised: Option<String>,
    stop_reason: Option<String>,
    usage: Option<Value>,
    attempts: Vec<Attempt>,
}

#[derive(Debug, Deserialize)]
struct Burst {
    clients: Vec<BurstClient>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_anthropic_sdk_works_through_slotgate_and_its_retries_honour_retry_after() {
    let _one = serial().await;
    python();
    let llama = LlamaServer::start(1).await;
    let (gate, base) = gate_before(&llama, Gate::one_slot(2).queue_timeout("120s")).await;
    learned(&gate).await;
    let call = |extra: &[&str]| {
        let mut args = vec![arg("--base-url"), arg(&base)];
        args.extend(extra.iter().map(arg));
        args
    };

    let m: Value = driver(
        "anthropic_calls.py",
        &call(&["messages", "--max-tokens", "6"]),
    )
    .await;
    assert_eq!(m["type"], "message", "{m}");
    assert_anthropic_whole(&m, 6);
    let input = m["usage"]["input_tokens"].as_u64().unwrap()
        + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert!(input > 0, "{m}");
    let s: Value = driver(
        "anthropic_calls.py",
        &call(&["stream", "--max-tokens", "5"]),
    )
    .await;
    let events: Vec<&str> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(events.first(), Some(&"message_start"), "{s}");
    assert_eq!(events.last(), Some(&"message_stop"), "{s}");
    assert_anthropic_whole(&s, 5);
    let c: Value = driver("anthropic_calls.py", &call(&["count"])).await;
    assert_eq!(
        c["input_tokens"].as_u64(),
        Some(input),
        "the count is the prompt the answer used: {c}"
    );

    // A busy slot and no queue place, before the same llama-server: the SDK's typed error, carrying
    // slotgate's message and Anthropic's error type.
    let (no_queue, no_queue_base) = gate_before(&llama, Gate::one_slot(0)).await;
    learned(&no_queue).await;
    let long = llama.tokens_for(Duration::from_secs(2), (50, 1800)).await;
    let (raised, (held,)): (Value, _) = driver_on_cue(
        "anthropic_calls.py",
        &[
            arg("--base-url"),
            arg(&no_queue_base),
            arg("--max-retries"),
            arg(0),
            arg("error"),
        ],
        async {
            (no_queue
                .hold_slot(&Req::from_json(chat(PROMPT, long, false)))
                .await,)
        },
    )
    .await;
    held.await.unwrap();
    // Anthropic's own answer for an overloaded server: 529 `overloaded_error`, which the SDK
    // raises as its `OverloadedError` (and retries, as the burst below shows).
    assert_eq!(raised["raised"], "OverloadedError", "{raised}");
    assert_eq!(raised["status"], 529, "{raised}");
    assert_eq!(raised["body"]["type"], "error", "{raised}");
    assert_eq!(
        raised["body"]["error"]["type"], "overloaded_error",
        "{raised}"
    );
    assert!(
        raised["body"]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("the queue is full"),
        "{raised}"
    );
    assert!(
        raised["message"]
            .as_str()
            .unwrap()
            .contains("the queue is full"),
        "{raised}"
    );
    no_queue.assert_idle().await;
    drop(no_queue);

    // A burst: most are turned away at first (529); the SDK's retries carry every one through, none
    // sent before the retry-after-ms it was given.
    let tokens = llama
        .tokens_for(Duration::from_millis(250), (16, 200))
        .await;
    let burst: Burst = driver(
        "anthropic_calls.py",
        &call(&[
            "--max-retries",
            "30",
            "burst",
            "--clients",
            &BURST.to_string(),
            "--max-tokens",
            &tokens.to_string(),
        ]),
    )
    .await;
    let mut refusals = 0;
    for c in &burst.clients {
        assert!(
            c.ok,
            "client {} raised {:?}: {:#?}",
            c.index, c.raised, c.attempts
        );
        assert_anthropic_whole(
            &serde_json::json!({"stop_reason": c.stop_reason, "usage": c.usage}),
            tokens,
        );
        for pair in c.attempts.windows(2) {
            let (refused, retry) = (&pair[0], &pair[1]);
            assert_eq!(refused.status, Some(529), "{:#?}", c.attempts);
            refusals += 1;
            let told = refused.retry_after_ms.expect("retry-after-ms on every 529");
            let waited = retry.sent_ms - refused.received_ms.unwrap();
            assert!(
                waited >= told - 2.0,
                "client {} retried after {waited} ms, told {told}",
                c.index
            );
        }
    }
    eprintln!("{BURST} Anthropic SDK clients: {refusals} refusals, all served");
    assert!(
        refusals > 0,
        "the burst never met a full queue: it proves nothing"
    );
    assert_both_idle(&gate, &llama).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_openai_sdks_responses_api_works_through_slotgate() {
    let _one = serial().await;
    python();
    let llama = LlamaServer::start(1).await;
    let (gate, base) = gate_before(&llama, Gate::new()).await;
    learned(&gate).await;
    let base = format!("{base}/v1");
    for stream in [false, true] {
        let mut args = vec![
            arg("--base-url"),
            arg(&base),
            arg("responses"),
            arg("--max-tokens"),
            arg(6),
        ];
        if stream {
            args.push(arg("--stream"));
        }
        let r: Value = driver("openai_calls.py", &args).await;
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(r["usage"]["output_tokens"], 6, "{r}");
        assert!(r["usage"]["input_tokens"].as_u64().unwrap() > 0, "{r}");
        if stream {
            let events = r["events"].as_array().unwrap();
            assert_eq!(
                events.last().and_then(Value::as_str),
                Some("response.completed"),
                "{r}"
            );
        }
    }
    let m = gate.metrics().await;
    m.assert_value("slotgate_tokens_total", &[("kind", "completion")], 12.0);
    assert_both_idle(&gate, &llama).await;
}
