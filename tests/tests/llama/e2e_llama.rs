//! End to end against a real llama-server (`-np 1`, the tiny random-weight model that
//! `scripts/setup-llama.sh` builds): slotgate keeps exactly one generation in flight, serves its queue in
//! arrival order, turns the excess away at once with 429, passes streamed and whole answers through
//! intact (the OpenAI chat endpoint and the native `/completion`), and, when a client leaves mid-stream,
//! makes llama-server stop generating and frees the slot.
//!
//! Each test starts its own llama-server. They run one at a time: two CPU-bound servers sharing the
//! cores would skew each other's timing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use slotgate_tests::llama::{
    chat_usage, stream_usage, u64_at, LlamaLoad, LlamaServer, RunningLlama, Usage, PROMPT,
};
use slotgate_tests::*;

/// How long one answer in the burst should take: well over the ~400 ms the burst takes to send, so
/// every request after the first arrives while the slot is still busy.
const BURST_ANSWER: Duration = Duration::from_millis(800);
/// The fewest tokens per burst answer (~0.8 s on 2 cores unloaded), in case calibration ran under load.
const BURST_FLOOR: u64 = 300;
/// The most tokens an answer may have: the prompt and the answer must fit the slot's context.
const MAX_ANSWER_TOKENS: u64 = slotgate_tests::llama::CTX_PER_SLOT as u64 - 200;
/// Tokens per answer where timing does not matter.
const SHORT_TOKENS: u64 = 24;
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// A fresh llama-server with one slot, and slotgate in front of it with one slot and three queue places.
async fn llama_and_gate() -> (RunningLlama, RunningGate) {
    let llama = LlamaServer::start(1).await;
    let gate = Gate::one_slot(3).start_before(&llama).await;
    (llama, gate)
}

/// How every test ends: both sides idle, and slotgate counted `ok` answers served.
async fn assert_all_served(gate: &RunningGate, llama: &RunningLlama, ok: u64) {
    gate.assert_idle().await;
    llama.assert_idle().await;
    gate.wait_outcome("ok", ok).await;
}

/// The same request straight to llama-server and through slotgate: (direct, through) answers.
async fn direct_and_through(
    llama: &RunningLlama,
    gate: &RunningGate,
    path: &str,
    body: &Value,
) -> (Response, Response) {
    let direct = Client::unix(llama.socket()).post_json(path, body).await;
    (direct, gate.client().post_json(path, body).await)
}

/// A chat request with [`PROMPT`] that always generates exactly `max_tokens` tokens.
fn chat(max_tokens: u64, stream: bool) -> Value {
    slotgate_tests::llama::chat(PROMPT, max_tokens, stream)
}

/// Greedy decoding, so the same request gives the same text through slotgate and straight from llama-server.
fn greedy(mut body: Value) -> Value {
    body["temperature"] = 0.into();
    body["top_k"] = 1.into();
    // Recompute the prompt every time: a reused KV cache may change logits in the last bits, and with
    // random weights the top two logits are close enough for that to flip the argmax.
    body["cache_prompt"] = false.into();
    body
}

/// One client's answer. For a stream, `resp.body` is the raw SSE text and `sse` its parse.
struct Answer {
    index: usize,
    resp: Response,
    sse: Option<SseRead>,
    took: Duration,
    finished: Instant,
}

async fn send(client: Client, index: usize, path: &str, body: Value) -> Answer {
    let t0 = Instant::now();
    let (resp, sse) = if body["stream"] == true {
        let s = client.stream(path, &body).await;
        let (status, headers) = (s.status, s.headers.clone());
        let sse = s.read_sse(ANSWER_TIMEOUT).await;
        (
            Response {
                status,
                headers,
                body: sse.raw.clone(),
            },
            Some(sse),
        )
    } else {
        let resp = tokio::time::timeout(ANSWER_TIMEOUT, client.post_json(path, &body))
            .await
            .unwrap_or_else(|_| panic!("r{index}: no answer within {ANSWER_TIMEOUT:?}"));
        (resp, None)
    };
    Answer {
        index,
        resp,
        sse,
        took: t0.elapsed(),
        finished: Instant::now(),
    }
}

/// What a checked answer said.
#[derive(Debug)]
struct Generated {
    text: String,
    usage: Usage,
}

/// A whole `/v1/chat/completions` answer: text, `finish_reason` "length" and a consistent `usage`.
fn check_chat(resp: &Response, max_tokens: u64) -> Generated {
    let usage = chat_usage(resp, max_tokens);
    let v = resp.json();
    let text = v
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no choices[0].message.content in {v}"));
    assert!(!text.is_empty(), "empty content in {v}");
    Generated {
        text: text.to_owned(),
        usage,
    }
}

/// Every SSE event of a stream, each of which must be JSON.
fn json_chunks(sse: &SseRead) -> Vec<Value> {
    sse.data
        .iter()
        .map(|d| {
            serde_json::from_str(d).unwrap_or_else(|e| panic!("SSE chunk is not JSON ({e}): {d:?}"))
        })
        .collect()
}

/// A streamed `/v1/chat/completions` answer: every chunk is JSON of one completion, it ends with
/// `[DONE]`, the last choice stops for "length" and the final `usage` counts every generated token.
fn check_chat_stream(resp: &Response, sse: &SseRead, max_tokens: u64) -> Generated {
    assert_eq!(resp.status, 200, "{}", resp.body);
    let ct = resp.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct:?}");
    let usage = stream_usage(sse, max_tokens);
    let chunks = json_chunks(sse);
    let id = &chunks[0]["id"];
    let (mut text, mut content_chunks, mut finish) = (String::new(), 0u64, None);
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(&c["id"], id, "one stream carries one completion id: {c}");
        if let Some(piece) = c
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            if !piece.is_empty() {
                text.push_str(piece);
                content_chunks += 1;
            }
        }
        if let Some(reason) = c
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
        {
            finish = Some(reason.to_owned());
        }
    }
    assert_eq!(
        finish.as_deref(),
        Some("length"),
        "finish_reason:\n{}",
        sse.raw
    );
    // A token that ends mid-UTF-8 character is held back and sent with the next, so there may be fewer
    // content chunks than tokens, never more.
    assert!(
        (1..=max_tokens).contains(&content_chunks),
        "{content_chunks} content chunks for {max_tokens} tokens"
    );
    Generated { text, usage }
}

/// One look at both sides during the burst.
#[derive(Debug)]
struct Sample {
    at_ms: u128,
    gate_busy: u64,
    gate_queued: u64,
    gate_inflight: u64,
    llama_busy: usize,
    llama: LlamaLoad,
}

/// The samples where something changed, for `--nocapture` runs and failure triage.
fn print_timeline(samples: &[Sample]) {
    eprintln!(
        "{} samples during the burst; those where something changed:",
        samples.len()
    );
    let mut last = None;
    for s in samples {
        let now = (
            s.gate_busy,
            s.gate_queued,
            s.gate_inflight,
            s.llama_busy,
            s.llama,
        );
        if last != Some(now) {
            eprintln!(
                "  {:>5} ms  slotgate busy {} queued {} inflight {} | llama-server busy {} processing {} deferred {}",
                s.at_ms,
                s.gate_busy,
                s.gate_queued,
                s.gate_inflight,
                s.llama_busy,
                s.llama.requests_processing,
                s.llama.requests_deferred
            );
            last = Some(now);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_on_one_slot_runs_one_at_a_time_in_arrival_order_and_overflow_gets_429() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate) = llama_and_gate().await;

    let tokens = llama
        .tokens_for(BURST_ANSWER, (BURST_FLOOR, MAX_ANSWER_TOKENS))
        .await;

    // 8 clients, 50 ms apart, streaming and not in turn: r0 takes the slot, r1..r3 fill the queue,
    // r4..r7 find it full. Each of r0..r3 is seen in place before the next is sent, so arrival order is
    // index order however loaded the machine is.
    let client = gate.client();
    let done = AtomicBool::new(false);
    let send_burst = async {
        let mut handles = Vec::new();
        for i in 0..8 {
            let body = chat(tokens, i % 2 == 0);
            handles.push(tokio::spawn(send(client.clone(), i, CHAT, body)));
            match i {
                0 => drop(gate.wait_busy(1).await),
                1..=3 => drop(gate.wait_queue_depth(i as u64).await),
                _ => {}
            }
            tokio::time::sleep(ms(50)).await;
        }
        let answers = join_all(handles).await;
        done.store(true, Ordering::Release);
        answers
    };
    let sample_both_sides = async {
        let t0 = Instant::now();
        let mut samples = Vec::new();
        while !done.load(Ordering::Acquire) {
            let (st, llama_busy, load) =
                tokio::join!(gate.status(), llama.busy_slots(), llama.load());
            samples.push(Sample {
                at_ms: t0.elapsed().as_millis(),
                gate_busy: u64_at(&st, "/slots/busy"),
                gate_queued: u64_at(&st, "/queue/depth"),
                gate_inflight: u64_at(&st, "/inflight"),
                llama_busy,
                llama: load,
            });
            tokio::time::sleep(ms(20)).await;
        }
        samples
    };
    let (answers, samples) = tokio::join!(send_burst, sample_both_sides);
    print_timeline(&samples);

    // Exactly one generation at a time, and llama-server never had to hold one back itself.
    for s in &samples {
        assert!(
            s.gate_busy <= 1 && s.gate_inflight <= 1,
            "slotgate over its one slot: {s:?}"
        );
        assert!(s.llama_busy <= 1, "llama-server ran two at once: {s:?}");
        assert_eq!(
            s.llama.requests_deferred, 0.0,
            "llama-server deferred a request: {s:?}"
        );
        assert!(s.llama.requests_processing <= 1.0, "{s:?}");
    }
    assert!(
        samples.iter().any(|s| s.llama_busy == 1 && s.gate_queued == 3),
        "the sampler never saw a busy slot with a full queue, so the checks above prove nothing: {samples:?}"
    );

    for a in &answers {
        eprintln!(
            "  r{} {:<5} {} after {:>4} ms, queue wait {}",
            a.index,
            if a.sse.is_some() { "sse" } else { "whole" },
            a.resp.status.as_u16(),
            a.took.as_millis(),
            a.resp
                .header("x-slotgate-queue-wait-ms")
                .unwrap_or_else(|| "-".into())
        );
    }

    let (served, rejected): (Vec<&Answer>, Vec<&Answer>) =
        answers.iter().partition(|a| a.resp.status == 200);
    let served_ids: Vec<usize> = served.iter().map(|a| a.index).collect();
    assert_eq!(
        served_ids,
        [0, 1, 2, 3],
        "one slot plus three queue places serve r0..r3 (r0 took {:?}); statuses: {:?}",
        answers[0].took,
        answers
            .iter()
            .map(|a| a.resp.status.as_u16())
            .collect::<Vec<_>>()
    );

    // Served in arrival order: they finish in index order, and each waited longer than the one before.
    let mut by_finish = served.clone();
    by_finish.sort_by_key(|a| a.finished);
    let finish_order: Vec<usize> = by_finish.iter().map(|a| a.index).collect();
    assert_eq!(finish_order, [0, 1, 2, 3], "completion order");
    let waits: Vec<u64> = served.iter().map(|a| queue_wait_ms(&a.resp)).collect();
    assert!(
        waits.windows(2).all(|w| w[0] < w[1]),
        "queue waits must grow with arrival: {waits:?}"
    );
    assert!(
        waits[0] < 100,
        "r0 found the slot free but waited {} ms",
        waits[0]
    );

    for a in &rejected {
        assert_error(&a.resp, 429, "queue_full");
        retry_after(&a.resp);
        assert!(
            a.took < Duration::from_secs(1),
            "r{}'s 429 took {:?}; it must not wait",
            a.index,
            a.took
        );
    }

    let (mut prompt, mut completion) = (0, 0);
    for a in &served {
        let g = match &a.sse {
            Some(sse) => check_chat_stream(&a.resp, sse, tokens),
            None => check_chat(&a.resp, tokens),
        };
        prompt += g.usage.prompt;
        completion += g.usage.completion;
    }

    assert_all_served(&gate, &llama, 4).await;
    gate.wait_outcome("queue_full", 4).await;
    gate.wait_tokens("completion", completion as f64).await;
    gate.wait_tokens("prompt", prompt as f64).await;
    let m = gate.metrics().await;
    m.assert_value("slotgate_queue_depth", &[], 0.0);
    m.assert_value("slotgate_slots_busy", &[], 0.0);
    m.assert_value("slotgate_inflight", &[], 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_completions_through_slotgate_match_llama_server_direct() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate) = llama_and_gate().await;

    let (direct, whole) =
        direct_and_through(&llama, &gate, CHAT, &greedy(chat(SHORT_TOKENS, false))).await;
    let reference = check_chat(&direct, SHORT_TOKENS);
    assert!(queue_wait_ms(&whole) < 100, "nothing else was running");
    let whole = check_chat(&whole, SHORT_TOKENS);
    assert_eq!(whole.text, reference.text, "slotgate changed the answer");
    assert_eq!(whole.usage.prompt, reference.usage.prompt);

    let a = send(gate.client(), 0, CHAT, greedy(chat(SHORT_TOKENS, true))).await;
    queue_wait_ms(&a.resp);
    let streamed = check_chat_stream(&a.resp, a.sse.as_ref().expect("streamed"), SHORT_TOKENS);
    assert_eq!(
        streamed.text, reference.text,
        "the streamed pieces must add up to the same answer"
    );

    // The same through the un-versioned alias.
    let alias = gate
        .client()
        .post_json("/chat/completions", &greedy(chat(SHORT_TOKENS, false)))
        .await;
    assert_eq!(check_chat(&alias, SHORT_TOKENS).text, reference.text);

    assert_all_served(&gate, &llama, 3).await;
}

/// llama-server's native completion API: `n_predict`, `content`, `stop`, `tokens_predicted`.
fn native(n_predict: u64, stream: bool) -> Value {
    greedy(json!({"prompt": PROMPT, "n_predict": n_predict, "ignore_eos": true, "stream": stream}))
}

fn check_native(resp: &Response, n_predict: u64) -> String {
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v = resp.json();
    assert_eq!(v["stop"], true, "{v}");
    assert_eq!(u64_at(&v, "/tokens_predicted"), n_predict, "{v}");
    assert_eq!(v["stop_type"], "limit", "{v}");
    let text = v["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {v}"));
    assert!(!text.is_empty(), "{v}");
    text.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn native_completion_through_slotgate_streams_and_answers_intact() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate) = llama_and_gate().await;

    let (direct, whole) =
        direct_and_through(&llama, &gate, "/completion", &native(SHORT_TOKENS, false)).await;
    let reference = check_native(&direct, SHORT_TOKENS);
    queue_wait_ms(&whole);
    assert_eq!(
        check_native(&whole, SHORT_TOKENS),
        reference,
        "slotgate changed the answer"
    );

    let a = send(gate.client(), 0, "/completion", native(SHORT_TOKENS, true)).await;
    assert_eq!(a.resp.status, 200, "{}", a.resp.body);
    queue_wait_ms(&a.resp);
    let sse = a.sse.expect("streamed");
    assert!(
        sse.error.is_none(),
        "stream broke: {:?}\n{}",
        sse.error,
        sse.raw
    );
    let chunks = json_chunks(&sse);
    let (last, pieces) = chunks.split_last().expect("at least one chunk");
    assert!(
        pieces.iter().all(|c| c["stop"] == false),
        "only the last chunk stops:\n{}",
        sse.raw
    );
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(u64_at(last, "/tokens_predicted"), SHORT_TOKENS, "{last}");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["content"].as_str())
        .collect();
    assert_eq!(
        text, reference,
        "the streamed pieces must add up to the same answer"
    );

    assert_all_served(&gate, &llama, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_mid_stream_stops_llama_server_and_frees_the_slot() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate) = llama_and_gate().await;
    // As long an answer as the context allows; the client leaves after the first token.
    let tokens = MAX_ANSWER_TOKENS;
    let mut stream = gate.client().stream(CHAT, &chat(tokens, true)).await;
    assert_eq!(stream.status, 200);
    stream.first_event(Duration::from_secs(5)).await;
    assert_eq!(
        llama.busy_slots().await,
        1,
        "llama-server should be generating"
    );
    let next = tokio::spawn(send(gate.client(), 1, CHAT, chat(SHORT_TOKENS, false)));
    gate.wait_queue_depth(1).await;

    drop(stream);
    let left = Instant::now();
    let a = next.await.expect("queued client");
    let waited = left.elapsed();
    check_chat(&a.resp, SHORT_TOKENS);

    gate.assert_idle().await;
    llama.assert_idle().await;
    // A cancelled generation counts the tokens it made; had llama-server finished the abandoned answer,
    // this would be `tokens` more.
    let predicted = llama
        .metrics()
        .await
        .value("llamacpp:tokens_predicted_total", &[])
        .expect("llamacpp:tokens_predicted_total");
    assert!(
        predicted < (tokens + SHORT_TOKENS) as f64,
        "llama-server predicted {predicted} tokens: it kept generating for the client that left"
    );
    // Loose: llama-server stops within tens of milliseconds once slotgate closes the connection.
    assert!(
        waited < Duration::from_secs(5),
        "the queued request was answered {waited:?} after the streaming client left ({predicted} tokens \
         predicted in all)"
    );
    gate.wait_outcome("client_gone", 1).await;
    gate.wait_outcome("ok", 1).await;
}

/// llama-server closes the connection right after every streamed answer, although its response said
/// `Keep-Alive: timeout=5, max=100`. A queued request is forwarded the moment the stream ahead of it
/// ends, so it must not be sent on the connection being closed under it (that race surfaces as a 502
/// "connection closed before message completed" for a request llama-server never saw).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_queued_behind_streams_are_forwarded_although_llama_server_closes_those_connections(
) {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate) = llama_and_gate().await;

    // Three clients, each sending short streams back to back: one generates while the others wait,
    // so every stream's end hands the slot straight to a queued request. One slot plus three queue
    // places hold all three clients, so nobody is ever turned away.
    const CLIENTS: usize = 3;
    const STREAMS_EACH: usize = 20;
    let clients = (0..CLIENTS).map(|c| {
        let client = gate.client();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for n in 0..STREAMS_EACH {
                answers
                    .push(send(client.clone(), c * 100 + n, CHAT, chat(SHORT_TOKENS, true)).await);
            }
            answers
        })
    });
    let answers: Vec<Answer> = join_all(clients.collect())
        .await
        .into_iter()
        .flatten()
        .collect();

    let failed: Vec<String> = answers
        .iter()
        .filter(|a| a.resp.status != 200)
        .map(|a| format!("{} {}", a.resp.status, a.resp.body))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} streams handed a slot after another stream failed: {failed:#?}",
        failed.len(),
        answers.len()
    );
    for a in &answers {
        check_chat_stream(&a.resp, a.sse.as_ref().expect("streamed"), SHORT_TOKENS);
    }
    assert_all_served(&gate, &llama, (CLIENTS * STREAMS_EACH) as u64).await;
}
