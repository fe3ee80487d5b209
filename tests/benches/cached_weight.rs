//! An agent and a chat client sharing one llama-server slot, measured under each
//! `--cached-token-weight` (docs/spend.md#cached-tokens-in-fair-scheduling-and-token-quotas): Claude
//! Code, headless, runs one task after another (5-9k-token prompts whose prefix llama-server serves
//! from its prompt cache: run without its attribution header, as operators of local models do) while a chat client keeps two short streamed questions going, for the
//! same time under each weight. Printed per weight: each one's share of the slot's time (the sum of
//! its requests' upstream time), its requests, the cached share of its prompt tokens, its wait for
//! the slot, and the chat's time to first token as the client saw it. Not a test: it prints figures
//! and asserts nothing about time (every request must still be answered).
//!
//! Run with `bash scripts/bench/cached-weight.sh` (release binary), or by hand:
//! `SLOTGATE_BIN=target/release/slotgate cargo bench -p slotgate-tests --bench cached_weight`.
//! `CW_SECONDS` sets each phase's length (default 60), `CW_WEIGHTS` the weights (default `1,0.1,0`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use slotgate_tests::agents::{Agent, Stage};
use slotgate_tests::client::Client;
use slotgate_tests::*;

const AGENT_KEY: &str = "sk-bench-agent";
const CHAT_KEY: &str = "sk-bench-chat";

fn main() {
    bench_main(run());
}

async fn run() {
    let seconds: u64 = std::env::var("CW_SECONDS")
        .ok()
        .map(|v| v.parse().expect("CW_SECONDS is a number of seconds"))
        .unwrap_or(60);
    let weights: Vec<String> = std::env::var("CW_WEIGHTS")
        .unwrap_or_else(|_| "1,0.1,0".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    println!(
        "Claude Code and a chat client (2 streams, 32 tokens each) on one llama-server slot, {seconds} s per weight"
    );
    println!(
        "{:>6} | {:>11} {:>8} {:>7} {:>13} | {:>11} {:>8} {:>13} {:>15}",
        "weight",
        "agent slot%",
        "requests",
        "cached%",
        "wait p50/p95",
        "chat slot%",
        "requests",
        "wait p50/p95",
        "TTFT p50/p95 ms"
    );
    for w in &weights {
        let row = phase(w, Duration::from_secs(seconds)).await;
        println!("{row}");
    }
}

/// What the access log says of one client's requests.
#[derive(Default)]
struct Side {
    requests: usize,
    upstream_ms: u64,
    prompt: u64,
    cached: u64,
    waits: Vec<u64>,
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

async fn phase(weight: &str, length: Duration) -> String {
    let stage = Stage::start(1, Gate::new().opt("--cached-token-weight", weight)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + length;

    let agent = {
        let target = stage.through(AGENT_KEY).cacheable();
        tokio::spawn(async move {
            let mut runs = 0;
            while Instant::now() < until {
                Agent::ClaudeCode.run(&target).await.assert_answered();
                runs += 1;
            }
            runs
        })
    };
    let ttfts = Arc::new(Mutex::new(Vec::new()));
    let addr: std::net::SocketAddr = stage.base.trim_start_matches("http://").parse().unwrap();
    let mut chats = Vec::new();
    for stream in 0..2 {
        let (stop, ttfts) = (stop.clone(), ttfts.clone());
        chats.push(tokio::spawn(async move {
            let client = Client::tcp(addr).with_bearer(CHAT_KEY);
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                n += 1;
                let body = json!({
                    "messages": [{"role": "user", "content": format!("Question {stream}-{n}: what is {n} times {stream}? Answer briefly.")}],
                    "max_tokens": 32, "stream": true,
                });
                let sent = Instant::now();
                let mut s = client
                    .stream_with_headers("/v1/chat/completions", &body, &[])
                    .await;
                assert_eq!(s.status, 200, "chat refused");
                s.first_event(Duration::from_secs(120)).await;
                ttfts
                    .lock()
                    .unwrap()
                    .push(sent.elapsed().as_millis() as u64);
                let read = s.read_sse(Duration::from_secs(120)).await;
                assert!(read.complete(), "chat stream cut short");
            }
        }));
    }
    let runs = agent.await.expect("agent loop");
    stop.store(true, Ordering::Relaxed);
    for c in chats {
        c.await.expect("chat loop");
    }
    stage.assert_idle().await;

    let (mut a, mut c) = (Side::default(), Side::default());
    for line in stage.gate.stderr_text().lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["target"] != "slotgate::access" || v["status"] != 200 {
            continue;
        }
        let side = match v["path"].as_str() {
            Some("/v1/chat/completions") => &mut c,
            Some("/v1/messages") => &mut a,
            _ => continue,
        };
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        side.requests += 1;
        side.upstream_ms += n("upstream_ms");
        side.prompt += n("prompt_tokens");
        side.cached += n("cached_tokens");
        side.waits.push(n("queue_wait_ms"));
    }
    let busy = (a.upstream_ms + c.upstream_ms).max(1) as f64;
    let mut t = ttfts.lock().unwrap().clone();
    format!(
        "{weight:>6} | {:>10.0}% {:>8} {:>6.0}% {:>6}/{:<6} | {:>10.0}% {:>8} {:>6}/{:<6} {:>7}/{:<7}  ({runs} agent runs)",
        100.0 * a.upstream_ms as f64 / busy,
        a.requests,
        100.0 * a.cached as f64 / a.prompt.max(1) as f64,
        pct(&mut a.waits, 0.5),
        pct(&mut a.waits, 0.95),
        100.0 * c.upstream_ms as f64 / busy,
        c.requests,
        pct(&mut c.waits, 0.5),
        pct(&mut c.waits, 0.95),
        pct(&mut t, 0.5),
        pct(&mut t, 0.95),
    )
}
