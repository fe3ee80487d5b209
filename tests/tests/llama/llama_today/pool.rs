//! llama-server's default configuration: no `-np`, 4 slots sharing one KV pool of `-c` tokens, each
//! slot reporting the whole pool as its context. Four requests that each fit alone but not together
//! make it fail all of them at once (500 "Context size has been exceeded"); slotgate learns the pool
//! from llama-server's command line and serves them in turn, the pool never exceeded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use slotgate_tests::llama::{chat, chat_usage, default_argv, LlamaServer};
use slotgate_tests::*;

use super::{assert_both_idle, gate_before, learned, serial};

/// The pool: `-c 8192`.
const POOL: u64 = 8192;
/// Tokens each request generates; with its prompt about 3,300, so two fit and four do not.
const ANSWER: u64 = 3000;

/// About 300 tokens of prompt.
fn prompt() -> String {
    "the lighthouse keeper kept the light burning ".repeat(40)
}

/// The four requests at once, sent by `client`: about 3,300 tokens each.
fn four(client: &Client) -> Vec<tokio::task::JoinHandle<(Response, Duration)>> {
    let body = Req::from_json(chat(&prompt(), ANSWER, false));
    (0..4).map(|_| spawn_post(client, CHAT, &body)).collect()
}

/// The KV cells llama-server's busy slots hold now, from `/slots`: each slot's cached tokens
/// (`n_prompt_tokens`, the prompt and what it generated so far).
fn cells_in_use(slots: &[Value]) -> u64 {
    slots
        .iter()
        .filter(|s| s["is_processing"] == true)
        .map(|s| s["n_prompt_tokens"].as_u64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_shared_pool_serves_in_turn_what_would_exhaust_it_at_once() {
    let _one = serial().await;
    let llama = LlamaServer::start_default(POOL as usize, &[]).await;
    let props = llama.get("/props").await.json();
    assert_eq!(props["total_slots"], 4, "llama-server's default: {props}");
    assert_eq!(
        props["default_generation_settings"]["n_ctx"], POOL,
        "each slot reports the pool"
    );

    // Straight to llama-server: together they overflow the pool, and it fails every one of them.
    let direct = Client::unix(llama.socket());
    let calls = four(&direct);
    let statuses: Vec<u16> = join_all(calls)
        .await
        .iter()
        .map(|(r, _)| r.status.as_u16())
        .collect();
    eprintln!("direct: {statuses:?}");
    assert!(
        statuses.contains(&500),
        "the scenario must overflow the pool: {statuses:?}"
    );
    llama.assert_idle().await;

    // Through slotgate, auto: the pool from llama-server's own command line.
    let (gate, _) = gate_before(&llama, Gate::new().queue_depth(8).queue_timeout("300s")).await;
    let s = learned(&gate).await;
    assert_eq!(s["kv_pool"]["shared"], true, "{s}");
    assert_eq!(s["kv_pool"]["tokens"], POOL, "{s}");
    assert!(
        s["kv_pool"]["source"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {}", llama.pid())),
        "{s}"
    );
    assert_eq!(s["slots"]["total"], 4, "{s}");

    // Watch llama-server's own slots while the four run.
    let peak = Arc::new(AtomicU64::new(0));
    let watching = {
        let (peak, socket) = (peak.clone(), llama.socket().to_owned());
        tokio::spawn(async move {
            let client = Client::unix(&socket);
            loop {
                if let Ok(r) = client.try_send(client::get_request("/slots")).await {
                    if let Value::Array(slots) = r.json() {
                        peak.fetch_max(cells_in_use(&slots), Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let calls = four(&gate.client());
    let s = gate.wait_queue_depth(2).await;
    assert_eq!(
        s["requests_in_service"], 2,
        "two fit the pool, two wait: {s}"
    );
    for (resp, took) in join_all(calls).await {
        chat_usage(&resp, ANSWER);
        eprintln!("served in {took:?}");
    }
    watching.abort();
    let peak = peak.load(Ordering::Relaxed);
    eprintln!("peak KV cells in use: {peak} of {POOL}");
    assert!(peak > 0 && peak <= POOL, "peak {peak}");
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero("slotgate_requests_total", &[("outcome", "upstream_5xx")]),
        0.0
    );
    assert_eq!(
        m.value_or_zero("slotgate_requests_total", &[("outcome", "ok")]),
        4.0
    );
    assert_both_idle(&gate, &llama).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_context_per_slot_is_learned_and_a_setting_that_differs_is_warned_about() {
    let _one = serial().await;
    // -np 2 without --kv-unified: a context of its own per slot.
    let llama = LlamaServer::start(2).await;
    let (gate, _) = gate_before(&llama, Gate::new()).await;
    let s = learned(&gate).await;
    assert_eq!(
        (s["kv_pool"]["shared"].as_bool(), &s["kv_pool"]["tokens"]),
        (Some(false), &Value::Null),
        "{s}"
    );
    assert!(
        s["kv_pool"]["source"].as_str().unwrap().contains("pid"),
        "{s}"
    );
    assert_eq!(s["kv_pool"]["mismatch"], Value::Null);
    drop(gate);

    // A shared pool given where llama-server has a context per slot: taken, and warned about.
    let (gate, _) = gate_before(&llama, Gate::new().opt("--kv-pool", 3000)).await;
    let s = learned(&gate).await;
    assert_eq!(s["kv_pool"]["tokens"], 3000, "{s}");
    let why = s["kv_pool"]["mismatch"].as_str().unwrap_or_default();
    assert!(
        why.contains("one pool of 3000 tokens") && why.contains("a context per slot"),
        "{s}"
    );
    assert!(gate
        .stderr_text()
        .contains("--kv-pool differs from llama-server's command line"));
    drop(gate);

    // slotgate wrap reads the child's own command line, its `-n` too (which `/props` does not
    // report): a request that sets no limit reserves its prompt and `-n`, not the whole pool.
    const N: u64 = 1500;
    let argv = default_argv(4096, &["-n", &N.to_string()]);
    let gate = Gate::new().wrapping(argv).start().await;
    let s = learned(&gate).await;
    assert_eq!(
        (
            s["kv_pool"]["tokens"].as_u64(),
            s["slots"]["total"].as_u64(),
            s["kv_pool"]["default_n_predict"].as_u64()
        ),
        (Some(4096), Some(4), Some(N)),
        "{s}"
    );
    assert_eq!(
        s["kv_pool"]["source"], "the command line slotgate wrap runs",
        "{s}"
    );
    let ok = gate
        .client()
        .post_json(
            CHAT,
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let unbounded = spawn_post(
        &gate.client(),
        CHAT,
        // No max_tokens: llama-server's -n bounds it. Random weights may sample end-of-text at
        // any step; `ignore_eos` keeps it to -n.
        &Req::from_json(
            json!({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": true}),
        ),
    );
    gate.wait_busy(1).await;
    let reserved = gate.status().await["kv_pool"]["reserved_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        reserved > N && reserved < N + 100,
        "a short prompt and -n {N}: {reserved} reserved"
    );
    let (resp, _) = unbounded.await.unwrap();
    chat_usage(&resp, N);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn told_the_slots_have_their_own_contexts_slotgate_lets_the_pool_overflow_and_says_so() {
    let _one = serial().await;
    let llama = LlamaServer::start_default(POOL as usize, &[]).await;
    // The wrong setting: slotgate admits by slots only, as before it knew the pool.
    let (gate, _) = gate_before(&llama, Gate::new().opt("--kv-pool", "per-slot")).await;
    let s = learned(&gate).await;
    assert!(
        s["kv_pool"]["mismatch"]
            .as_str()
            .unwrap_or_default()
            .contains("exhaust"),
        "{s}"
    );
    let calls = four(&gate.client());
    let statuses: Vec<u16> = join_all(calls)
        .await
        .iter()
        .map(|(r, _)| r.status.as_u16())
        .collect();
    eprintln!("through slotgate told per-slot: {statuses:?}");
    let failed = statuses.iter().filter(|s| **s == 500).count() as u64;
    assert!(failed > 0, "the pool overflowed: {statuses:?}");
    // Each failure is what it was: llama-server's 5xx, in the access log and the metrics.
    gate.wait_outcome("upstream_5xx", failed).await;
    gate.wait_outcome("ok", 4 - failed).await;
    let log = gate.stderr_text();
    let failures = log
        .lines()
        .filter(|l| l.contains("slotgate::access") && l.contains("outcome=upstream_5xx status=500"))
        .count() as u64;
    assert_eq!(failures, failed, "{log}");
    assert!(
        !log.lines().any(|l| l.contains("outcome=ok status=500")),
        "{log}"
    );
    assert_both_idle(&gate, &llama).await;
}
