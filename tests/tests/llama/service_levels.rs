//! Service levels on the real llama-server (docs/scheduling.md#deadlines): requests that say how
//! long their answer is worth waiting for (`X-Slotgate-Deadline-Ms`) on a busy slot, overload bands,
//! and sheddable work yielding its slot, on one slot and on llama-server's own defaults.

use std::time::Duration;

use slotgate_tests::client::{raw_post, raw_responses};
use slotgate_tests::llama::{chat, chat_usage, serial, LlamaServer, PROMPT};
use slotgate_tests::*;

const DEADLINE: &str = "x-slotgate-deadline-ms";

/// One slot held, then a burst of requests at one priority, alternating 60 s and 2 s deadlines:
/// each 2 s one starts within its 2 s (served before the 60 s ones that came before it), or is
/// refused at arrival when it cannot make it, or leaves at its deadline; none waits past it, and
/// every 60 s one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn short_deadlines_go_first_or_are_refused_and_none_waits_past_its_deadline() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let n = llama
        .tokens_for(Duration::from_millis(400), (20, 1800))
        .await;
    let gate = Gate::one_slot(16)
        .queue_timeout("60s")
        .start_before(&llama)
        .await;
    // Measured first, so that the estimate behind each refusal at arrival is the real one.
    for _ in 0..3 {
        chat_usage(
            &gate.client().post_json(CHAT, &chat(PROMPT, n, false)).await,
            n,
        );
    }
    let hold = spawn_post(
        &gate.client(),
        CHAT,
        &Req::from_json(chat(PROMPT, n, false)),
    );
    gate.wait_busy(1).await;
    let burst: Vec<(u64, _)> = (0..8)
        .map(|i| {
            let deadline = if i % 2 == 0 { 60_000 } else { 2_000 };
            let req =
                Req::from_json(chat(PROMPT, n, false)).header(DEADLINE, &deadline.to_string());
            (deadline, spawn_post(&gate.client(), CHAT, &req))
        })
        .collect();
    let (held, _) = hold.await.unwrap();
    chat_usage(&held, n);
    let (mut short_waits, mut long_waits, mut short_served) = (Vec::new(), Vec::new(), 0);
    for (deadline, task) in burst {
        let (resp, took) = task.await.unwrap();
        match (deadline, resp.status.as_u16()) {
            (60_000, _) => {
                chat_usage(&resp, n);
                long_waits.push(queue_wait_ms(&resp));
            }
            (_, 200) => {
                chat_usage(&resp, n);
                let waited = queue_wait_ms(&resp);
                assert!(waited <= 2_000, "started {waited} ms after arrival");
                short_waits.push(waited);
                short_served += 1;
            }
            (_, 429) => {
                assert_error(&resp, 429, "deadline_unreachable");
                assert!(took < Duration::from_millis(500), "refused after {took:?}");
            }
            (_, 504) => {
                assert_error(&resp, 504, "deadline_exceeded");
                assert!(
                    took >= Duration::from_millis(1_900) && took < Duration::from_millis(2_600),
                    "left the queue after {took:?}, its deadline 2 s"
                );
            }
            (_, other) => panic!("{other}: {}", resp.body),
        }
    }
    eprintln!("short waits {short_waits:?}, long waits {long_waits:?}");
    assert!(
        short_served >= 2,
        "only {short_served} short-deadline requests were served"
    );
    // Each short one started before every long one: they came interleaved, one priority.
    let (short_last, long_first) = (
        short_waits.iter().max().unwrap(),
        long_waits.iter().min().unwrap(),
    );
    assert!(
        short_last < long_first,
        "short {short_waits:?} vs long {long_waits:?}"
    );
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// A flood of background work (priority 10, a band holding at most half the queue) on one real
/// slot: the flood gets its places and 429 `band_queue_full` beyond them, and interactive requests
/// sent meanwhile still find a place and start within one service time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_background_flood_within_its_band_leaves_room_for_interactive_work() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let n = llama
        .tokens_for(Duration::from_millis(400), (20, 1800))
        .await;
    let config = unique_dir("bands").join("slotgate.toml");
    std::fs::write(
        &config,
        "[bands.background]\npriorities = [10, 1000]\nqueue = 0.5\n",
    )
    .unwrap();
    let gate = Gate::one_slot(8)
        .queue_timeout("60s")
        .trust_client_priority()
        .config_file(&config)
        .start_before(&llama)
        .await;
    let service = {
        let t0 = std::time::Instant::now();
        chat_usage(
            &gate.client().post_json(CHAT, &chat(PROMPT, n, false)).await,
            n,
        );
        t0.elapsed()
    };
    let mut background = chat(PROMPT, n, false);
    background["priority"] = 10.into();
    let flood: Vec<_> = (0..12)
        .map(|_| spawn_post(&gate.client(), CHAT, &Req::from_json(background.clone())))
        .collect();
    let s = gate
        .wait_status(
            Duration::from_secs(5),
            "the band's four places taken",
            |s| s["bands"][0]["waiting"] == 4,
        )
        .await;
    assert_eq!(s["bands"][0]["queue_limit"], 4, "{s}");
    // The live view names each waiter's band, and the metrics each band's share.
    let live = gate.admin_get("/live").await.json();
    let waiters = live["queue"]["waiters"].as_array().unwrap().clone();
    assert_eq!(waiters.len(), 4, "{live}");
    assert!(waiters.iter().all(|w| w["band"] == "background"), "{live}");
    assert_eq!(
        gate.metric("slotgate_band_queue_depth", &[("band", "background")])
            .await,
        Some(4.0)
    );
    // Three interactive requests, one after another, while the flood is still queued.
    for _ in 0..3 {
        let resp = gate.client().post_json(CHAT, &chat(PROMPT, n, false)).await;
        chat_usage(&resp, n);
        let waited = Duration::from_millis(queue_wait_ms(&resp));
        assert!(
            waited <= service + service / 2,
            "waited {waited:?}, one answer takes {service:?}"
        );
    }
    let (mut served, mut refused) = (0, 0);
    for (resp, _) in join_all(flood).await {
        match resp.status.as_u16() {
            200 => served += 1,
            429 => {
                assert_error(&resp, 429, "band_queue_full");
                refused += 1;
            }
            other => panic!("{other}: {}", resp.body),
        }
    }
    // One in service and four waiting at the flood's peak; the rest refused at arrival.
    assert_eq!((served, refused), (5, 7));
    let s = gate.status().await;
    assert_eq!(s["bands"][0]["refused"], 7, "{s}");
    assert_eq!(
        gate.metric("slotgate_band_refused_total", &[("band", "background")])
            .await,
        Some(7.0)
    );
    gate.wait_outcome("band_queue_full", 7).await;
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// One slot of the 16k-token tiny model: long enough for generations of several seconds.
async fn one_long_slot() -> slotgate_tests::llama::RunningLlama {
    LlamaServer::start_long(1, LONG_CTX as usize).await
}

const LONG_CTX: u64 = 16_384;

/// A one-slot llama-server behind slotgate with `--sheddable-priority 10`, priorities from the body.
async fn shedding_gate(llama: &slotgate_tests::llama::RunningLlama) -> RunningGate {
    Gate::one_slot(4)
        .queue_timeout("60s")
        .trust_client_priority()
        .opt("--sheddable-priority", 10)
        .start_before(llama)
        .await
}

fn at_priority(mut body: serde_json::Value, priority: i64) -> serde_json::Value {
    body["priority"] = priority.into();
    body
}

/// One slot held by a long background stream (priority 10, sheddable); an interactive request
/// arrives: it gets the slot within a token or so plus slotgate's overhead instead of after the
/// whole generation, the background stream ends with the documented error event (code `shed`,
/// when to retry) and then the abort, llama-server stops generating it, and it is counted `shed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_urgent_request_takes_the_slot_of_a_sheddable_stream() {
    let _one = serial().await;
    let llama = one_long_slot().await;
    let long = llama
        .tokens_for(Duration::from_secs(10), (200, LONG_CTX - 100))
        .await;
    let gate = shedding_gate(&llama).await;
    let mut stream = gate
        .client()
        .stream(CHAT, &at_priority(chat(PROMPT, long, true), 10))
        .await;
    assert_eq!(stream.status, 200);
    stream.first_event(Duration::from_secs(10)).await;
    let s = gate.status().await;
    assert_eq!(s["shedding"]["sheddable_in_service"], 1, "{s}");
    let reader = tokio::spawn(stream.read_sse(Duration::from_secs(60)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = std::time::Instant::now();
    let urgent = gate
        .client()
        .post_json(CHAT, &at_priority(chat(PROMPT, 8, false), 0))
        .await;
    let took = t0.elapsed();
    chat_usage(&urgent, 8);
    let waited = queue_wait_ms(&urgent);
    let shed = reader.await.unwrap();
    eprintln!(
        "urgent: waited {waited} ms for the slot, answered in {took:?}; the shed stream sent {} events",
        shed.data.len()
    );
    // The whole generation is about 10 s; the slot came within a token's time and the grace.
    assert!(
        waited < 1_000,
        "the urgent request waited {waited} ms for the slot"
    );
    let last = shed.data.last().expect("events before the error");
    let event: serde_json::Value = serde_json::from_str(last).unwrap();
    let tail = &shed.raw[shed.raw.len().saturating_sub(600)..];
    assert_eq!(event["error"]["code"], "shed", "...{tail}");
    assert_eq!(event["error"]["type"], "server_error", "{last}");
    assert!(
        event["error"]["retry_after_ms"].as_u64().unwrap() >= 1,
        "{last}"
    );
    assert!(!shed.done, "no [DONE] after a shed: {}", shed.raw);
    assert!(
        shed.error.is_some(),
        "the stream is aborted after its error event"
    );
    // llama-server stopped generating it (long before its 20 s were up).
    llama.assert_idle().await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "llama-server went on for {:?}",
        t0.elapsed()
    );
    gate.wait_outcome("shed", 1).await;
    gate.wait_metric("slotgate_shed_total", &[("stage", "after_first_byte")], 1.0)
        .await;
    let s = gate.status().await;
    assert_eq!(s["shedding"]["shed_after_first_byte"], 1, "{s}");
    assert_eq!(s["shedding"]["sheddable_priority"], 10, "{s}");
    gate.assert_idle().await;
    let s = gate.status().await;
    assert_eq!(
        (
            s["shedding"]["sheddable_in_service"].clone(),
            s["shedding"]["yielding"].clone()
        ),
        (0.into(), 0.into()),
        "{s}"
    );
}

/// A sheddable request whose answer has not begun (not streamed: llama-server answers at the end)
/// is shed for an urgent one, goes back to the queue, and is served once the urgent one is done:
/// its client gets one whole answer, nothing twice, and the access log says it was shed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_shed_before_its_first_byte_is_served_later_once() {
    let _one = serial().await;
    let llama = one_long_slot().await;
    let n = llama
        .tokens_for(Duration::from_secs(3), (100, LONG_CTX - 100))
        .await;
    let gate = shedding_gate(&llama).await;
    let body = at_priority(chat(PROMPT, n, false), 10).to_string();
    let raw = raw_post(CHAT, &body, &["Connection: close"]);
    let client = gate.client();
    let background =
        tokio::spawn(async move { client.raw_exchange(&raw, Duration::from_secs(60)).await });
    gate.wait_busy(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = std::time::Instant::now();
    let urgent = gate
        .client()
        .post_json(CHAT, &at_priority(chat(PROMPT, 8, false), 0))
        .await;
    chat_usage(&urgent, 8);
    eprintln!(
        "urgent: waited {} ms for the slot of a whole answer not yet begun, answered in {:?}",
        queue_wait_ms(&urgent),
        t0.elapsed()
    );
    assert!(
        queue_wait_ms(&urgent) < 2_000,
        "urgent waited {} ms",
        queue_wait_ms(&urgent)
    );
    let (bytes, _) = background.await.unwrap().expect("the connection closed");
    let responses = raw_responses(&bytes);
    assert_eq!(
        responses.len(),
        1,
        "one answer: {}",
        String::from_utf8_lossy(&bytes)
    );
    let r = &responses[0];
    assert_eq!(r.status, 200, "{}", r.text());
    let answer: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], n, "{answer}");
    assert_eq!(answer["choices"].as_array().unwrap().len(), 1, "{answer}");
    let s = gate.status().await;
    assert_eq!(s["shedding"]["shed_before_first_byte"], 1, "{s}");
    assert_eq!(s["shedding"]["shed_after_first_byte"], 0, "{s}");
    gate.wait_metric(
        "slotgate_shed_total",
        &[("stage", "before_first_byte")],
        1.0,
    )
    .await;
    let line = eventually(Duration::from_secs(5), "the access line", || async {
        gate.stderr_text()
            .lines()
            .find(|l| l.contains("slotgate::access") && l.contains("priority=10"))
            .map(str::to_owned)
    })
    .await;
    assert!(line.contains(" shed=1"), "{line}");
    assert!(line.contains("outcome=ok"), "{line}");
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// What the real SDKs from PyPI make of a shed stream: the OpenAI SDK raises `APIError` with the
/// `shed` error as its body, the Anthropic SDK an `APIStatusError` with an `overloaded_error`; both
/// carry when to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sdks_raise_the_documented_error_for_a_shed_stream() {
    use slotgate_tests::python::{arg, driver, python};
    python();
    let _one = serial().await;
    let llama = one_long_slot().await;
    let port = slotgate_tests::gate::free_port();
    let gate = Gate::one_slot(4)
        .queue_timeout("60s")
        .trust_client_priority()
        .opt("--sheddable-priority", 10)
        .listen(format!("tcp:127.0.0.1:{port}"))
        .start_before(&llama)
        .await;
    for api in ["openai", "anthropic"] {
        let args = vec![
            arg("--base-url"),
            arg(format!("http://127.0.0.1:{port}")),
            arg("--api"),
            arg(api),
            arg("--max-tokens"),
            arg(LONG_CTX - 200),
        ];
        let sdk =
            tokio::spawn(async move { driver::<serde_json::Value>("shed_stream.py", &args).await });
        // Its answer under way (not merely admitted): shed, it ends with the error event.
        eventually(Duration::from_secs(30), "the stream answering", || async {
            let live = gate.admin_get("/live").await.json();
            live["requests"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["phase"] == "answering" && r["priority"] == 10)
                .then_some(())
        })
        .await;
        let urgent = gate
            .client()
            .post_json(CHAT, &at_priority(chat(PROMPT, 8, false), 0))
            .await;
        chat_usage(&urgent, 8);
        let out = sdk.await.unwrap();
        eprintln!("{api}: {out}");
        match api {
            "openai" => {
                assert_eq!(out["ended"], "APIError", "{out}");
                assert_eq!(out["body"]["code"], "shed", "{out}");
                assert!(
                    out["body"]["retry_after_ms"].as_u64().unwrap() >= 1,
                    "{out}"
                );
            }
            _ => {
                assert_eq!(out["ended"], "APIStatusError", "{out}");
                assert_eq!(out["body"]["error"]["type"], "overloaded_error", "{out}");
                assert!(
                    out["body"]["error"]["retry_after_ms"].as_u64().unwrap() >= 1,
                    "{out}"
                );
            }
        }
        assert!(out["events"].as_u64().unwrap() >= 1, "{out}");
        gate.assert_idle().await;
        llama.assert_idle().await;
    }
    gate.wait_outcome("shed", 2).await;
}

/// llama-server as people run it, with its defaults (no `-np`: 4 slots over one shared KV pool)
/// and `--api-key`, behind slotgate with `--sheddable-priority 10` and the key for its own calls;
/// clients send the key. An urgent request sheds only what it needs, pool tokens or slots:
///
/// 1. Two long background streams reserve most of the pool; an urgent request needs more of it
///    than is left (two slots are free): one stream is shed, the other goes on to `[DONE]`.
/// 2. Four background streams hold every slot (the pool has room): an urgent request sheds one of
///    them, and the other three finish whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_llama_servers_defaults_with_a_key_only_what_the_urgent_request_needs_is_shed() {
    const POOL: u64 = 16_384;
    const KEY: &str = "sk-llama-secret";
    let _one = serial().await;
    let llama = LlamaServer::start_default(POOL as usize, &["--api-key", KEY]).await;
    let key_file = unique_dir("key").join("llama.key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    let gate = Gate::new()
        .queue_depth(8)
        .queue_timeout("60s")
        .trust_client_priority()
        .opt("--sheddable-priority", 10)
        .opt("--upstream-api-key-file", key_file.display())
        .start_before(&llama)
        .await;
    let s = gate
        .wait_status(Duration::from_secs(10), "the shared pool learnt", |s| {
            s["slots"]["total"] == 4 && s["kv_pool"]["shared"] == true
        })
        .await;
    assert_eq!(s["kv_pool"]["tokens"], POOL, "{s}");
    let bearer = format!("Bearer {KEY}");
    let auth = [("authorization", bearer.as_str())];

    // Streams of priority 10 (sheddable), each answering before the next phase goes on.
    let background = |n: usize, max_tokens: u64| {
        let (gate, auth) = (&gate, &auth);
        async move {
            let mut readers = Vec::new();
            for _ in 0..n {
                let body = at_priority(chat(PROMPT, max_tokens, true), 10);
                let mut stream = gate.client().stream_with_headers(CHAT, &body, auth).await;
                assert_eq!(stream.status, 200);
                stream.first_event(Duration::from_secs(10)).await;
                readers.push(tokio::spawn(stream.read_sse(Duration::from_secs(120))));
            }
            readers
        }
    };
    // How the streams ended: those shed (their last event the `shed` error, no `[DONE]`) and the
    // usage of those that finished.
    let ended = |reads: Vec<slotgate_tests::client::SseRead>| {
        let (mut shed, mut whole) = (0, Vec::new());
        for r in reads {
            if r.done {
                let usage = r
                    .data
                    .iter()
                    .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                    .find_map(|v| v["usage"]["completion_tokens"].as_u64());
                whole.push(usage.unwrap_or_else(|| panic!("no usage in {}", r.raw)));
                continue;
            }
            let last: serde_json::Value = serde_json::from_str(r.data.last().unwrap()).unwrap();
            assert_eq!(last["error"]["code"], "shed", "{last}");
            assert!(r.error.is_some(), "aborted after its error event");
            shed += 1;
        }
        (shed, whole)
    };

    // 1. The pool: two streams of 7,000 tokens reserve about 14,100 of 16,384.
    let long = 7_000;
    let readers = background(2, long).await;
    let s = gate.status().await;
    let free = POOL - s["kv_pool"]["reserved_tokens"].as_u64().unwrap();
    assert_eq!(s["slots"]["busy"], 2, "{s}");
    assert!(free < 4_000, "{s}");
    // Its reservation (prompt plus 500 more than is free) fits once one stream has gone.
    let urgent = gate
        .client()
        .post_json_with_headers(
            CHAT,
            &at_priority(chat(PROMPT, free + 500, false), 0),
            &auth,
        )
        .await;
    chat_usage(&urgent, free + 500);
    let waited = queue_wait_ms(&urgent);
    let reads = join_all(readers).await;
    let (shed, whole) = ended(reads);
    eprintln!("pool: urgent waited {waited} ms; {shed} shed, finished {whole:?}");
    assert_eq!(
        (shed, whole),
        (1, vec![long]),
        "one stream shed for the pool"
    );
    assert!(waited < 2_000, "the urgent request waited {waited} ms");
    gate.assert_idle().await;
    llama.assert_idle().await;

    // 2. The slots: four streams of a few seconds hold all four.
    let short = llama.tokens_for(Duration::from_secs(4), (200, 3_000)).await;
    let readers = background(4, short).await;
    let s = gate.status().await;
    assert_eq!(s["slots"]["busy"], 4, "{s}");
    assert_eq!(s["shedding"]["sheddable_in_service"], 4, "{s}");
    let urgent = gate
        .client()
        .post_json_with_headers(CHAT, &at_priority(chat(PROMPT, 8, false), 0), &auth)
        .await;
    chat_usage(&urgent, 8);
    let waited = queue_wait_ms(&urgent);
    let reads = join_all(readers).await;
    let (shed, whole) = ended(reads);
    eprintln!("slots: urgent waited {waited} ms; {shed} shed, finished {whole:?}");
    assert_eq!(
        (shed, whole),
        (1, vec![short; 3]),
        "one stream shed for a slot"
    );
    assert!(waited < 2_000, "the urgent request waited {waited} ms");

    gate.wait_outcome("shed", 2).await;
    let s = gate.status().await;
    assert_eq!(s["shedding"]["shed_after_first_byte"], 2, "{s}");
    assert_eq!(s["upstream"]["auth"]["refused"], false, "{s}");
    gate.assert_idle().await;
    assert_eq!(gate.status().await["kv_pool"]["reserved_tokens"], 0);
    llama.assert_idle().await;
}
