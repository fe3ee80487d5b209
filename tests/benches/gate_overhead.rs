//! What a policy adds to a whole request through the real `slotgate` binary: one keep-alive client
//! sends requests one after another to a gate in front of the instant fake llama-server, with no
//! policy, then with each example policy, then with all four in a chain. Prints p50/p99 and the
//! ratio and difference against the no-policy run of the same invocation; asserts nothing about time.
//!
//! Run with `bash scripts/bench-policy.sh` (release binary, policies built), or by hand:
//! `SLOTGATE_BIN=target/release/slotgate cargo bench -p slotgate-tests --bench gate_overhead`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use slotgate_tests::client::post;
use slotgate_tests::*;

/// A policy module and its settings file.
type PolicyFiles = (PathBuf, Option<PathBuf>);

const REQUESTS: usize = 3000;
const WARMUP: usize = 300;

fn main() {
    bench_main(run());
}

async fn run() {
    println!(
        "slotgate {} : {REQUESTS} sequential chat requests per run over one keep-alive connection\n",
        gate::binary_path().display()
    );
    let examples = [
        "token-budget",
        "tenant-priority",
        "request-guard",
        "wat-deny-embeddings",
    ];
    let mut runs: Vec<(String, Vec<PolicyFiles>)> = vec![("none".into(), vec![])];
    for name in examples {
        runs.push((name.into(), vec![policy(name)]));
    }
    runs.push((
        "all four".into(),
        examples.iter().map(|n| policy(n)).collect(),
    ));
    runs.push(("none (again)".into(), vec![]));

    let direct = measure_direct().await;
    println!(
        "{:<20} p50 {:>7.1} us   p99 {:>7.1} us   (the fake llama-server without slotgate)",
        "direct", direct.0, direct.1
    );
    let mut base = None;
    for (label, chain) in runs {
        let (p50, p99) = measure(&chain).await;
        let (b50, _) = *base.get_or_insert((p50, p99));
        println!(
            "{label:<20} p50 {p50:>7.1} us   p99 {p99:>7.1} us   {:>5.2}x the no-policy p50 ({:+.1} us)",
            p50 / b50,
            p50 - b50
        );
    }
}

fn policy(name: &str) -> PolicyFiles {
    if name == "token-budget" {
        // The example's budgets would run dry within the run: a budget that never does.
        let dir = unique_dir("bench-budget");
        let settings = dir.join("budget.json");
        std::fs::write(
            &settings,
            r#"{"capacity": 1000000000000, "refill_per_second": 1000000000}"#,
        )
        .unwrap();
        return (wat::built(name), Some(settings));
    }
    let settings = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../policies")
        .join(name)
        .join("settings.example.json");
    (wat::built(name), settings.exists().then_some(settings))
}

async fn measure_direct() -> (f64, f64) {
    let up = FakeUpstream::instant().start().await;
    let conn = Client::unix(up.socket_path())
        .connect()
        .await
        .expect("connect");
    timed(conn).await
}

async fn measure(chain: &[PolicyFiles]) -> (f64, f64) {
    let mut g = Gate::new().slots(4).arg("--policy-watch").arg("0s");
    for (module, settings) in chain {
        g = g.arg("--policy").arg(module.to_str().unwrap());
        if let Some(s) = settings {
            g = g.arg("--policy-settings").arg(s.to_str().unwrap());
        }
    }
    let (_up, gate) = g.start_instant().await;
    let conn = gate.client().connect().await.expect("connect");
    timed(conn).await
}

/// p50 and p99, in microseconds, of [`REQUESTS`] chat requests sent one after another on `conn`.
async fn timed(mut conn: Conn) -> (f64, f64) {
    // The example request-guard allows only its listed models.
    let body = Req::chat("bench")
        .set("model", "qwen2.5-7b-instruct")
        .set("max_tokens", 64)
        .json();
    let mut took = Vec::with_capacity(REQUESTS);
    for i in 0..WARMUP + REQUESTS {
        let t0 = Instant::now();
        let resp = conn.send(post(CHAT, &body)).await.expect("response");
        assert_eq!(resp.status, 200, "{}", resp.body);
        if i >= WARMUP {
            took.push(t0.elapsed());
        }
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(at(0.5)), us(at(0.99)))
}
