//! Exact prompt cost against a real llama-server (`-np 1`, the tiny generated model): with
//! `--cost-count-first`, slotgate counts every prompt with llama-server's own template and tokenizer
//! before admission, and the count equals what llama-server then reports as the prompt's tokens, for
//! chat and completion requests; counting never takes the generation slot; a prompt that can never fit
//! a slot's context is refused with 400 before it queues or takes a slot. By default a request with a
//! free slot goes at once, uncounted, and a prompt that cannot fit gets the same 400, mapped from
//! llama-server's own refusal.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use slotgate_tests::llama::{u64_at, LlamaServer, RunningLlama, CTX_PER_SLOT};
use slotgate_tests::*;

const PROMPT_COUNTS: &str = "slotgate_prompt_counts_total";
const PROMPT_HEADER: &str = "x-slotgate-prompt-tokens";

/// A gate that counts every prompt first (`--cost-count-first`), so each answer says what was counted.
async fn gate_for(llama: &RunningLlama) -> RunningGate {
    Gate::new()
        .slots(1)
        .queue_depth(4)
        .arg("--cost-count-first")
        .start_before(llama)
        .await
}

/// Waits until slotgate has read the slot context from `/props`.
async fn wait_slot_context(gate: &RunningGate) {
    eventually(Duration::from_secs(10), "slotgate read /props", || async {
        gate.stderr_text()
            .contains("upstream slot context")
            .then_some(())
    })
    .await;
}

/// A chat prompt of far more tokens than a slot's context holds.
fn never_fits() -> Value {
    let words = "lighthouse keeper ".repeat(CTX_PER_SLOT);
    json!({"messages": [{"role": "user", "content": words}], "max_tokens": 4})
}

/// 400 in llama-server's own `exceed_context_size_error` shape, naming the slot's context size.
fn assert_refused_as_too_long(resp: &Response) {
    assert_context_refusal(resp, None, CTX_PER_SLOT as u64);
}

fn counted(resp: &Response) -> u64 {
    assert_eq!(resp.status, 200, "{}", resp.body);
    resp.header(PROMPT_HEADER)
        .unwrap_or_else(|| panic!("no {PROMPT_HEADER} header: exact count failed"))
        .parse()
        .expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_exact_count_is_what_llama_server_reports() {
    let _one = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    let gate = gate_for(&llama).await;
    let client = gate.client();
    let chats = [
        json!({"messages": [{"role": "user", "content": "Tell me about lighthouses."}]}),
        json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "naïve café — 日本語 ✓ and some <b>markup</b>"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "again, with numbers 12345 67890"}
        ]}),
    ];
    for body in &chats {
        let mut body = body.clone();
        body["max_tokens"] = 4.into();
        let resp = client.post_json(CHAT, &body).await;
        let exact = counted(&resp);
        let reported = u64_at(&resp.json(), "/usage/prompt_tokens");
        eprintln!("chat: slotgate counted {exact}, llama-server reported {reported}");
        assert_eq!(exact, reported, "chat prompt count");
    }
    for path in ["/completion", "/v1/completions"] {
        let body = json!({"prompt": "Once upon a time, in a café far away,", "max_tokens": 4, "n_predict": 4});
        let resp = client.post_json(path, &body).await;
        let exact = counted(&resp);
        let v = resp.json();
        let reported = v
            .pointer("/usage/prompt_tokens")
            .or_else(|| v.pointer("/tokens_evaluated"))
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("no prompt count in {v}"));
        eprintln!("{path}: slotgate counted {exact}, llama-server reported {reported}");
        assert_eq!(exact, reported, "{path} prompt count");
    }
    // The same chat again is counted from the cache, not by llama-server.
    let m = gate.metrics().await;
    let (upstream, cached) = (
        m.value_or_zero(PROMPT_COUNTS, &[("source", "upstream")]),
        m.value_or_zero(PROMPT_COUNTS, &[("source", "cache")]),
    );
    let mut again = chats[0].clone();
    again["max_tokens"] = 2.into();
    counted(&client.post_json(CHAT, &again).await);
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero(PROMPT_COUNTS, &[("source", "upstream")]),
        upstream
    );
    assert_eq!(
        m.value_or_zero(PROMPT_COUNTS, &[("source", "cache")]),
        cached + 1.0
    );
    assert!(
        m.has_samples("slotgate_cost_estimate_error_ratio"),
        "{}",
        m.text
    );
    gate.assert_idle().await;
    assert_eq!(llama.busy_slots().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counting_never_takes_the_generation_slot() {
    let _one = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    let gate = gate_for(&llama).await;
    // A long generation holds llama-server's only slot.
    let long = json!({"messages": [{"role": "user", "content": "Write at length."}],
                      "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let mut stream = gate.client().stream(CHAT, &long).await;
    stream.next_chunk().await;
    assert_eq!(llama.busy_slots().await, 1);
    // Meanwhile llama-server counts a prompt at once: template and tokenizer answer on its HTTP
    // threads, not in a slot.
    let direct = Client::unix(llama.socket());
    let t0 = Instant::now();
    let templated = direct
        .post_json(
            "/apply-template",
            &json!({"messages": [{"role": "user", "content": "hello"}]}),
        )
        .await;
    assert_eq!(templated.status, 200, "{}", templated.body);
    let tokens = direct
        .post_json(
            "/tokenize",
            &json!({"content": templated.json()["prompt"], "add_special": true}),
        )
        .await;
    assert_eq!(tokens.status, 200, "{}", tokens.body);
    let took = t0.elapsed();
    // Still generating: the slot is busy with the first request, and nothing else took one.
    assert_eq!(
        llama.busy_slots().await,
        1,
        "the generation must still be running beside the counting"
    );
    eprintln!("counted during a generation in {took:?}");
    // And through slotgate: a second request is counted exactly while the first still generates.
    let before = gate
        .metric(PROMPT_COUNTS, &[("source", "upstream")])
        .await
        .unwrap_or(0.0);
    let queued = gate
        .enqueue(
            &Req::chat("second")
                .set(
                    "messages",
                    json!([{"role": "user", "content": "a different prompt"}]),
                )
                .set("max_tokens", 2),
        )
        .await;
    assert_eq!(
        gate.metric(PROMPT_COUNTS, &[("source", "upstream")]).await,
        Some(before + 1.0),
        "the queued request was counted by llama-server while the slot was busy"
    );
    assert_eq!(llama.load().await.requests_deferred, 0.0);
    drop(stream);
    let (resp, _) = queued.await.expect("queued request");
    counted(&resp);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prompt_that_can_never_fit_is_refused_without_a_slot() {
    let _one = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    let gate = gate_for(&llama).await;
    wait_slot_context(&gate).await;
    let before = llama.metrics().await;
    let t0 = Instant::now();
    let resp = gate.client().post_json(CHAT, &never_fits()).await;
    assert_refused_as_too_long(&resp);
    eprintln!("refused in {:?}: {}", t0.elapsed(), resp.body);
    gate.wait_outcome("bad_request", 1).await;
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero("slotgate_queue_wait_seconds_count", &[]),
        0.0,
        "never queued for a slot: {}",
        m.text
    );
    let after = llama.metrics().await;
    for name in [
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
    ] {
        assert_eq!(
            after.value_or_zero(name, &[]),
            before.value_or_zero(name, &[]),
            "llama-server never processed it ({name})"
        );
    }
    // A prompt that fits is still served.
    let ok = json!({"messages": [{"role": "user", "content": "short"}], "max_tokens": 2});
    counted(&gate.client().post_json(CHAT, &ok).await);
    gate.assert_idle().await;
}

/// A stream is charged its real tokens whether or not its client asked for usage: slotgate always
/// asks llama-server for it (`stream_options.include_usage`) and takes the usage chunk out of the
/// stream of a client that did not ask, moving its `timings` onto the finishing chunk. The
/// reservation is refunded down to exactly what was used.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn by_default_a_free_slot_forwards_at_once_and_llama_servers_own_refusal_passes_unchanged() {
    let _one = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    let gate = Gate::new()
        .slots(1)
        .queue_depth(4)
        .start_before(&llama)
        .await;
    wait_slot_context(&gate).await;
    let ok = json!({"messages": [{"role": "user", "content": "Tell me about lighthouses."}], "max_tokens": 4});
    let resp = gate.client().post_json(CHAT, &ok).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header(PROMPT_HEADER), None, "went uncounted");
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero(PROMPT_COUNTS, &[("source", "forwarded")]),
        1.0
    );
    assert_eq!(
        m.value_or_zero(PROMPT_COUNTS, &[("source", "upstream")]),
        0.0
    );
    // Settled from llama-server's usage: the tenant is charged what llama-server reported.
    let used = u64_at(&resp.json(), "/usage/total_tokens") as f64;
    gate.wait_tokens("completion", 4.0).await;
    let charged: f64 = gate
        .metrics()
        .await
        .sum("slotgate_tenant_tokens_total", &[]);
    assert_eq!(charged, used);

    // With the slot free: llama-server refuses it, and its own answer reaches the client
    // unchanged, the same shape slotgate answers in when it counted first.
    let resp = gate.client().post_json(CHAT, &never_fits()).await;
    assert_refused_as_too_long(&resp);
    eprintln!("llama-server's own: {}", resp.body);
    gate.wait_outcome("upstream_4xx", 1).await;
    gate.assert_idle().await;
    assert_eq!(llama.busy_slots().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_is_charged_its_real_tokens_with_or_without_usage() {
    const ANSWER: u64 = 24;
    let _one = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    let gate = gate_for(&llama).await;
    wait_slot_context(&gate).await;
    for include_usage in [false, true] {
        let mut body = json!({"messages": [{"role": "user", "content": "Count to ten."}],
                              "max_tokens": ANSWER, "ignore_eos": true, "stream": true});
        if include_usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let m = gate.metrics().await;
        let tokens =
            |m: &Metrics, kind: &str| m.value_or_zero("slotgate_tokens_total", &[("kind", kind)]);
        let (prompt0, completion0) = (tokens(&m, "prompt"), tokens(&m, "completion"));
        let (reserved0, refunded0) = (
            m.value_or_zero("slotgate_tokens_reserved_total", &[]),
            m.value_or_zero("slotgate_tokens_refunded_total", &[]),
        );
        let stream = gate.client().stream(CHAT, &body).await;
        let exact: f64 = stream
            .header(PROMPT_HEADER)
            .expect("counted")
            .parse()
            .unwrap();
        let sse = stream.read_sse(Duration::from_secs(30)).await;
        assert!(sse.complete(), "{sse:?}");
        // slotgate asks llama-server for usage either way; a client that did not ask never sees the
        // usage chunk, and still gets llama-server's `timings` on its last chunk.
        assert_eq!(
            sse.raw.contains("\"usage\""),
            include_usage,
            "the client sees usage only when it asked: {}",
            sse.raw
        );
        assert!(sse.raw.contains("\"timings\""), "timings kept: {}", sse.raw);
        assert!(
            include_usage || !sse.raw.contains("\"choices\":[]"),
            "no empty-choices chunk the client did not ask for: {}",
            sse.raw
        );
        gate.assert_idle().await;
        let m = gate.metrics().await;
        assert_eq!(
            tokens(&m, "completion") - completion0,
            ANSWER as f64,
            "include_usage {include_usage}"
        );
        assert_eq!(
            tokens(&m, "prompt") - prompt0,
            exact,
            "include_usage {include_usage}"
        );
        let reserved = m.value_or_zero("slotgate_tokens_reserved_total", &[]) - reserved0;
        let refunded = m.value_or_zero("slotgate_tokens_refunded_total", &[]) - refunded0;
        assert_eq!(
            reserved,
            exact + ANSWER as f64,
            "prompt + max_tokens reserved"
        );
        assert_eq!(refunded, 0.0, "everything reserved was used");
        eprintln!("stream (include_usage {include_usage}): charged {} prompt + {ANSWER} completion tokens", exact);
    }
}
