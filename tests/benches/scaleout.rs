//! Scale-out (issue 36): two llama-server + slotgate pairs (one slot and one queue place each, the
//! real llama-server with the tiny model), loaded by bursts larger than one pair holds, two ways in
//! the same invocation:
//!
//! 1. **round-robin**: each client picks a pair in turn and keeps to it, retrying a refusal after
//!    the Retry-After it was told (a plain round-robin proxy, or a client list of base URLs);
//! 2. **LiteLLM least-busy**: every client through LiteLLM's proxy (the example config, its
//!    strategy `least-busy`), which spreads by the requests it has in flight and retries a refused
//!    attempt on the other pair; a client LiteLLM still answers 429 retries after what it was told.
//! 3. **SMG least_load**: every client through SMG (PyPI `smg`), whose `least_load` policy reads
//!    each pair's load from slotgate's `GET /v1/loads` every second; a client it answers 429
//!    retries after what it was told.
//!
//! For each: requests served per pair (slotgate's own count), p50 and p95 of a client's whole
//! wait (send to last byte, retries included), and each router's p95 over round-robin's. Not a
//! test: it prints figures and asserts nothing about time.
//!
//! Run with `bash scripts/bench-scaleout.sh` (release binary, setup scripts);
//! `SCALEOUT_ROUNDS` (bursts per way, default 6) and `SCALEOUT_BURST` (clients per burst,
//! default 4: twice what one pair holds at once).

use std::time::{Duration, Instant};

use serde_json::json;
use slotgate_tests::client::post_with_headers;
use slotgate_tests::litellm::{LiteLlm, MASTER_KEY, MODEL};
use slotgate_tests::llama::{chat, PROMPT};
use slotgate_tests::pair::Pair;
use slotgate_tests::smg::Smg;
use slotgate_tests::*;

fn main() {
    bench_main(run());
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One client's whole wait at `pair`, retrying each refusal after its Retry-After.
async fn round_robin_client(pair: &Pair, tokens: u64) -> Duration {
    let client = Client::tcp(([127, 0, 0, 1], pair.port).into());
    let body = chat(PROMPT, tokens, false);
    let started = Instant::now();
    loop {
        let resp = client.post_json(CHAT, &body).await;
        match resp.status.as_u16() {
            200 => return started.elapsed(),
            429 | 503 => tokio::time::sleep(told(&resp)).await,
            other => panic!("round-robin client: {other} {}", resp.body),
        }
    }
}

async fn litellm_client(litellm: &LiteLlm, tokens: u64, i: usize) -> Duration {
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "ignore_eos": true,
    });
    let headers = [
        ("authorization".to_owned(), format!("Bearer {MASTER_KEY}")),
        ("x-tenant".to_owned(), format!("client-{i}")),
    ];
    let started = Instant::now();
    loop {
        let resp = litellm.send(post_with_headers(CHAT, &body, &headers)).await;
        match resp.status.as_u16() {
            200 => return started.elapsed(),
            // LiteLLM's retries ran out on two full pairs: the client retries, as a round-robin
            // one does, after what it was told.
            429 => tokio::time::sleep(told(&resp)).await,
            other => panic!("through LiteLLM: {other} {}", resp.body),
        }
    }
}

async fn smg_client(smg: &Smg, tokens: u64, i: usize) -> Duration {
    let started = Instant::now();
    loop {
        let resp = smg.chat(&format!("client-{i}"), tokens).await;
        match resp.status.as_u16() {
            200 => return started.elapsed(),
            429 | 503 => tokio::time::sleep(told(&resp)).await,
            other => panic!("through SMG: {other} {}", resp.body),
        }
    }
}

/// The wait a refusal asked for: `retry-after-ms`, else `retry-after` seconds, else a second.
fn told(resp: &Response) -> Duration {
    let ms = resp
        .header("retry-after-ms")
        .and_then(|v| v.parse::<u64>().ok());
    let secs = resp
        .header("retry-after")
        .and_then(|v| v.parse::<u64>().ok());
    ms.map(Duration::from_millis)
        .or(secs.map(Duration::from_secs))
        .unwrap_or(Duration::from_secs(1))
}

fn percentile(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let at = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[at].as_secs_f64()
}

struct Figures {
    served: [u64; 2],
    refused: u64,
    p50: f64,
    p95: f64,
}

async fn counts(pairs: &[Pair; 2]) -> ([u64; 2], u64) {
    (
        [pairs[0].outcome("ok").await, pairs[1].outcome("ok").await],
        pairs[0].overloaded().await + pairs[1].overloaded().await,
    )
}

async fn run() {
    let rounds = env("SCALEOUT_ROUNDS", 6);
    let burst = env("SCALEOUT_BURST", 4);
    let pairs = [
        Pair::start("A", Gate::one_slot(1)).await,
        Pair::start("B", Gate::one_slot(1)).await,
    ];
    for p in &pairs {
        let warm = p
            .gate
            .client()
            .post_json(CHAT, &chat(PROMPT, 16, false))
            .await;
        assert_eq!(warm.status, 200, "{}", warm.body);
    }
    let tokens = pairs[0]
        .llama
        .tokens_for(Duration::from_millis(500), (20, 1800))
        .await;
    let litellm =
        LiteLlm::start_routing("least-busy", &pairs[0].api_base(), &pairs[1].api_base()).await;
    let smg = Smg::start(
        &[pairs[0].url(), pairs[1].url()],
        &["--policy", "least_load", "--load-monitor-interval", "1"],
    )
    .await;
    println!("scale-out: {rounds} bursts of {burst} chats of {tokens} tokens (about 0.5 s each), two pairs of 1 slot + 1 queue place");

    let mut results = Vec::new();
    let ways = ["round-robin", "LiteLLM least-busy", "SMG least_load"];
    for way in ways {
        let (served_before, refused_before) = counts(&pairs).await;
        let mut waits = Vec::new();
        for _ in 0..rounds {
            let clients = (0..burst).map(|i| {
                let (pairs, litellm, smg) = (&pairs, &litellm, &smg);
                async move {
                    match way {
                        "round-robin" => round_robin_client(&pairs[i % 2], tokens).await,
                        "SMG least_load" => smg_client(smg, tokens, i).await,
                        _ => litellm_client(litellm, tokens, i).await,
                    }
                }
            });
            waits.extend(futures_join(clients).await);
            // Both pairs idle before the next burst.
            for p in &pairs {
                p.gate.assert_idle().await;
            }
        }
        let (served, refused) = counts(&pairs).await;
        let f = Figures {
            served: [served[0] - served_before[0], served[1] - served_before[1]],
            refused: refused - refused_before,
            p50: percentile(&mut waits, 0.50),
            p95: percentile(&mut waits, 0.95),
        };
        println!(
            "{way:>20}: served A {} B {} | first attempts refused {} | wait p50 {:.2}s p95 {:.2}s",
            f.served[0], f.served[1], f.refused, f.p50, f.p95
        );
        results.push(f);
    }
    for (way, f) in ways.iter().zip(&results).skip(1) {
        println!(
            "ratio p95 {way} / round-robin: {:.2}x (below 1: the router's spread is faster)",
            f.p95 / results[0].p95
        );
    }
}

/// Runs the futures at once and returns their outputs in order.
async fn futures_join<F: std::future::Future<Output = Duration>>(
    futures: impl Iterator<Item = F>,
) -> Vec<Duration> {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut out = vec![Duration::ZERO; set.len()];
    let mut pending: Vec<usize> = (0..set.len()).collect();
    std::future::poll_fn(|cx| {
        pending.retain(|&i| match set[i].as_mut().poll(cx) {
            std::task::Poll::Ready(d) => {
                out[i] = d;
                false
            }
            std::task::Poll::Pending => true,
        });
        match pending.is_empty() {
            true => std::task::Poll::Ready(()),
            false => std::task::Poll::Pending,
        }
    })
    .await;
    out
}
