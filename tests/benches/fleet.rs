//! The fleet state backend side by side with the in-memory one (issue 10). Not a test: it prints
//! figures and ratios against the targets, and asserts nothing.
//!
//! 1. Added latency: slotgate with token-budget and `--state-backend memory`, then `redis` (a real
//!    Redis 7 on a Unix socket), one request at a time against the instant fake upstream,
//!    interleaved in rounds; p50 and p99 of each, and the ratio (target: redis ≤ 1.05× memory).
//! 2. Store commands per request at steady state: Redis's own `INFO commandstats` over the redis
//!    rounds, divided by the requests (target ≤ 0.1).
//! 3. Accuracy: `SIDECARS` redis-backed sidecars share one tenant's fixed budget; clients spread
//!    over them spend it concurrently until every sidecar has refused for longer than an idle lease
//!    is kept. Tokens admitted ÷ budget (1.0 is exact; above is over-admission, below is stranded).
//!
//! Run with `SLOTGATE_BIN=$PWD/target/release/slotgate cargo bench -p slotgate-tests --bench fleet`
//! (release binary; `scripts/build-policies.sh` first). `FLEET_SIDECARS` (default 3; 8 is what this
//! machine holds for the scaling check), `FLEET_ROUNDS` (default 5), `FLEET_REQUESTS` (per round and
//! backend, default 400).

use std::time::{Duration, Instant};

use slotgate_tests::redis::{wait_connected, RunningRedis, Store};
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

const AMPLE: &str = "{ capacity = 1000000000000, refill_per_second = 1000000000 }";

async fn gate(redis: Option<&RunningRedis>, settings: &str) -> (RunningUpstream, RunningGate) {
    let g = Gate::new()
        .slots(8)
        .policies(&[(&wat::built("token-budget"), Some(settings))]);
    let g = match redis {
        Some(r) => r.backend_for(g),
        None => g,
    };
    let (up, gate) = g.start_instant().await;
    if redis.is_some() {
        wait_connected(&gate).await;
    }
    (up, gate)
}

fn spend(tag: &str) -> Req {
    Req::chat(tag)
        .set("max_tokens", 100)
        .prompt_tokens(0)
        .completion_tokens(100)
}

async fn run() {
    let rounds = env("FLEET_ROUNDS", 5);
    let per_round = env("FLEET_REQUESTS", 400);
    let sidecars = env("FLEET_SIDECARS", 3);
    println!(
        "slotgate {}: fleet backend vs memory",
        gate::binary_path().display()
    );
    // FLEET_STORE=valkey runs the same against Valkey (scripts/setup-valkey.sh).
    let store = match std::env::var("FLEET_STORE").as_deref() {
        Ok("valkey") => Store::Valkey,
        _ => Store::Redis,
    };
    println!("store: {store:?}");
    let redis = RunningRedis::start_on(store);

    // 1 and 2.
    let (_up_m, mem) = gate(None, AMPLE).await;
    let (_up_r, red) = gate(Some(&redis), AMPLE).await;
    let (mut lat_mem, mut lat_red) = (Vec::new(), Vec::new());
    let mut commands = 0u64;
    let mut redis_requests = 0u64;
    for round in 0..rounds {
        for (which, g, lat) in [(0, &mem, &mut lat_mem), (1, &red, &mut lat_red)] {
            let client = g.client();
            let before = if which == 1 { redis.commands() } else { 0 };
            for i in 0..per_round {
                let body = spend(&format!("r{round}-{which}-{i}")).json();
                let t0 = Instant::now();
                let resp = client.post_json(CHAT, &body).await;
                lat.push(t0.elapsed());
                assert_eq!(resp.status, 200, "{}", resp.body);
            }
            if which == 1 {
                commands += redis.commands() - before;
                redis_requests += per_round as u64;
            }
        }
    }
    let (m50, m99) = percentiles(&mut lat_mem);
    let (r50, r99) = percentiles(&mut lat_red);
    println!("\nadded latency, one request at a time, {rounds} rounds x {per_round} requests each (microseconds)");
    println!("  memory backend   p50 {m50:>7.1}   p99 {m99:>7.1}");
    println!(
        "  redis backend    p50 {r50:>7.1}   p99 {r99:>7.1}   p50 {:.3}x memory (target <= 1.05x)",
        r50 / m50
    );
    println!(
        "\nstore commands per request: {commands} commands for {redis_requests} requests = {:.4} (target <= 0.1)",
        commands as f64 / redis_requests as f64
    );
    drop((mem, red));

    // 3.
    let budget = 50_000.0;
    let settings = format!("{{ capacity = {budget}, refill_per_second = 0 }}");
    let mut gates = Vec::new();
    for _ in 0..sidecars {
        gates.push(gate(Some(&redis), &settings).await);
    }
    let started = Instant::now();
    let clients: Vec<_> = gates.iter().map(|(_, g)| g.client()).collect();
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let (mut served, mut refused_since) = (0u64, None::<Instant>);
            let mut n = 0;
            loop {
                n += 1;
                let resp = client
                    .post_json_with_headers(
                        CHAT,
                        &spend(&format!("acc-{i}-{n}")).json(),
                        &[("authorization", "Bearer one-tenant")],
                    )
                    .await;
                match resp.status.as_u16() {
                    200 => {
                        served += 1;
                        refused_since = None;
                    }
                    429 => {
                        let since = *refused_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > Duration::from_secs(7) {
                            return served;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    other => panic!("unexpected {other}: {}", resp.body),
                }
            }
        }));
    }
    let mut served = 0;
    for t in tasks {
        served += t.await.expect("client task");
    }
    // Each request spends its estimate for good: the prompt's (~1 token) plus 100.
    let per_request = 101.0;
    println!(
        "\naccuracy: {sidecars} sidecars spent one tenant's {budget} tokens concurrently in {:.1} s: {served} requests of ~{per_request} tokens admitted = {:.3} of the budget",
        started.elapsed().as_secs_f64() - 7.0,
        served as f64 * per_request / budget
    );
}

fn percentiles(v: &mut [Duration]) -> (f64, f64) {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1e6;
    (at(0.5), at(0.99))
}
