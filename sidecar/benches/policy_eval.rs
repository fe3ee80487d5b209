//! What a policy costs, and where to run it. Prints ratios against baselines measured in the same run;
//! asserts nothing about time. Run with `bash scripts/bench-policy.sh` (builds the example policies
//! first), or `cargo bench -p slotgate --bench policy_eval` once they are built.
//!
//! 1. One evaluation of each example policy through the chain (`Chain::evaluate`: JSON in, a fresh
//!    instance from the pool via `InstancePre`, fuel and deadline set, JSON out, metrics recorded),
//!    against an empty chain; then the three Rust examples in a chain, and all four.
//!    Then the AssemblyScript ports of token-budget and request-guard (`as-*`, built by
//!    `scripts/build-policies-as.sh`; a note says so when they are not built), each against its Rust
//!    original.
//! 2. Where it runs: the p50 of one evaluation awaited from an async task, called inline, on a fiber
//!    that yields at every epoch tick (as slotgate runs it), inside `block_in_place`, or handed to
//!    `spawn_blocking`; and how long a 1 ms timer on the same runtime is late while runaway policies
//!    (an infinite loop, cut off by the 20 ms deadline) are being evaluated each of those ways.
//!
//! `POLICY_EVAL_LOOP=<example>` (or `chain`) evaluates just that for 5 seconds, for a profiler.
#![allow(
    clippy::disallowed_methods,
    reason = "block_in_place is one of the ways this bench measures, to show why slotgate avoids it"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slotgate::config::{PolicyIsolation, PolicySpec};
use slotgate::policy::{v1, Chain, PolicySet};
use slotgate_sdk::{Peer, QueueSnapshot, RequestSummary};

const EXAMPLES: &[&str] = &[
    "token-budget",
    "tenant-priority",
    "request-guard",
    "wat-deny-embeddings",
];
/// The AssemblyScript ports (policies-as/) and the Rust example each one mirrors.
const AS_EXAMPLES: &[(&str, &str)] = &[
    ("as-token-budget", "token-budget"),
    ("as-request-guard", "request-guard"),
];
const ITERATIONS: usize = 20_000;

fn main() {
    let _metrics = slotgate::metrics::install().expect("metrics recorder");
    let dir = policy_dir();
    let request = request();
    if let Ok(name) = std::env::var("POLICY_EVAL_LOOP") {
        // For a profiler: evaluate one example for 5 seconds and stop.
        let chain = if name == "chain" {
            let all: Vec<PolicySpec> = EXAMPLES.iter().map(|n| spec(&dir, n)).collect();
            PolicySet::load(&all, None).expect("chain").current()
        } else {
            load(&dir, &name)
        };
        let t0 = Instant::now();
        let mut n = 0u64;
        while t0.elapsed() < Duration::from_secs(5) {
            std::hint::black_box(chain.evaluate(&request));
            n += 1;
        }
        println!("{name}: {n} evaluations in 5 s");
        return;
    }
    println!("policy evaluation, {ITERATIONS} runs each (p50 / p99 in microseconds)\n");

    let empty = PolicySet::load(&[], None).expect("empty chain").current();
    let base = evaluations(&empty, &request);
    println!(
        "{:<22} p50 {:>7.2}   p99 {:>7.2}   (baseline: no policy)",
        "none", base.0, base.1
    );
    let mut chains = Vec::new();
    let mut rust_p50 = Vec::new();
    for name in EXAMPLES {
        let chain = load(&dir, name);
        let (p50, p99) = evaluations(&chain, &request);
        println!(
            "{name:<22} p50 {p50:>7.2}   p99 {p99:>7.2}   adds {:>6.2} us at p50 ({:.0}x the baseline)",
            p50 - base.0,
            p50 / base.0.max(0.01)
        );
        rust_p50.push((*name, p50));
        chains.push(chain);
    }
    for (name, original) in AS_EXAMPLES {
        if !as_built(&dir, name) {
            println!("{name:<22} not built: run scripts/build-policies-as.sh to measure it");
            continue;
        }
        let chain = load(&dir, name);
        let (p50, p99) = evaluations(&chain, &request);
        let (rust, rust_fuel) = rust_p50
            .iter()
            .zip(&chains)
            .find(|((n, _), _)| n == original)
            .map_or((f64::NAN, 0), |((_, p), c)| (*p, fuel(c, &request)));
        println!(
            "{name:<22} p50 {p50:>7.2}   p99 {p99:>7.2}   adds {:>6.2} us at p50 ({:.2}x its Rust original's p50; fuel {} vs {rust_fuel})",
            p50 - base.0,
            p50 / rust.max(0.01),
            fuel(&chain, &request)
        );
    }
    // The three Rust examples (the chain the README's throughput table runs), then all four.
    for (what, names) in [
        ("three Rust in a chain", &EXAMPLES[..3]),
        ("all four in a chain", EXAMPLES),
    ] {
        let all: Vec<PolicySpec> = names.iter().map(|n| spec(&dir, n)).collect();
        let chain = PolicySet::load(&all, None).expect("chain").current();
        let (p50, p99) = evaluations(&chain, &request);
        println!(
            "{what:<22} p50 {p50:>7.2}   p99 {p99:>7.2}   adds {:>6.2} us at p50",
            p50 - base.0
        );
    }

    contracts(&dir, &request, base.0);
    guests(&dir, &request, base.0);

    inline_or_blocking(&chains[0], &request);
}

/// The Rust examples as ABI v1 modules and as v2 components, side by side: each one's cost per
/// evaluation in both, and the three in a chain.
fn contracts(dir: &Path, request: &RequestSummary, base: f64) {
    println!(
        "\nv1 module against its v2 component: an instance kept for the caller (`isolation = \"caller\"`, the default) and a fresh one per call (`\"call\"`, as v1) (p50 / p99 in microseconds; fuel per evaluation)\n"
    );
    for name in ["token-budget", "tenant-priority", "request-guard", "quota"] {
        let v2 = format!("{name}-v2");
        if !as_built(dir, &v2) {
            println!("{v2:<22} not built: run scripts/build-policies.sh");
            continue;
        }
        let (c1, c2, c2f) = (
            load(dir, name),
            load(dir, &v2),
            load_isolated(dir, &v2, PolicyIsolation::Call),
        );
        let t1 = evaluations(&c1, request);
        let t2 = evaluations(&c2, request);
        let t2f = evaluations(&c2f, request);
        println!(
            "{name:<16} v1 p50 {:>6.2} p99 {:>6.2} fuel {:>6}   v2 kept p50 {:>6.2} p99 {:>6.2} fuel {:>6}   v2 fresh p50 {:>6.2} p99 {:>6.2} fuel {:>6}   added at p50, v2 kept / v1 {:.2}x, fresh / v1 {:.2}x",
            t1.0,
            t1.1,
            fuel(&c1, request),
            t2.0,
            t2.1,
            fuel(&c2, request),
            t2f.0,
            t2f.1,
            fuel(&c2f, request),
            (t2.0 - base) / (t1.0 - base).max(0.01),
            (t2f.0 - base) / (t1.0 - base).max(0.01),
        );
    }
    let chain = |names: &[&str], isolation: Option<PolicyIsolation>| {
        let all: Vec<PolicySpec> = names
            .iter()
            .map(|n| PolicySpec {
                isolation,
                ..spec(dir, n)
            })
            .collect();
        PolicySet::load(&all, None).expect("chain").current()
    };
    let v2 = ["token-budget-v2", "tenant-priority-v2", "request-guard-v2"];
    let (c1, c2, c2f) = (
        chain(&EXAMPLES[..3], None),
        chain(&v2, None),
        chain(&v2, Some(PolicyIsolation::Call)),
    );
    let t1 = evaluations(&c1, request);
    let t2 = evaluations(&c2, request);
    let t2f = evaluations(&c2f, request);
    println!(
        "{:<16} v1 p50 {:>6.2} p99 {:>6.2}                v2 kept p50 {:>6.2} p99 {:>6.2}                v2 fresh p50 {:>6.2} p99 {:>6.2}                added at p50, v2 kept / v1 {:.2}x, fresh / v1 {:.2}x",
        "three in a chain",
        t1.0,
        t1.1,
        t2.0,
        t2.1,
        t2f.0,
        t2f.1,
        (t2.0 - base) / (t1.0 - base).max(0.01),
        (t2f.0 - base) / (t1.0 - base).max(0.01),
    );
}

/// Python and TypeScript policies (v2 components with their language's runtime inside): the cost
/// of one evaluation on an instance kept for the caller and on a fresh one (from the component's
/// pre-instantiated template), and what loading one costs in resident memory.
fn guests(dir: &Path, request: &RequestSummary, base: f64) {
    println!("\nguest languages (p50 / p99 in microseconds; {GUEST_ITERATIONS} runs; memory: resident growth from loading it compiled)\n");
    for (name, rust) in [
        ("request-guard-py", "request-guard-v2"),
        ("tenant-priority-ts", "tenant-priority-v2"),
    ] {
        if !as_built(dir, name) {
            println!(
                "{name:<22} not built: run scripts/build-policies-py.sh / build-policies-ts.sh"
            );
            continue;
        }
        // Compiled once into a cache of its own, then loaded from it as a restarted sidecar with
        // `--policy-cache-dir` would: the memory measured is the loaded component's (its code, the
        // template), not the compiler's.
        let cache =
            std::env::temp_dir().join(format!("slotgate-bench-cache-{}", std::process::id()));
        let cached = || {
            PolicySet::load(&[spec(dir, name)], Some(cache.clone()))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        drop(cached());
        let before = resident_bytes();
        let set = cached();
        let chain = set.current();
        let loaded = resident_bytes().saturating_sub(before);
        // The first calls fault in the pages the template's instances touch.
        for _ in 0..20 {
            std::hint::black_box(chain.evaluate(request));
        }
        let warm = resident_bytes().saturating_sub(before);
        let t = percentiles(time_each(GUEST_ITERATIONS, || {
            std::hint::black_box(chain.evaluate(request));
        }));
        let r = load(dir, rust);
        let tr = percentiles(time_each(GUEST_ITERATIONS, || {
            std::hint::black_box(r.evaluate(request));
        }));
        // The same with a fresh instance per call: the difference is what instantiation costs.
        let fresh = PolicySet::load(
            &[PolicySpec {
                isolation: Some(PolicyIsolation::Call),
                ..spec(dir, name)
            }],
            Some(cache.clone()),
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .current();
        let tf = percentiles(time_each(GUEST_ITERATIONS, || {
            std::hint::black_box(fresh.evaluate(request));
        }));
        println!(
            "{name:<20} kept p50 {:>7.1} p99 {:>7.1} ({:.0}x its Rust port's, fuel {:>8})   fresh p50 {:>7.1} p99 {:>7.1} (fuel {:>8}; instantiation ~{:.0} us)   memory {:>3} MiB loaded, {:>3} MiB after 20 calls",
            t.0,
            t.1,
            (t.0 - base) / (tr.0 - base).max(0.01),
            fuel(&chain, request),
            tf.0,
            tf.1,
            fuel(&fresh, request),
            tf.0 - t.0,
            loaded >> 20,
            warm >> 20,
        );
        let _ = std::fs::remove_dir_all(&cache);
    }
}

const GUEST_ITERATIONS: usize = 500;

/// This process's resident memory, in bytes.
fn resident_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Where the evaluation runs: on the async worker that serves the connection, or on the blocking pool.
fn inline_or_blocking(chain: &Arc<Chain>, request: &RequestSummary) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("\ninline or blocking pool (token-budget; 2 async workers, as on this machine)\n");
    let (inline, pool, in_place, on_fiber) = rt.block_on(async {
        let on_fiber = {
            let mut t = Vec::with_capacity(ITERATIONS);
            for _ in 0..ITERATIONS {
                let t0 = Instant::now();
                std::hint::black_box(chain.evaluate_each_async(request).await);
                t.push(t0.elapsed());
            }
            percentiles(t)
        };
        let inline = {
            let mut t = Vec::with_capacity(ITERATIONS);
            for _ in 0..ITERATIONS {
                let t0 = Instant::now();
                std::hint::black_box(chain.evaluate(request));
                t.push(t0.elapsed());
            }
            percentiles(t)
        };
        let pool = {
            let mut t = Vec::with_capacity(ITERATIONS);
            for _ in 0..ITERATIONS {
                let (c, r) = (chain.clone(), request.clone());
                let t0 = Instant::now();
                let out = tokio::task::spawn_blocking(move || c.evaluate(&r)).await;
                std::hint::black_box(out.ok());
                t.push(t0.elapsed());
            }
            percentiles(t)
        };
        let in_place = {
            let mut t = Vec::with_capacity(ITERATIONS);
            for _ in 0..ITERATIONS {
                let t0 = Instant::now();
                std::hint::black_box(tokio::task::block_in_place(|| chain.evaluate(request)));
                t.push(t0.elapsed());
            }
            percentiles(t)
        };
        (inline, pool, in_place, on_fiber)
    });
    println!(
        "{:<34} p50 {:>7.2}   p99 {:>7.2}",
        "inline, awaited from a task", inline.0, inline.1
    );
    for (what, adds, t) in [
        ("on a fiber (yields at each tick)", "adds", on_fiber),
        ("spawn_blocking, awaited", "hand-off adds", pool),
        ("block_in_place", "adds", in_place),
    ] {
        println!(
            "{what:<34} p50 {:>7.2}   p99 {:>7.2}   {adds} {:.2} us at p50 ({:.2}x)",
            t.0,
            t.1,
            t.0 - inline.0,
            t.0 / inline.0.max(0.01)
        );
    }

    let runaway = runaway_chain();
    // Longer than the canary's input: the runaway policy loops on it.
    let mut long = request.clone();
    long.headers.insert("x-pad".into(), "x".repeat(1000));
    let quiet = timer_lateness(&rt, None);
    let inline_stall = timer_lateness(&rt, Some((runaway.clone(), Mode::Inline, long.clone())));
    let in_place_stall = timer_lateness(&rt, Some((runaway.clone(), Mode::InPlace, long.clone())));
    let fiber_stall = timer_lateness(&rt, Some((runaway.clone(), Mode::Fiber, long.clone())));
    let pool_stall = timer_lateness(&rt, Some((runaway, Mode::Pool, long)));
    println!("\nlateness of a 1 ms timer on the same runtime (p50 / p99 / max in microseconds)\n");
    for (what, l) in [
        ("no policy work (baseline)", quiet),
        ("runaway policies inline", inline_stall),
        ("runaway policies, block_in_place", in_place_stall),
        ("runaway policies on a fiber", fiber_stall),
        ("runaway policies on blocking pool", pool_stall),
    ] {
        println!(
            "{what:<34} p50 {:>8.0}   p99 {:>8.0}   max {:>8.0}   ({:.1}x the baseline p99)",
            l.0,
            l.1,
            l.2,
            l.1 / quiet.1.max(1.0)
        );
    }
}

#[derive(Clone, Copy)]
enum Mode {
    /// As slotgate runs them: on the worker, on a fiber that yields at every epoch tick.
    Fiber,
    Inline,
    InPlace,
    Pool,
}

/// While two tasks keep evaluating `load` (inline on their worker, or on the blocking pool), how late a
/// task sleeping 1 ms at a time wakes up.
fn timer_lateness(
    rt: &tokio::runtime::Runtime,
    load: Option<(Arc<Chain>, Mode, RequestSummary)>,
) -> (f64, f64, f64) {
    rt.block_on(async {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut workers = Vec::new();
        if let Some((chain, mode, request)) = load {
            for _ in 0..2 {
                let (chain, request, stop) = (chain.clone(), request.clone(), stop.clone());
                workers.push(tokio::spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match mode {
                            Mode::Pool => {
                                let (c, r) = (chain.clone(), request.clone());
                                let _ = tokio::task::spawn_blocking(move || c.evaluate(&r)).await;
                            }
                            Mode::Fiber => {
                                std::hint::black_box(chain.evaluate_each_async(&request).await);
                                tokio::task::yield_now().await;
                            }
                            Mode::Inline => {
                                std::hint::black_box(chain.evaluate(&request));
                                tokio::task::yield_now().await;
                            }
                            Mode::InPlace => {
                                std::hint::black_box(tokio::task::block_in_place(|| {
                                    chain.evaluate(&request)
                                }));
                                tokio::task::yield_now().await;
                            }
                        }
                    }
                }));
            }
        }
        let probe = tokio::spawn(async {
            let mut late = Vec::new();
            for _ in 0..300 {
                let t0 = Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
                late.push(t0.elapsed().saturating_sub(Duration::from_millis(1)));
            }
            late
        });
        let late = probe.await.expect("probe");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in workers {
            let _ = w.await;
        }
        let max = late.iter().max().copied().unwrap_or_default();
        let (p50, p99) = percentiles(late);
        (p50, p99, max.as_secs_f64() * 1e6)
    })
}

/// A policy whose every evaluation loops until its deadline cuts it off.
fn runaway_chain() -> Arc<Chain> {
    let dir = std::env::temp_dir().join(format!("slotgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("runaway.wat");
    // The canary must pass: loop only when the input is longer than the canary's.
    let spin = "(if (i32.gt_u (local.get $n) (i32.const 1000)) (then (loop $l (br $l))))";
    let wat = v1::raw_v1_wat("", 1, 1024, r#"{"verdict":"allow"}"#, spin, "");
    std::fs::write(&path, wat).expect("write runaway policy");
    let mut spec = PolicySpec::from_path(path, None);
    // Fuel high enough that the 20 ms wall-clock deadline is what stops it.
    spec.fuel = Some(u64::MAX / 2);
    let set = PolicySet::load(&[spec], None).expect("runaway policy loads");
    let _ = std::fs::remove_dir_all(&dir);
    set.current()
}

fn load(dir: &Path, name: &str) -> Arc<Chain> {
    PolicySet::load(&[spec(dir, name)], None)
        .unwrap_or_else(|e| panic!("{e}"))
        .current()
}

fn load_isolated(dir: &Path, name: &str, isolation: PolicyIsolation) -> Arc<Chain> {
    let spec = PolicySpec {
        isolation: Some(isolation),
        ..spec(dir, name)
    };
    PolicySet::load(&[spec], None)
        .unwrap_or_else(|e| panic!("{e}"))
        .current()
}

/// The fuel one evaluation of the chain's first policy burns (instructions, roughly): a cost that a
/// busy machine does not blur.
fn fuel(chain: &Chain, request: &RequestSummary) -> u64 {
    let loaded = chain.policies().next().expect("a policy");
    let input = slotgate_sdk::EvaluateInput {
        abi: slotgate_sdk::ABI_VERSION,
        request: request.clone(),
        // A snapshot holds its settings already, as in the chain.
        settings: match loaded.preinitialised() {
            true => serde_json::Value::Null,
            false => loaded.settings.clone(),
        },
        now_unix_ms: 0,
        earlier: Default::default(),
    };
    loaded
        .policy
        .evaluate_input(&input)
        .map_or(0, |(_, evaluation)| evaluation.fuel_used)
}

/// Whether the AssemblyScript example `name` (`as-…`) is built.
fn as_built(dir: &Path, name: &str) -> bool {
    dir.join(format!("{name}.wasm")).exists()
}

fn spec(dir: &Path, name: &str) -> PolicySpec {
    let module = ["wasm", "wat"]
        .iter()
        .map(|ext| dir.join(format!("{name}.{ext}")))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not built in {}: run scripts/build-policies.sh (as-*: scripts/build-policies-as.sh)",
                dir.display()
            )
        });
    // A port has its example settings beside its source: an AssemblyScript one (`as-<name>`) in
    // policies-as/<name>/, a Python one (`<name>-py`) in policies-py/, a TypeScript one
    // (`<name>-ts`) in policies-ts/; a v2 build of an example (`<name>-v2`) takes the example's.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let settings = if let Some(port) = name.strip_prefix("as-") {
        root.join("policies-as").join(port)
    } else if let Some(port) = name.strip_suffix("-py") {
        root.join("policies-py").join(port)
    } else if let Some(port) = name.strip_suffix("-ts") {
        root.join("policies-ts").join(port)
    } else {
        root.join("policies")
            .join(name.strip_suffix("-v2").unwrap_or(name))
    }
    .join("settings.example.json");
    PolicySpec::from_path(module, settings.exists().then_some(settings))
}

fn policy_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
            PathBuf::from,
        )
        .join("policies")
}

/// A typical chat request, as intake summarises it.
fn request() -> RequestSummary {
    RequestSummary {
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        model: Some("qwen2.5-7b-instruct".into()),
        stream: true,
        max_tokens: Some(256),
        prompt_chars: 1200,
        prompt_tokens_estimate: 300,
        prompt_tokens: Some(342),
        reserved_tokens: Some(598),
        priority_hint: None,
        deadline_ms: None,
        peer: Some(Peer {
            uid: 1000,
            gid: 1000,
            pid: Some(4242),
        }),
        api_key: Some(
            "sha256:0c55d73decea73c6807948b6fc35a5f7c446ea3a8400224532c1249fe73587a9".into(),
        ),
        headers: [("user-agent".to_owned(), "openai-python/1.40".to_owned())].into(),
        queue: QueueSnapshot {
            depth: 2,
            capacity: 8,
            in_flight: 1,
            estimated_wait_seconds: 3.5,
        },
        dialect: Some("chat".into()),
        body_bytes: 1400,
        caller: Some(
            "sha256:0c55d73decea73c6807948b6fc35a5f7c446ea3a8400224532c1249fe73587a9".into(),
        ),
        ..RequestSummary::default()
    }
}

fn time_each(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..n / 10 {
        f();
    }
    (0..n)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        })
        .collect()
}

/// p50 and p99 in microseconds.
/// p50 and p99 of `chain` evaluating `request`, [`ITERATIONS`] times.
fn evaluations(chain: &Chain, request: &RequestSummary) -> (f64, f64) {
    percentiles(time_each(ITERATIONS, || {
        std::hint::black_box(chain.evaluate(request));
    }))
}

fn percentiles(mut t: Vec<Duration>) -> (f64, f64) {
    t.sort();
    let at = |q: f64| t[((t.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.50), at(0.99))
}
