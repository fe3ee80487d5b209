//! Fault matrix, upstream rows (issue 8 item 4): llama-server killed mid-stream and restarted on its
//! socket path, stopped (SIGSTOP) before its first byte and mid-stream, its socket file removed, a storm
//! of 500s and 503s, and a tokenizer too slow to wait for. Every row ends the same way: each request got
//! exactly one response, slotgate's queue, slots and in-flight count are back to 0 and its file
//! descriptors to baseline, nothing was forwarded twice, and llama-server never ran more than
//! `--slots` at once.
//!
//! The real llama-server rows run one at a time: two CPU-bound servers sharing the cores would skew
//! each other's timing, and a restart's model load would be slower still.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use slotgate_tests::client::get_request as get;
use slotgate_tests::fake_upstream::{Scripted, BUSY_MESSAGE, SERVER_ERROR_MESSAGE};
use slotgate_tests::llama::{
    self, chat_usage, Frozen, LlamaSample, LlamaServer, RunningLlama, PROMPT,
};
use slotgate_tests::*;
use tokio::task::JoinHandle;

/// Tokens of an answer that must still be streaming when the fault strikes: many seconds on 2 cores.
const LONG: u64 = 1500;
/// Tokens of an answer whose length does not matter.
const SHORT: u64 = 16;
/// Bound on any one answer from a healthy llama-server; only a hang reaches it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

fn chat(max_tokens: u64, stream: bool) -> Value {
    llama::chat(PROMPT, max_tokens, stream)
}

/// One look at both sides while a fault plays out.
#[derive(Debug)]
struct Sample {
    at_ms: u128,
    gate_busy: u64,
    gate_inflight: u64,
    /// `None` while llama-server cannot answer (stopped, killed, restarting).
    llama: Option<LlamaSample>,
}

/// A one-slot llama-server, `gate` before it, and a [`Sampler`] watching both.
async fn watched(gate: Gate) -> (RunningLlama, RunningGate, Sampler) {
    let llama = LlamaServer::start(1).await;
    let gate = gate.start_before(&llama).await;
    let sampler = Sampler::start(&gate, &llama);
    (llama, gate, sampler)
}

/// Samples slotgate's `/status` and llama-server's load every 25 ms in a task of its own, so it runs
/// through kills and restarts (it names llama-server by socket path, which a restart keeps).
struct Sampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(gate: &RunningGate, llama: &RunningLlama) -> Self {
        let admin = gate.admin().clone();
        let socket: PathBuf = llama.socket().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let t0 = Instant::now();
            let mut samples = Vec::new();
            while !stopped.load(Ordering::Acquire) {
                let (st, llama) = tokio::join!(
                    admin.try_send(get("/status")),
                    llama::try_sample(&socket, Duration::from_millis(300))
                );
                // Only when the test has already failed and is tearing slotgate down.
                let Ok(st) = st else { break };
                let st = st.json();
                samples.push(Sample {
                    at_ms: t0.elapsed().as_millis(),
                    gate_busy: st["slots"]["busy"].as_u64().expect("slots.busy"),
                    gate_inflight: st["inflight"].as_u64().expect("inflight"),
                    llama,
                });
                tokio::time::sleep(ms(25)).await;
            }
            samples
        });
        Self { stop, task }
    }

    /// Stops sampling and checks every sample: slotgate never had more than `slots` requests busy or in
    /// flight, and llama-server never processed more than `slots` nor held one back (deferred) itself.
    /// Also that some sample saw llama-server at work, or the checks prove nothing.
    async fn finish(self, slots: usize) {
        self.stop.store(true, Ordering::Release);
        let samples = self.task.await.expect("sampler task");
        print_timeline(&samples);
        for s in &samples {
            assert!(
                s.gate_busy <= slots as u64 && s.gate_inflight <= slots as u64,
                "slotgate over its {slots} slot(s): {s:?}"
            );
            if let Some(l) = &s.llama {
                assert!(
                    l.busy_slots <= slots && l.load.requests_processing <= slots as f64,
                    "llama-server ran more than {slots} at once: {s:?}"
                );
                assert_eq!(
                    l.load.requests_deferred, 0.0,
                    "llama-server held a request back: slotgate sent more than it had slots: {s:?}"
                );
            }
        }
        assert!(
            samples
                .iter()
                .any(|s| s.llama.is_some_and(|l| l.busy_slots > 0) || s.gate_busy > 0),
            // A llama-server busy with a stream may answer no probe in time: then slotgate's own
            // count shows the sampler ran while work was in flight.
            "the sampler never saw work in flight, so it proves nothing: {samples:?}"
        );
    }
}

/// The samples where something changed, for `--nocapture` runs and failure triage.
fn print_timeline(samples: &[Sample]) {
    let answered = samples.iter().filter(|s| s.llama.is_some()).count();
    eprintln!(
        "{} samples, {answered} with llama-server answering; those where something changed:",
        samples.len()
    );
    let mut last = None;
    for s in samples {
        let now = (s.gate_busy, s.gate_inflight, s.llama);
        if last != Some(now) {
            let llama = match s.llama {
                Some(l) => format!(
                    "busy {} processing {} deferred {}",
                    l.busy_slots, l.load.requests_processing, l.load.requests_deferred
                ),
                None => "no answer".into(),
            };
            eprintln!(
                "  {:>6} ms  slotgate busy {} inflight {} | llama-server {llama}",
                s.at_ms, s.gate_busy, s.gate_inflight
            );
            last = Some(now);
        }
    }
}

/// Sends `body` through the gate in a task and waits until it holds a slot.
async fn hold(gate: &RunningGate, body: Value) -> JoinHandle<Response> {
    let client = gate.client();
    let h = tokio::spawn(async move { client.post_json(CHAT, &body).await });
    gate.wait_status(Duration::from_secs(10), "slots.busy == 1", |s| {
        s["slots"]["busy"].as_u64() == Some(1)
    })
    .await;
    h
}

/// Sends `body` through the gate in a task and waits until the queue has grown by one.
async fn enqueue(gate: &RunningGate, body: Value) -> JoinHandle<Response> {
    let before = gate.status().await["queue"]["depth"]
        .as_u64()
        .expect("queue.depth");
    let client = gate.client();
    let h = tokio::spawn(async move { client.post_json(CHAT, &body).await });
    gate.wait_status(
        Duration::from_secs(10),
        &format!("queue.depth == {}", before + 1),
        |s| s["queue"]["depth"].as_u64() == Some(before + 1),
    )
    .await;
    h
}

/// `llamacpp:tokens_predicted_total`: tokens llama-server generated since it started.
async fn predicted(llama: &RunningLlama) -> f64 {
    let m = llama.metrics().await;
    m.value("llamacpp:tokens_predicted_total", &[])
        .unwrap_or_else(|| panic!("no llamacpp:tokens_predicted_total:\n{}", m.text))
}

/// The end of every real-llama row: slotgate and llama-server idle, fds back to baseline.
async fn assert_llama_settled(gate: &RunningGate, llama: &RunningLlama) {
    gate.assert_idle().await;
    gate.assert_fds_settled().await;
    llama.assert_idle().await;
}

/// Row 1: llama-server is SIGKILLed while it streams, with requests queued behind the stream, then
/// restarted on the same socket path. The stream is cut (never a clean end); the queued requests wait
/// through the restart within their queue timeout, then each is served once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_killed_mid_stream_and_restarted_serves_the_queue() {
    let _serial = slotgate_tests::llama::serial().await;
    // Generous: the restart loads the model again, on a busy machine.
    let (mut llama, gate, sampler) = watched(Gate::one_slot(4).queue_timeout("120s")).await;

    let mut stream = gate.client().stream(CHAT, &chat(LONG, true)).await;
    assert_eq!(stream.status, 200);
    stream.first_event(ANSWER_TIMEOUT).await;
    let queued = [
        enqueue(&gate, chat(SHORT, false)).await,
        enqueue(&gate, chat(SHORT, true)).await,
    ];

    llama.kill();
    let cut = stream.read_sse(Duration::from_secs(10)).await;
    assert!(
        !cut.done && !cut.complete(),
        "a stream whose llama-server was killed must not end with [DONE]: {cut:?}"
    );
    assert!(
        cut.error.is_some(),
        "the client must see the response fail, not a clean end: {cut:?}"
    );
    gate.wait_outcome("upstream_error", 1).await;

    // The queued requests wait for the restart (retried while nothing could reach llama-server).
    tokio::time::sleep(ms(500)).await;
    assert!(
        queued.iter().all(|h| !h.is_finished()),
        "a queued request was answered while llama-server was down"
    );
    let t0 = Instant::now();
    llama.restart().await;
    eprintln!("llama-server restarted in {:?}", t0.elapsed());

    let [first, second] = queued;
    let first = first.await.expect("first queued client");
    chat_usage(&first, SHORT);
    let second = second.await.expect("second queued client");
    assert_eq!(second.status, 200, "{}", second.body);
    let (data, done) = client::parse_sse(&second.body);
    assert!(done, "the queued stream must end cleanly: {}", second.body);
    assert!(!data.is_empty());

    sampler.finish(1).await;
    assert_llama_settled(&gate, &llama).await;
    gate.wait_outcome("ok", 2).await;
    // The restarted server generated both queued answers and nothing else: none was sent twice, and
    // the killed stream was not resent.
    assert_eq!(predicted(&llama).await, (2 * SHORT) as f64);
    assert!(
        gate.metric("slotgate_upstream_retries_total", &[])
            .await
            .unwrap_or(0.0)
            >= 1.0,
        "the queued request never retried: then it cannot have waited for the restart"
    );
}

/// Row 2: llama-server stopped (SIGSTOP) before a request arrives. The kernel accepts the connection,
/// nothing answers: after `--upstream-first-byte-timeout` the client gets 504 `upstream_timeout`. Once
/// llama-server runs again, the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_stopped_before_its_first_byte_gets_504_then_recovers() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate, sampler) =
        watched(Gate::one_slot(4).opt("--upstream-first-byte-timeout", "2s")).await;

    let frozen = llama.freeze();
    let t_sent = Instant::now();
    // Long: if llama-server ever runs it, it is still running when the next request arrives.
    let hung = hold(&gate, chat(LONG, false)).await;
    let t_forwarded = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(30), hung)
        .await
        .expect("the request to a stopped llama-server hangs")
        .expect("client task");
    let (since_forward, since_sent) = (t_forwarded.elapsed(), t_sent.elapsed());
    eprintln!("504 {since_forward:?} after forwarding, {since_sent:?} after sending");
    assert_error(&resp, 504, "upstream_timeout");
    // 2 s, plus slack for a busy machine; the count before admission asks the stopped server too.
    assert!(
        since_forward < Duration::from_secs(5),
        "cut {since_forward:?} after forwarding with a 2 s first-byte timeout"
    );
    gate.wait_outcome("upstream_timeout", 1).await;
    // The slot stays held while llama-server is stopped: it still holds the request, unread.
    assert_eq!(gate.status().await["slots"]["busy"].as_u64(), Some(1));

    thaw_and_serve_next(frozen, &gate, &llama, sampler).await;
}
/// Resumes a stopped llama-server and sends the next request at once, as a queued one would be:
/// it is served, and llama-server never held it back behind the one slotgate gave up on (it reads
/// that one from its socket only once it runs again).
async fn thaw_and_serve_next(
    frozen: Frozen,
    gate: &RunningGate,
    llama: &RunningLlama,
    sampler: Sampler,
) {
    frozen.thaw();
    let next = tokio::time::timeout(
        ANSWER_TIMEOUT,
        gate.client().post_json(CHAT, &chat(SHORT, false)),
    )
    .await
    .expect("the next request hangs");
    sampler.finish(1).await;
    chat_usage(&next, SHORT);
    assert_llama_settled(gate, llama).await;
    gate.wait_outcome("ok", 1).await;
}

/// Row 3: llama-server stopped while it streams. After `--upstream-idle-timeout` of silence the
/// client's stream is aborted (never a clean end) and the slot freed; once llama-server runs again,
/// the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_stopped_mid_stream_is_cut_by_the_idle_timeout_then_recovers() {
    let _serial = slotgate_tests::llama::serial().await;
    let (llama, gate, sampler) =
        watched(Gate::one_slot(4).opt("--upstream-idle-timeout", "4s")).await;

    let mut stream = gate.client().stream(CHAT, &chat(LONG, true)).await;
    assert_eq!(stream.status, 200);
    stream.first_event(ANSWER_TIMEOUT).await;
    let frozen = llama.freeze();
    let t0 = Instant::now();
    let cut = stream.read_sse(Duration::from_secs(30)).await;
    let took = t0.elapsed();
    eprintln!("stream cut {took:?} after the stop: error {:?}", cut.error);
    assert!(
        !cut.done,
        "a stream cut for silence must not end with [DONE]: {cut:?}"
    );
    assert!(
        cut.error.is_some(),
        "the client must see the stream fail: {cut:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "cut {took:?} after llama-server stopped, with a 4 s idle timeout"
    );
    gate.wait_outcome("upstream_timeout", 1).await;
    // The slot stays held while llama-server is stopped: it may still hold the abandoned request.
    assert_eq!(gate.status().await["slots"]["busy"].as_u64(), Some(1));

    thaw_and_serve_next(frozen, &gate, &llama, sampler).await;
}

/// Row 4: llama-server's socket file is removed while it runs (a careless cleanup, a tmpfiles rule).
/// No new connection can reach it: `/readyz` turns 503, and new requests are retried until their
/// deadline and get 503 `upstream_unavailable`; nothing hangs. Once llama-server is restarted on the
/// path, service resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_socket_removed_gives_503_until_restarted() {
    let _serial = slotgate_tests::llama::serial().await;
    let (mut llama, gate, sampler) = watched(Gate::one_slot(4).queue_timeout("2s")).await;

    std::fs::remove_file(llama.socket()).expect("remove llama-server's socket");
    let removed = Instant::now();

    // Asserted at the end, so the rest of the row runs either way. Waited for before the requests:
    // until readiness turns, a connection opened before the removal may still be in slotgate's pool.
    eventually(Duration::from_secs(120), "/readyz 503", || async {
        (gate.readyz().await == 503).then_some(())
    })
    .await;
    let unready_after = removed.elapsed();
    eprintln!("/readyz 503 {unready_after:?} after the socket was removed");

    for i in 0..2 {
        let t0 = Instant::now();
        let resp = tokio::time::timeout(
            Duration::from_secs(15),
            gate.client().post_json(CHAT, &chat(SHORT, false)),
        )
        .await
        .unwrap_or_else(|_| panic!("request {i} hangs with the socket gone"));
        let took = t0.elapsed();
        eprintln!("request {i}: {} after {took:?}", resp.status);
        assert_error(&resp, 503, "upstream_unavailable");
        retry_after(&resp);
        assert!(
            took < Duration::from_secs(6),
            "answered after {took:?} with a 2 s queue timeout"
        );
    }
    // slotgate's outcome label for upstream_unavailable.
    gate.wait_outcome("upstream_error", 2).await;
    gate.assert_idle().await;

    // The old process still listens on its unlinked socket: nothing can reach it, so replace it.
    llama.restart().await;
    eventually(Duration::from_secs(10), "/readyz 200", || async {
        (gate.readyz().await == 200).then_some(())
    })
    .await;
    // Long enough for the sampler to see llama-server at work.
    let resp = gate.client().post_json(CHAT, &chat(200, false)).await;
    chat_usage(&resp, 200);

    sampler.finish(1).await;
    assert_llama_settled(&gate, &llama).await;
    gate.wait_outcome("ok", 1).await;
    // The 503s were never forwarded: the restarted server generated the one answer after it only.
    assert_eq!(predicted(&llama).await, 200.0);
    // Readiness must say what new requests meet: no new connection reaches llama-server, so not
    // ready after a few health probes (100 ms apart, each bounded by the 2 s connect timeout + 1 s).
    assert!(
        unready_after < Duration::from_secs(5),
        "/readyz stayed 200 for {unready_after:?} after llama-server's socket was removed, while \
         no new connection could reach it: the health probe must not ride on a pooled keep-alive \
         connection"
    );
}

/// Row 5: a storm of 500s and 503s from the (fake) upstream. A 500 or a 503 that is not "Loading model"
/// may come from a server that started the work, so it reaches its client as is and is never resent;
/// only "Loading model" is retried. Every client gets exactly one answer, the upstream saw one attempt
/// per request plus one per "Loading model", and slotgate serves normally afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_500s_and_503s_is_passed_through_without_retry_amplification() {
    let _serial = slotgate_tests::llama::serial().await;
    use Scripted::{Busy, Loading, ServerError};
    let script = [
        ServerError,
        Busy,
        Loading,
        ServerError,
        ServerError,
        Busy,
        Loading,
        Busy,
        ServerError,
        Busy,
        ServerError,
        Loading,
    ];
    const CLIENTS: usize = 16;
    const SLOTS: usize = 2;
    let (up, gate) = Gate::new()
        .slots(SLOTS)
        .queue_depth(CLIENTS)
        .queue_timeout("30s")
        .start_with(FakeUpstream::errors(script).delay(ms(20)))
        .await;
    let client = gate.client();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| spawn_post(&client, CHAT, &Req::chat(&format!("c{i}"))))
        .collect();
    let answers = join_all(handles).await;

    let count = |s: Scripted| script.iter().filter(|&&x| x == s).count();
    let (mut ok, mut e500, mut e503) = (0, 0, 0);
    for (i, (resp, _)) in answers.iter().enumerate() {
        let tag = format!("c{i}");
        let v = resp.json();
        assert_eq!(
            v["fake_tag"], tag,
            "client {i} got someone else's answer: {}",
            resp.body
        );
        match resp.status.as_u16() {
            200 => ok += 1,
            500 => {
                assert_eq!(v["error"]["message"], SERVER_ERROR_MESSAGE, "{}", resp.body);
                e500 += 1;
            }
            503 => {
                // llama-server's own 503, not slotgate's upstream_unavailable.
                assert_eq!(v["error"]["message"], BUSY_MESSAGE, "{}", resp.body);
                e503 += 1;
            }
            other => panic!("client {i}: unexpected {other}: {}", resp.body),
        }
    }
    eprintln!("{ok} served, {e500} x 500, {e503} x 503 passed through");
    assert_eq!(e500, count(ServerError));
    assert_eq!(e503, count(Busy));
    assert_eq!(ok, CLIENTS - e500 - e503);
    // One attempt per request, plus exactly one retry per "Loading model".
    assert_eq!(up.rejected_while_loading(), count(Loading));
    assert_eq!(
        up.attempts(),
        CLIENTS + count(Loading),
        "retry amplification"
    );
    assert_eq!(up.count(), CLIENTS, "each request reached the fake once");
    gate.assert_settled(&up, SLOTS).await;

    // Still healthy, and serving normally.
    assert_eq!(gate.readyz().await, 200);
    for i in 0..4 {
        let resp = client.post_chat(&Req::chat(&format!("after{i}"))).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.assert_settled(&up, SLOTS).await;
}

/// Row 6: llama-server's `/tokenize` is too slow to wait for. A request that waits for a slot is counted
/// meanwhile, with a 1 s limit; past it the characters/4 estimate stands and the request waits on: every
/// request is served once the slot frees, none hangs on the tokenizer, and
/// `slotgate_prompt_counts_total{source="estimate"}` counts each that waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_tokenizer_falls_back_to_the_estimate_within_the_count_timeout() {
    let _serial = slotgate_tests::llama::serial().await;
    const CLIENTS: usize = 4;
    const DELAY: Duration = Duration::from_secs(30);
    let (up, gate) = Gate::one_slot(CLIENTS)
        .start_with(FakeUpstream::instant().tokenize_delay(DELAY))
        .await;
    let client = gate.client();
    // Holds the slot past the count's 1 s, so the others wait and are counted meanwhile.
    let holder = gate
        .hold_slot(&Req::chat("holder").delay(Duration::from_millis(1500)))
        .await;
    // Different prompts: none can be counted from the cache.
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let req = Req::chat(&format!("t{i}")).set(
                "messages",
                serde_json::json!([{"role": "user", "content": format!("prompt number {i}")}]),
            );
            spawn_post(&client, CHAT, &req)
        })
        .collect();
    let answers = join_all(handles).await;
    let (held, _) = holder.await.expect("holder");
    assert_eq!(held.status, 200, "{}", held.body);
    for (i, (resp, took)) in answers.iter().enumerate() {
        eprintln!("t{i}: {} after {took:?}", resp.status);
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert_eq!(resp.tag().as_deref(), Some(format!("t{i}").as_str()));
        assert_eq!(
            resp.header("x-slotgate-prompt-tokens"),
            None,
            "an exact count cannot have come from a tokenizer that never answered"
        );
        // The count waits its 1 s; the 30 s tokenizer must not be waited for.
        assert!(
            *took < Duration::from_secs(6),
            "t{i} answered after {took:?}: slotgate waited for the slow tokenizer"
        );
    }
    assert!(
        up.internal_seen()
            .iter()
            .any(|p| p == slotgate_tests::fake_upstream::CHAT_COUNT),
        "slotgate never asked to count, so this proves nothing: {:?}",
        up.internal_seen()
    );
    gate.wait_metric(
        "slotgate_prompt_counts_total",
        &[("source", "estimate")],
        CLIENTS as f64,
    )
    .await;
    let m = gate.metrics().await;
    m.assert_value(
        "slotgate_prompt_counts_total",
        &[("source", "upstream")],
        0.0,
    );
    // The holder went at once, uncounted.
    assert_eq!(
        m.value_or_zero("slotgate_prompt_counts_total", &[("source", "forwarded")]),
        1.0
    );
    gate.wait_outcome("ok", CLIENTS as u64 + 1).await;
    gate.assert_settled(&up, 1).await;
}
