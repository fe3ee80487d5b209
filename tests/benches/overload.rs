//! Overload, measured on the real llama-server (and on the fake, for comparison): not a test, it
//! prints figures and ratios and asserts nothing about time.
//!
//! 1. Retry-After hit rate: bursts of 8 against one slot and two queue places; every client turned
//!    away retries exactly at the Retry-After it was told. Answers are of mixed length, as in real
//!    traffic, and (the short-burst shape) all about 0.3 s, with each burst after the one before or
//!    one every second (overlapping); large bursts; long answers (about 2 s). The figure: the share
//!    of retries that got in.
//! 2. Goodput under overload: open-loop (Poisson) arrivals at 1x and at 10x the rate the slot can
//!    serve, for the same time each. Goodput is requests answered 200 (so within their queue timeout)
//!    per second; the ratio 10x / 1x shows whether overload costs served work.
//!
//! Run with `bash scripts/bench-overload.sh` (release binary), or by hand:
//! `SLOTGATE_BIN=target/release/slotgate cargo bench -p slotgate-tests --bench overload`.
//! `OVERLOAD_SECONDS` sets the length of each goodput run (default 30), `OVERLOAD_ROUNDS` the bursts
//! of each Retry-After run (default 8, about 40 retries); `OVERLOAD_ONLY=retry-after` skips the
//! goodput runs, `OVERLOAD_VERBOSE=1` prints each retry that missed.

use std::time::{Duration, Instant};

use serde_json::Value;
use slotgate_tests::llama::{LlamaServer, RunningLlama, PROMPT};
use slotgate_tests::*;

const BURST: usize = 8;
/// Bursts per Retry-After run; `OVERLOAD_ROUNDS` sets it (each burst gives about 5 retries).
const ROUNDS: usize = 8;
const QUEUE_TIMEOUT: &str = "10s";

fn main() {
    bench_main(run());
}

/// What one request of a scenario asks for: its body, given a draw in `0..1`.
trait Workload: Sync {
    fn body(&self, tag: &str, draw: f64) -> Value;
}

/// The real llama-server: `max_tokens` between 0.5x and 1.5x of a length taking ~`target`, or
/// (`equal`) every answer the same length.
struct Llama {
    tokens: u64,
    equal: bool,
}

impl Workload for Llama {
    fn body(&self, tag: &str, draw: f64) -> Value {
        let draw = if self.equal { 0.5 } else { draw };
        let n = ((self.tokens as f64) * (0.5 + draw)).round().max(1.0) as u64;
        // Each client its own prompt, as real clients have: a client that comes back is known by
        // its request.
        llama::chat(&format!("{PROMPT} ({tag})"), n, false)
    }
}

/// Every client of a run sends the same request (one prompt, one length), as a script or a test
/// harness firing one request many times does.
struct Same<'a>(&'a dyn Workload);

impl Workload for Same<'_> {
    fn body(&self, _tag: &str, _draw: f64) -> Value {
        self.0.body("same", 0.5)
    }
}

/// The fake: service time between 0.5x and 1.5x of `service`, usage in proportion.
struct Fake {
    service: Duration,
}

impl Workload for Fake {
    fn body(&self, tag: &str, draw: f64) -> Value {
        let d = self.service.mul_f64(0.5 + draw);
        Req::chat(tag)
            .delay(d)
            .set("max_tokens", 200)
            .completion_tokens((d.as_millis() as u64 / 2).max(1))
            .json()
    }
}

async fn run() {
    let seconds: u64 = std::env::var("OVERLOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    println!(
        "slotgate {}; 1 slot; {} cores\n",
        gate::binary_path().display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let fake = FakeUpstream::instant().start().await;
    let fake_work = Fake {
        service: Duration::from_millis(300),
    };
    let llama = LlamaServer::start(1).await;
    let tokens = llama
        .tokens_for(Duration::from_millis(300), (16, 1500))
        .await;
    let llama_work = Llama {
        tokens,
        equal: false,
    };
    let short_burst = Llama {
        tokens,
        equal: true,
    };

    let rounds: usize = std::env::var("OVERLOAD_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ROUNDS);
    fresh_short_bursts(&llama, &short_burst, rounds).await;
    if std::env::var("OVERLOAD_ONLY").as_deref() == Ok("short-burst") {
        return;
    }
    println!("== Retry-After hit rate ({rounds} bursts of {BURST}, 1 slot + 2 queue places, clients retry exactly at Retry-After)");
    let g = gate_for(Gate::one_slot(2).upstream(&fake)).await;
    report(
        "fake llama-server ",
        retry_bursts(&g, &fake_work, Bursts::of(rounds)).await,
    );
    drop(g);
    let g = gate_for(Gate::one_slot(2).upstream_path(llama.socket())).await;
    report(
        "real llama-server ",
        retry_bursts(&g, &llama_work, Bursts::of(rounds)).await,
    );
    // The short-burst shape of issue 22: every answer about 0.3 s.
    report(
        "real llama-server, equal 0.3 s answers",
        retry_bursts(&g, &short_burst, Bursts::of(rounds)).await,
    );
    // The same bursts one a second, each meeting the clients the one before sent back; clients
    // that wait the whole-second Retry-After, then clients that wait retry-after-ms.
    let every = Some(Duration::from_secs(1));
    report(
        "real llama-server, equal 0.3 s answers, a burst every second",
        retry_bursts(
            &g,
            &short_burst,
            Bursts {
                every,
                ..Bursts::of(rounds)
            },
        )
        .await,
    );
    let (hits, tries) = retry_bursts(
        &g,
        &short_burst,
        Bursts {
            every,
            wait: Wait::Millis,
            ..Bursts::of(rounds)
        },
    )
    .await;
    report(
        "real llama-server, equal 0.3 s answers, a burst every second, clients waiting retry-after-ms",
        (hits, tries),
    );
    // Large bursts (twice as many) of mixed answers, one every two seconds.
    let every = Some(Duration::from_secs(2));
    report(
        &format!(
            "real llama-server, mixed answers, bursts of {} every 2 s",
            2 * BURST
        ),
        retry_bursts(
            &g,
            &llama_work,
            Bursts {
                every,
                size: 2 * BURST,
                ..Bursts::of(rounds)
            },
        )
        .await,
    );
    drop(g);
    // Long answers (mixed, about 2 s each, on the 16k-token model): bursts of 8, clients waiting
    // the whole-second Retry-After, then clients waiting retry-after-ms.
    let long_llama = LlamaServer::start_long(1, 16_384).await;
    let long = Llama {
        tokens: long_llama
            .tokens_for(Duration::from_secs(2), (16, 15_000))
            .await,
        equal: false,
    };
    let g = gate_for(
        Gate::one_slot(2)
            .queue_timeout("60s")
            .upstream_path(long_llama.socket()),
    )
    .await;
    for (wait, how) in [
        (Wait::Seconds, "Retry-After"),
        (Wait::Millis, "retry-after-ms"),
    ] {
        report(
            &format!("real llama-server, long answers (about 2 s), clients waiting {how}"),
            retry_bursts(
                &g,
                &long,
                Bursts {
                    wait,
                    ..Bursts::of(rounds)
                },
            )
            .await,
        );
    }
    drop(g);
    drop(long_llama);
    if std::env::var("OVERLOAD_ONLY").as_deref() == Ok("retry-after") {
        return;
    }

    println!("\n== Goodput (answered 200 per second), open-loop arrivals for {seconds} s per run, queue 4, queue timeout {QUEUE_TIMEOUT}");
    for (name, work, up) in [
        ("fake", &fake_work as &dyn Workload, Upstream::Fake(&fake)),
        (
            "real",
            &llama_work as &dyn Workload,
            Upstream::Llama(&llama),
        ),
    ] {
        let g = gate_for(up.gate(Gate::one_slot(4).queue_timeout(QUEUE_TIMEOUT))).await;
        let service = mean_service(&g, work).await;
        let capacity = 1.0 / service.as_secs_f64();
        let one = goodput(&g, work, capacity, seconds).await;
        let ten = goodput(&g, work, capacity * 10.0, seconds).await;
        println!(
            "{name} llama-server: service {:.0} ms ({capacity:.2}/s);  1x: {}  10x: {}  goodput 10x / 1x = {:.2}",
            service.as_secs_f64() * 1000.0,
            one.line(),
            ten.line(),
            ten.goodput / one.goodput
        );
        g.assert_idle().await;
    }
}

enum Upstream<'a> {
    Fake(&'a RunningUpstream),
    Llama(&'a RunningLlama),
}

impl Upstream<'_> {
    fn gate(&self, g: Gate) -> Gate {
        match self {
            Upstream::Fake(up) => g.upstream(up),
            Upstream::Llama(l) => g.upstream_path(l.socket()),
        }
    }
}

async fn gate_for(g: Gate) -> RunningGate {
    g.start().await
}

/// The short-burst shape as a user first meets it: a slotgate just started (nothing measured
/// yet), three bursts of 8 equal 0.3 s chats one after another, every client turned away sending
/// its request again at its whole-second Retry-After; each client its own prompt, then every client
/// the same one. Each run on a new slotgate; `rounds / 8` runs (at least 2) of each, added up.
async fn fresh_short_bursts(llama: &RunningLlama, work: &dyn Workload, rounds: usize) {
    let runs = (rounds / 8).max(2);
    for (name, same) in [("each its own prompt", false), ("one prompt for all", true)] {
        let (mut hits, mut tries) = (0, 0);
        for _ in 0..runs {
            let g = gate_for(
                Gate::new()
                    .slots(1)
                    .queue_depth(2)
                    .upstream_path(llama.socket()),
            )
            .await;
            let same_work = Same(work);
            let work: &dyn Workload = if same { &same_work } else { work };
            let (h, t) = retry_bursts(
                &g,
                work,
                Bursts {
                    warm: false,
                    ..Bursts::of(3)
                },
            )
            .await;
            hits += h;
            tries += t;
        }
        report(
            &format!("real llama-server, a new slotgate, 3 bursts of equal 0.3 s answers, {name} ({runs} runs)"),
            (hits, tries),
        );
    }
}

/// One Retry-After shape's line: `label`, and how many of the retries got in.
fn report(label: &str, (hits, tries): (usize, usize)) {
    let pct = 100.0 * hits as f64 / tries.max(1) as f64;
    println!("{label}: {hits} of {tries} retries got in ({pct:.1}%)");
}

/// How a client turned away waits: the whole-second `Retry-After`, or `retry-after-ms` (what the
/// OpenAI SDKs read first).
#[derive(Clone, Copy)]
enum Wait {
    Seconds,
    Millis,
}

/// A Retry-After run: `rounds` bursts of `size` at once; the clients turned away sleep their
/// Retry-After (`wait`) and try once more. Each burst starts once the one before is over, or with
/// `every` that often, whether or not the one before is over (its returning clients and the next
/// burst then meet). `warm`: three requests first teach the drain estimate what one costs.
#[derive(Clone, Copy)]
struct Bursts {
    rounds: usize,
    every: Option<Duration>,
    size: usize,
    wait: Wait,
    warm: bool,
}

impl Bursts {
    /// `rounds` bursts of [`BURST`], each after the one before, clients waiting the whole second.
    fn of(rounds: usize) -> Bursts {
        Bursts {
            rounds,
            every: None,
            size: BURST,
            wait: Wait::Seconds,
            warm: true,
        }
    }
}

/// Runs `b` against `gate`: how many retries got in, of how many.
async fn retry_bursts(gate: &RunningGate, work: &dyn Workload, b: Bursts) -> (usize, usize) {
    let Bursts {
        rounds,
        every,
        size: burst,
        wait,
        warm,
    } = b;
    let client = gate.client();
    // Teach the drain estimate what a request costs.
    for i in (0..3).filter(|_| warm) {
        let resp = client
            .post_json(CHAT, &work.body(&format!("warm{i}"), 0.5))
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    let (mut hits, mut tries) = (0, 0);
    let mut pending = Vec::new();
    for round in 0..rounds {
        let tasks: Vec<_> = (0..burst)
            .map(|i| {
                let client = client.clone();
                let body = work.body(&format!("b{round}-{i}"), fastrand::f64());
                tokio::spawn(async move {
                    let first = client.post_json(CHAT, &body).await;
                    if first.status == 200 {
                        return None;
                    }
                    let secs = retry_after(&first);
                    let told_ms = first.header("retry-after-ms");
                    let pause = match (wait, told_ms.as_deref().and_then(|v| v.parse().ok())) {
                        (Wait::Millis, Some(ms)) => Duration::from_millis(ms),
                        _ => Duration::from_secs(secs),
                    };
                    tokio::time::sleep(pause).await;
                    let second = client.post_json(CHAT, &body).await;
                    if second.status != 200 && std::env::var("OVERLOAD_VERBOSE").is_ok() {
                        eprintln!(
                            "miss: told {secs} s (retry-after-ms {told_ms:?}), then {} {:?} retry-after {:?}",
                            second.status,
                            second.header("x-slotgate-reason"),
                            second.header("retry-after-ms"),
                        );
                    }
                    Some(second.status == 200)
                })
            })
            .collect();
        match every {
            None => {
                for r in join_all(tasks).await.into_iter().flatten() {
                    tries += 1;
                    hits += usize::from(r);
                }
                gate.assert_idle().await;
            }
            Some(every) => {
                pending.extend(tasks);
                tokio::time::sleep(every).await;
            }
        }
    }
    for r in join_all(pending).await.into_iter().flatten() {
        tries += 1;
        hits += usize::from(r);
    }
    gate.assert_idle().await;
    (hits, tries)
}

/// Mean service time of a request, one at a time.
async fn mean_service(gate: &RunningGate, work: &dyn Workload) -> Duration {
    let client = gate.client();
    let n = 6;
    let t0 = Instant::now();
    for i in 0..n {
        let resp = client
            .post_json(
                CHAT,
                &work.body(&format!("m{i}"), (i as f64 + 0.5) / n as f64),
            )
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    t0.elapsed() / n
}

struct Goodput {
    sent: usize,
    ok: usize,
    rejected: usize,
    timed_out: usize,
    goodput: f64,
}

impl Goodput {
    fn line(&self) -> String {
        format!(
            "{:.2}/s ({} sent, {} ok, {} 429, {} 504)",
            self.goodput, self.sent, self.ok, self.rejected, self.timed_out
        )
    }
}

/// `slotgate_requests_total` by outcome.
async fn outcomes(gate: &RunningGate) -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    for k in [
        "ok",
        "queue_full",
        "wait_too_long",
        "queue_timeout",
        "upstream_error",
        "upstream_timeout",
    ] {
        out.push((
            k,
            gate.metric("slotgate_requests_total", &[("outcome", k)])
                .await
                .unwrap_or(0.0),
        ));
    }
    out
}

/// Poisson arrivals at `rate` per second for `seconds`; waits for every answer.
async fn goodput(gate: &RunningGate, work: &dyn Workload, rate: f64, seconds: u64) -> Goodput {
    let client = gate.client();
    let before = outcomes(gate).await;
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    let mut next = Instant::now();
    let mut i = 0;
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        let (client, body) = (client.clone(), work.body(&format!("g{i}"), fastrand::f64()));
        tasks.push(tokio::spawn(async move {
            client.post_json(CHAT, &body).await.status.as_u16()
        }));
        i += 1;
        // Exponential gaps: the arrivals of independent clients.
        let gap = -(1.0 - fastrand::f64()).ln() / rate;
        next += Duration::from_secs_f64(gap);
    }
    let statuses = join_all(tasks).await;
    let after = outcomes(gate).await;
    let delta: Vec<String> = after
        .iter()
        .zip(&before)
        .filter(|((_, a), (_, b))| a > b)
        .map(|((k, a), (_, b))| format!("{k} {}", a - b))
        .collect();
    println!("    outcomes at {rate:.1}/s: {}", delta.join(", "));
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let result = Goodput {
        sent: statuses.len(),
        ok,
        rejected: statuses.iter().filter(|s| **s == 429).count(),
        timed_out: statuses.iter().filter(|s| **s == 504).count(),
        // Answers that arrive after the window still count; the window is what was offered.
        goodput: ok as f64 / seconds as f64,
    };
    gate.assert_idle().await;
    result
}
