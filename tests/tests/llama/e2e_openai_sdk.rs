//! The official OpenAI Python SDK against slotgate in front of a real llama-server (`-np 1`, the tiny
//! model): a burst left to the SDK's own retries all ends in answers, each retry sent no earlier than
//! the `retry-after-ms` slotgate gave it; whole and streamed answers parse, with `usage` and
//! `finish_reason`; slotgate's errors come out as the SDK's typed exceptions carrying its message.
//!
//! The SDK runs in `tests/python/` drivers under `$SLOTGATE_PYTHON`, the venv that
//! `scripts/setup-python-clients.sh` installs from the pinned `tests/python/requirements.txt`. An
//! httpx2 event hook in the drivers records every HTTP attempt (sent, head received, status, wait
//! headers, the SDK's `x-stainless-retry-count`), and the drivers print JSON that is checked here.
//! Without `$SLOTGATE_PYTHON` these tests fail, naming the script: they never skip.
//!
//! Each test starts its own llama-server; they run one at a time, as in `e2e_llama.rs`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use slotgate_tests::gate::free_port;
use slotgate_tests::llama::{chat, chat_usage, LlamaServer, RunningLlama, PROMPT};
use slotgate_tests::python::{arg, driver, driver_on_cue, python, Attempt};
use slotgate_tests::*;

/// SDK clients in the burst, against one slot and two queue places.
const BURST: usize = 12;
const BURST_QUEUE: usize = 2;
/// One burst answer takes about this long: the burst is several seconds of work for one slot.
const BURST_ANSWER: Duration = Duration::from_millis(300);
/// Bounds on the answers' length, whatever the calibration says.
const BURST_TOKENS: (u64, u64) = (32, 256);
/// Generous: the SDK gives up after this many retries, which would fail the test.
const BURST_RETRIES: u32 = 30;
/// How much earlier than `retry-after-ms` a retry may be sent: only the clocks' resolution (the
/// receive time is taken after the head arrived, so a true early retry shows as much earlier).
const CLOCK_SLACK_MS: f64 = 2.0;
/// Loose bounds on how much longer than told the SDK waited (thread wake-ups of 12 Python threads
/// on 2 busy cores): at most this for any one retry, a tenth of it for the median.
const OVERSLEEP_MS: f64 = 1000.0;

/// One burst client: its answer or the error it ended with, and its attempts.
#[derive(Debug, Deserialize)]
struct BurstClient {
    index: usize,
    ok: bool,
    error: Option<String>,
    content: Option<String>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    attempts: Vec<Attempt>,
}

#[derive(Debug, Deserialize)]
struct BurstResult {
    versions: Value,
    clients: Vec<BurstClient>,
}

/// A whole or streamed answer as the SDK parsed it.
#[derive(Debug, Deserialize)]
struct Answer {
    object: String,
    content: String,
    finish_reason: Option<String>,
    usage: Option<Value>,
    chunks: Option<usize>,
    usage_chunk: Option<usize>,
    attempts: Vec<Attempt>,
}

/// The exception an SDK call raised (`raised: None` if it succeeded).
#[derive(Debug, Deserialize)]
struct Raised {
    raised: Option<String>,
    #[serde(default)]
    ancestry: Vec<String>,
    status: Option<u16>,
    /// A string for slotgate's own codes; llama-server's errors carry the HTTP status as a number.
    code: Option<Value>,
    #[serde(rename = "type")]
    error_type: Option<String>,
    body: Option<Value>,
    message: Option<String>,
    #[serde(default)]
    attempts: Vec<Attempt>,
}

impl Raised {
    /// The SDK raised exactly `class` for `status`, with slotgate's code and type, the error object
    /// of slotgate's body as `body`, and its message in the exception's text. Returns the message.
    fn assert_slotgate(&self, class: &str, status: u16, code: &str, error_type: &str) -> String {
        assert_eq!(self.raised.as_deref(), Some(class), "{self:#?}");
        assert!(
            self.ancestry.iter().any(|c| c == "APIStatusError"),
            "{self:#?}"
        );
        assert_eq!(self.status, Some(status), "{self:#?}");
        assert_eq!(
            self.code.as_ref().and_then(Value::as_str),
            Some(code),
            "{self:#?}"
        );
        assert_eq!(self.error_type.as_deref(), Some(error_type), "{self:#?}");
        let body = self.body.as_ref().expect("the SDK kept the body");
        assert_eq!(
            body["code"], code,
            "e.body is slotgate's error object: {body}"
        );
        assert_eq!(body["type"], error_type, "{body}");
        let message = body["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message in {body}"))
            .to_owned();
        assert_eq!(
            self.message.as_deref(),
            Some(format!("Error code: {status} - {message}").as_str()),
            "the exception's text carries slotgate's message"
        );
        // What came over the wire: the same error object, on the one attempt made.
        assert_eq!(self.attempts.len(), 1, "{:#?}", self.attempts);
        assert_eq!(self.attempts[0].status, Some(status));
        assert_eq!(self.attempts[0].error.as_ref(), Some(body));
        message
    }
}

/// llama-server with one slot, slotgate before it on a TCP port (the SDK speaks HTTP over TCP):
/// (llama, gate, the SDK's base URL).
async fn llama_and_gate(gate: Gate) -> (RunningLlama, RunningGate, String) {
    // Without the SDK, fail before starting anything.
    python();
    let llama = LlamaServer::start(1).await;
    let port = free_port();
    let gate = gate
        .listen(format!("tcp:127.0.0.1:{port}"))
        .start_before(&llama)
        .await;
    (llama, gate, format!("http://127.0.0.1:{port}/v1"))
}

/// How every scenario ends: nothing queued, busy or in flight at the gate, llama-server idle.
async fn assert_both_idle(gate: &RunningGate, llama: &RunningLlama) {
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// `usage` that counts `completion` generated tokens on a non-empty prompt, consistently.
fn assert_usage(usage: Option<&Value>, completion: u64) {
    let u = usage.unwrap_or_else(|| panic!("no usage"));
    let prompt = u["prompt_tokens"].as_u64().expect("usage.prompt_tokens");
    assert!(prompt > 0, "{u}");
    assert_eq!(u["completion_tokens"], completion, "{u}");
    assert_eq!(u["total_tokens"], prompt + completion, "{u}");
}

/// A burst of SDK clients, each with the SDK's built-in retries, against one slot and two queue
/// places: most are turned away at first, and every one ends with its answer, each retry sent no
/// earlier than the `retry-after-ms` of the 429 before it (the SDK reads that header first and
/// sleeps exactly that long when it is at most 120 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_sdk_clients_retrying_as_told_all_get_answers() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate, base_url) = llama_and_gate(Gate::one_slot(BURST_QUEUE)).await;
    let tokens = llama
        // Low bounds: the barrier sends the whole burst at once, so even short answers overlap,
        // and on a loaded machine long ones would make the burst take minutes.
        .tokens_for(BURST_ANSWER, BURST_TOKENS)
        .await;
    // Two answers through the gate first, so its drain estimate is learnt from real usage.
    for _ in 0..2 {
        chat_usage(
            &gate
                .client()
                .post_json(CHAT, &chat(PROMPT, tokens, false))
                .await,
            tokens,
        );
    }

    let result: BurstResult = driver(
        "openai_burst.py",
        &[
            arg("--base-url"),
            arg(&base_url),
            arg("--clients"),
            arg(BURST),
            arg("--max-tokens"),
            arg(tokens),
            arg("--max-retries"),
            arg(BURST_RETRIES),
        ],
    )
    .await;
    assert_eq!(result.clients.len(), BURST);

    let mut refusals = 0usize;
    let mut waits = Vec::new();
    for c in &result.clients {
        let who = format!("client {}", c.index);
        assert!(
            c.ok,
            "{who} ended with {:?}; attempts {:#?}",
            c.error, c.attempts
        );
        assert!(
            !c.content.as_deref().unwrap_or_default().is_empty(),
            "{who}: empty content"
        );
        assert_eq!(c.finish_reason.as_deref(), Some("length"), "{who}");
        assert_usage(c.usage.as_ref(), tokens);
        let last = c.attempts.last().expect("at least one attempt");
        assert_eq!(last.status, Some(200), "{who}: {:#?}", c.attempts);
        for (n, pair) in c.attempts.windows(2).enumerate() {
            let (refused, retry) = (&pair[0], &pair[1]);
            // Only a 429 is ever retried here, by the SDK itself (its retry count goes up by one).
            assert_eq!(refused.status, Some(429), "{who}: {:#?}", c.attempts);
            assert_eq!(refused.path, "/v1/chat/completions");
            assert_eq!(
                refused.error.as_ref().map(|e| e["code"].clone()),
                Some("queue_full".into()),
                "{who}: {refused:?}"
            );
            assert_eq!(refused.retry_count, n as i64, "{who}: {:#?}", c.attempts);
            assert_eq!(retry.retry_count, n as i64 + 1, "{who}: {:#?}", c.attempts);
            let told = refused
                .retry_after_ms
                .unwrap_or_else(|| panic!("{who}: a 429 without retry-after-ms: {refused:?}"));
            let secs = refused.retry_after.expect("Retry-After beside it");
            assert!(
                told > 0.0 && told / 1000.0 <= secs && told / 1000.0 > secs - 1.0,
                "{who}: retry-after-ms {told} disagrees with Retry-After {secs}"
            );
            let waited = retry.sent_ms - refused.received_ms.expect("head received");
            assert!(
                waited >= told - CLOCK_SLACK_MS,
                "{who}: retry {} sent {waited:.1} ms after a 429 that said retry-after-ms {told}",
                n + 1
            );
            assert!(
                waited <= told + OVERSLEEP_MS,
                "{who}: the SDK waited {waited:.1} ms after retry-after-ms {told}: not the header's wait"
            );
            refusals += 1;
            waits.push((told, waited));
        }
    }
    for c in &result.clients {
        let line: Vec<String> = c
            .attempts
            .iter()
            .map(|a| match (a.status, a.retry_after_ms) {
                (Some(429), Some(ms)) => format!("{:.0}:429 told {ms:.0}", a.sent_ms),
                (status, _) => format!(
                    "{:.0}:{} after {:.0}",
                    a.sent_ms,
                    status.unwrap_or(0),
                    a.received_ms.unwrap_or(f64::NAN) - a.sent_ms
                ),
            })
            .collect();
        eprintln!("client {:2}: {}", c.index, line.join(", "));
    }
    let first_refused = result
        .clients
        .iter()
        .filter(|c| c.attempts[0].status == Some(429))
        .count();
    let mut over: Vec<f64> = waits.iter().map(|(told, waited)| waited - told).collect();
    over.sort_by(f64::total_cmp);
    let median_over = over.get(over.len() / 2).copied().unwrap_or(0.0);
    let max_over = over.iter().copied().fold(0.0, f64::max);
    let mean_over = over.iter().sum::<f64>() / over.len().max(1) as f64;
    let max_told = waits.iter().map(|w| w.0).fold(0.0, f64::max);
    // Retries that got in: each refused client's last one.
    let got_in = result
        .clients
        .iter()
        .filter(|c| c.attempts.len() > 1)
        .count();
    eprintln!(
        "{:?}: {BURST} clients, {tokens}-token answers: {refusals} 429s ({first_refused} on the \
         first attempt), {got_in} of {refusals} retries got in, most attempts by one client {}; \
         retry-after-ms up to {max_told:.0} ms; \
         the SDK waited longer than told by {mean_over:.1} ms on average, {median_over:.1} ms \
         median, {max_over:.1} ms at most",
        result.versions,
        result
            .clients
            .iter()
            .map(|c| c.attempts.len())
            .max()
            .unwrap_or(0),
    );
    assert!(
        median_over <= OVERSLEEP_MS / 10.0,
        "the SDK waited a median {median_over:.1} ms longer than told: not the header's wait"
    );
    assert!(
        refusals >= 1,
        "no 429 at all: the burst never overloaded one slot"
    );
    // The gate counted exactly the refusals the SDK saw, and every answer.
    gate.wait_outcome("queue_full", refusals as u64).await;
    gate.wait_outcome("ok", BURST as u64 + 2).await;
    assert_both_idle(&gate, &llama).await;
}

/// A whole answer and two streams (with and without `stream_options.include_usage`) parse with the
/// SDK: content, `finish_reason`, and `usage` exactly where it was asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_and_streamed_answers_parse_with_the_sdk() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate, base_url) = llama_and_gate(Gate::one_slot(2)).await;
    let tokens = 24u64;
    let call = |command: &'static str, extra: Option<&'static str>| {
        let mut args = vec![arg("--base-url"), arg(&base_url), arg(command)];
        args.extend([arg("--max-tokens"), arg(tokens)]);
        args.extend(extra.map(arg));
        async move { driver::<Answer>("openai_calls.py", &args).await }
    };

    let whole = call("chat", None).await;
    assert_eq!(whole.object, "chat.completion");
    assert!(!whole.content.is_empty(), "{whole:?}");
    assert_eq!(whole.finish_reason.as_deref(), Some("length"), "{whole:?}");
    assert_usage(whole.usage.as_ref(), tokens);

    let streamed = call("stream", Some("--include-usage")).await;
    assert!(!streamed.content.is_empty(), "{streamed:?}");
    assert_eq!(
        streamed.finish_reason.as_deref(),
        Some("length"),
        "{streamed:?}"
    );
    assert_usage(streamed.usage.as_ref(), tokens);
    let chunks = streamed.chunks.expect("chunk count");
    assert_eq!(
        streamed.usage_chunk,
        Some(chunks - 1),
        "usage comes in the last chunk: {streamed:?}"
    );

    // slotgate asks llama-server for usage on every stream, and hides it from a client that did not.
    let plain = call("stream", None).await;
    assert!(!plain.content.is_empty(), "{plain:?}");
    assert_eq!(plain.finish_reason.as_deref(), Some("length"), "{plain:?}");
    assert_eq!(plain.usage, None, "usage nobody asked for: {plain:?}");

    for a in [&whole, &streamed, &plain] {
        assert_eq!(a.attempts.len(), 1, "{:#?}", a.attempts);
        assert_eq!(a.attempts[0].status, Some(200));
    }
    gate.wait_outcome("ok", 3).await;
    assert_both_idle(&gate, &llama).await;
}

/// slotgate's own errors reach SDK code as the SDK's typed exceptions, with slotgate's code, type
/// and message: 404 `NotFoundError`, 413 the base `APIStatusError` (the SDK has no class for 413 and
/// does not retry it), a prompt over the slot's context `BadRequestError` (400, in llama-server's own
/// `exceed_context_size_error` shape whoever refused it), and a full queue `RateLimitError` (429
/// `queue_full`, with `max_retries=0` one attempt, the wait in its headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slotgate_errors_surface_as_the_sdks_typed_exceptions() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate, base_url) = llama_and_gate(Gate::one_slot(0).max_body("32KiB")).await;
    // `extra`: the driver's options, then `error` and its own.
    let error = |extra: &[&str]| {
        let mut args = vec![arg("--base-url"), arg(&base_url)];
        args.extend(extra.iter().map(arg));
        async move { driver::<Raised>("openai_calls.py", &args).await }
    };

    let not_found = error(&["--max-retries", "0", "error", "--call", "files"]).await;
    let message = not_found.assert_slotgate("NotFoundError", 404, "not_found", "not_found_error");
    assert_eq!(
        message,
        "no such endpoint: GET /v1/files (slotgate forwards every route llama-server serves; see docs/endpoints.md)"
    );

    // The SDK's default retries (2): a 413 is not retried.
    let too_large = error(&["error", "--prompt-chars", "40000"]).await;
    let message = too_large.assert_slotgate(
        "APIStatusError",
        413,
        "body_too_large",
        "invalid_request_error",
    );
    assert_eq!(message, "request body is larger than the 32768-byte limit");

    // About 5,000 tokens for a slot of 2,048, in a body under the 32 KiB limit; not retried either.
    let too_long = error(&["error", "--prompt-chars", "20000"]).await;
    assert_eq!(
        too_long.raised.as_deref(),
        Some("BadRequestError"),
        "{too_long:#?}"
    );
    assert_eq!(too_long.status, Some(400), "{too_long:#?}");
    assert_eq!(
        too_long.error_type.as_deref(),
        Some("exceed_context_size_error")
    );
    let body = too_long.body.as_ref().expect("the SDK kept the body");
    assert_eq!(body["n_ctx"], 2048, "{body}");
    assert!(
        body["n_prompt_tokens"].as_u64().is_some_and(|n| n >= 2048),
        "{body}"
    );
    // In llama-server's words, whether slotgate counted the prompt itself or llama-server refused.
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("request (")
            && message
                .ends_with("exceeds the available context size (2048 tokens), try increasing it"),
        "{message}"
    );

    // The only slot generating, no queue place: a 429 at once, raised without retrying. The call
    // goes out on cue once the slot is taken, so the answer holding it need not outlast Python's
    // start-up.
    let long = llama.tokens_for(Duration::from_secs(1), (50, 600)).await;
    let args = [
        arg("--base-url"),
        arg(&base_url),
        arg("--max-retries"),
        arg(0),
        arg("error"),
    ];
    // A one-element tuple: the scene hands back a task handle, not something to await in it.
    let (limited, (held,)): (Raised, _) = driver_on_cue("openai_calls.py", &args, async {
        let held = gate
            .hold_slot(&Req::from_json(chat(PROMPT, long, false)))
            .await;
        (held,)
    })
    .await;
    let message = limited.assert_slotgate("RateLimitError", 429, "queue_full", "rate_limit_error");
    let refusal = &limited.attempts[0];
    let secs = refusal.retry_after.expect("Retry-After") as u64;
    assert!(
        refusal.retry_after_ms.is_some_and(|ms| ms > 0.0
            && ms / 1000.0 <= secs as f64
            && ms / 1000.0 > secs as f64 - 1.0),
        "retry-after-ms disagrees with Retry-After: {refusal:?}"
    );
    assert_eq!(
        message,
        format!("the queue is full (0 waiting); retry after {secs}s")
    );
    let (resp, _) = held.await.expect("held request");
    chat_usage(&resp, long);

    gate.wait_outcome("queue_full", 1).await;
    gate.wait_outcome("bad_request", 2).await;
    gate.wait_outcome("upstream_4xx", 1).await;
    assert_both_idle(&gate, &llama).await;
}
