//! Soak: mixed traffic for a long time against slotgate in front of a real llama-server, a line of RSS,
//! open fds and counts every report interval, and the invariants once the traffic has stopped.
//!
//! ```text
//!   workers (seeded mix of kinds) ──unix──▶ slotgate (--slots np, short guards) ──unix──▶ llama-server -np np
//!   reloader (SIGHUP, config rewrite) ──▶ slotgate         monitor ──▶ /proc/<pid>, /status, /metrics
//! ```
//!
//! Growth is measured on the idle gate twice: at the end of warm-up the workers pause until the gate is
//! idle, and at the deadline they stop. Comparing those two quiet moments keeps the buffers of requests in
//! flight out of the figures, so what grows is what stayed behind.
//!
//! Every request ends in one of a few ways its kind expects (an answer, a refusal with the error shape,
//! a cut); anything else is counted as unexpected and fails the run. slotgate must count exactly one
//! outcome in `slotgate_requests_total` per request that reached it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::RwLock;

use crate::client::{self, read_until_closed, Client, Streaming};
use crate::gate::{Gate, RunningGate};
use crate::llama::{self, LlamaServer, RunningLlama, PROMPT};
use crate::metrics::Metrics;
use crate::request::CHAT;
use crate::wait::unique_dir;

/// What slotgate must cut a client that stops reading after.
const STALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Slotgate's `--max-body`: small, so an oversized body costs the soak little to send.
const MAX_BODY: usize = 64 * 1024;
/// The longest any one request of the soak may take before the driver calls it hung: a queue wait
/// (30 s), a stall cut, and a slow answer on a loaded machine all fit well inside.
const REQUEST_LIMIT: Duration = Duration::from_secs(180);
/// How long the gate and llama-server get to become idle once traffic pauses or stops.
const IDLE_LIMIT: Duration = Duration::from_secs(60);
/// Statuses a well-behaved client may get instead of an answer when the soak overloads two slots:
/// queue full or wait too long (429), upstream trouble (503), queue timeout (504). Each must carry the
/// OpenAI error shape.
const REFUSALS: &[u16] = &[429, 503, 504];

/// What to run and what to accept.
#[derive(Clone, Debug)]
pub struct SoakOpts {
    /// Traffic runs this long, warm-up included.
    pub duration: Duration,
    /// After this long the workers pause and the idle baseline is taken.
    pub warmup: Duration,
    /// Concurrent clients.
    pub workers: usize,
    /// llama-server's `-np` and slotgate's `--slots`.
    pub np: usize,
    /// Seeds the mix of kinds and their random knobs.
    pub seed: u64,
    /// One status line per this much time.
    pub report_every: Duration,
    /// One policy reload (alternately SIGHUP and a rewritten config file) per this much time.
    pub reload_every: Duration,
    /// Largest accepted growth of the idle RSS from the warm-up baseline to the end, in percent.
    pub max_rss_growth_pct: f64,
    /// Largest accepted growth of the idle open fds, in percent (at least one fd is always allowed:
    /// the health probe's pooled upstream connection comes and goes).
    pub max_fd_growth_pct: f64,
}

impl SoakOpts {
    /// A run of `minutes`: warm-up is the first 2 minutes of a run of 10 minutes or more, else the
    /// first 30 seconds. Growth limits are the issue's 5 %.
    pub fn minutes(minutes: f64) -> Self {
        let duration = Duration::from_secs_f64(minutes * 60.0);
        let warmup = if minutes >= 10.0 {
            Duration::from_secs(120)
        } else {
            Duration::from_secs(30)
        };
        let report_every = if minutes >= 10.0 {
            Duration::from_secs(60)
        } else {
            Duration::from_secs(20)
        };
        Self {
            duration,
            warmup,
            workers: 8,
            np: 2,
            seed: 8_7,
            report_every,
            reload_every: Duration::from_secs(25),
            max_rss_growth_pct: 5.0,
            max_fd_growth_pct: 5.0,
        }
    }
}

/// The kinds of client, each with its weight in the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A whole chat answer of 8-32 tokens.
    Chat,
    /// A streamed chat answer of 8-32 tokens, read to `[DONE]`.
    Stream,
    /// `GET /v1/models`, passed through without a slot.
    Models,
    /// Sends a chat request, then leaves before the answer (0.1-1.5 s later).
    LeaveEarly,
    /// Reads the head and a few events of a long stream, then leaves.
    LeaveMidStream,
    /// Reads the head of a long stream, then stops reading and holds the socket.
    Stall,
    /// A body that is not JSON: 400.
    Malformed,
    /// A body over `--max-body`: 413.
    Oversized,
    /// A path slotgate does not serve: 404.
    UnknownPath,
    /// A known path with the wrong method: 405.
    WrongMethod,
    /// A path the request-guard policy denies: 403.
    Denied,
    /// A header larger than slotgate's connection buffer: 431 or a closed connection, never the pipeline.
    HugeHeader,
}

const MIX: &[(Kind, u32)] = &[
    (Kind::Chat, 28),
    (Kind::Stream, 24),
    (Kind::Models, 4),
    (Kind::LeaveEarly, 10),
    (Kind::LeaveMidStream, 10),
    (Kind::Stall, 4),
    (Kind::Malformed, 4),
    (Kind::Oversized, 4),
    (Kind::UnknownPath, 3),
    (Kind::WrongMethod, 3),
    (Kind::Denied, 3),
    (Kind::HugeHeader, 3),
];

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Chat => "chat",
            Kind::Stream => "stream",
            Kind::Models => "models",
            Kind::LeaveEarly => "leave_early",
            Kind::LeaveMidStream => "leave_mid",
            Kind::Stall => "stall",
            Kind::Malformed => "malformed",
            Kind::Oversized => "oversized",
            Kind::UnknownPath => "unknown_path",
            Kind::WrongMethod => "wrong_method",
            Kind::Denied => "denied",
            Kind::HugeHeader => "huge_header",
        }
    }

    /// Whether slotgate's pipeline sees this request (and so counts an outcome for it).
    fn reaches_pipeline(self) -> bool {
        self != Kind::HugeHeader
    }

    fn pick(rng: &mut fastrand::Rng) -> Kind {
        let total: u32 = MIX.iter().map(|(_, w)| w).sum();
        let mut n = rng.u32(0..total);
        for (kind, w) in MIX {
            if n < *w {
                return *kind;
            }
            n -= w;
        }
        unreachable!("the weights sum to total")
    }
}

/// How one request ended, as its kind sees it.
#[derive(Debug)]
struct End {
    label: String,
    expected: bool,
}

impl End {
    fn ok(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            expected: true,
        }
    }

    fn unexpected(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            expected: false,
        }
    }
}

/// Requests of one kind: how many were sent and how each ended.
#[derive(Clone, Debug, Default)]
pub struct KindStats {
    pub sent: u64,
    pub ends: BTreeMap<String, u64>,
    pub unexpected: u64,
    /// A few unexpected ends with detail, for the report.
    pub examples: Vec<String>,
}

impl KindStats {
    pub fn ended(&self) -> u64 {
        self.ends.values().sum()
    }
}

/// One moment of slotgate: memory, descriptors, and its counters.
#[derive(Clone, Debug)]
pub struct Sample {
    pub elapsed: Duration,
    pub rss_kib: u64,
    pub fds: usize,
    pub sent: u64,
    pub outcomes: BTreeMap<String, u64>,
    pub line: String,
}

/// Everything a run measured, and what failed.
#[derive(Clone, Debug)]
pub struct SoakReport {
    pub opts: SoakOpts,
    pub samples: Vec<Sample>,
    /// Idle RSS (KiB) and fds at the end of warm-up.
    pub warm: (u64, usize),
    /// Idle RSS (KiB) and fds after the traffic stopped.
    pub end: (u64, usize),
    pub rss_growth_pct: f64,
    /// RSS growth between the per-interval samples at half time and at the deadline, both under load:
    /// not an invariant, but it tells a leak (which keeps growing with the traffic) from a high-water
    /// mark reached early (flat in the second half).
    pub rss_second_half_pct: f64,
    pub fd_growth_pct: f64,
    pub kinds: BTreeMap<Kind, KindStats>,
    /// `slotgate_requests_total` by outcome, counted over the soak's traffic.
    pub outcomes: BTreeMap<String, u64>,
    pub reloads: u64,
    /// The invariants, each as (description, held).
    pub checks: Vec<(String, bool)>,
}

impl SoakReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|(_, ok)| *ok)
    }

    pub fn failures(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(c, _)| c.as_str())
            .collect()
    }

    /// The end of the run as text: requests by kind and end, outcomes, growth, invariants.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "requests by kind (sent: ends):");
        for (kind, st) in &self.kinds {
            let ends: Vec<String> = st.ends.iter().map(|(e, n)| format!("{e} {n}")).collect();
            let _ = writeln!(
                s,
                "  {:<13} {:>6}: {}",
                kind.label(),
                st.sent,
                ends.join(", ")
            );
            for ex in &st.examples {
                let _ = writeln!(s, "      unexpected: {ex}");
            }
        }
        let _ = writeln!(s, "slotgate outcomes: {}", fmt_counts(&self.outcomes));
        let _ = writeln!(s, "policy reloads sent: {}", self.reloads);
        let _ = writeln!(
            s,
            "idle after warm-up: RSS {} fds {}; idle at the end: RSS {} fds {}",
            mib(self.warm.0),
            self.warm.1,
            mib(self.end.0),
            self.end.1
        );
        let _ = writeln!(
            s,
            "growth: RSS {:+.1} % (limit {} %), fds {:+.1} % (limit {} %, at least 1 fd)",
            self.rss_growth_pct,
            self.opts.max_rss_growth_pct,
            self.fd_growth_pct,
            self.opts.max_fd_growth_pct
        );
        let _ = writeln!(
            s,
            "RSS under load, half time to the deadline: {:+.1} % (for information)",
            self.rss_second_half_pct
        );
        let _ = writeln!(s, "invariants:");
        for (check, ok) in &self.checks {
            let _ = writeln!(s, "  [{}] {check}", if *ok { "ok" } else { "FAIL" });
        }
        let _ = write!(
            s,
            "soak {}",
            if self.passed() { "PASSED" } else { "FAILED" }
        );
        s
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn fmt_counts(m: &BTreeMap<String, u64>) -> String {
    m.iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resident memory of `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> u64 {
    proc_status(pid, "VmRSS")
}

/// A numeric field of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, `RssFile`, `Threads`), 0 if absent.
pub fn proc_status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The state the workers, the reloader and the monitor share.
struct Shared {
    gate: RunningGate,
    llama: RunningLlama,
    config: PathBuf,
    policies: (PathBuf, PathBuf),
    kinds: Mutex<BTreeMap<Kind, KindStats>>,
    /// Workers and the reloader hold it shared while they act; taking it exclusively pauses them.
    traffic: RwLock<()>,
    stop_at: Instant,
}

impl Shared {
    fn sent(&self, kind: Kind) {
        self.kinds
            .lock()
            .expect("stats lock")
            .entry(kind)
            .or_default()
            .sent += 1;
    }

    fn ended(&self, kind: Kind, end: End) {
        let mut kinds = self.kinds.lock().expect("stats lock");
        let st = kinds.entry(kind).or_default();
        if !end.expected {
            st.unexpected += 1;
            if st.examples.len() < 5 {
                st.examples.push(end.label.clone());
            }
        }
        // An unexpected end's label may carry detail; count it under its first word.
        let key = end.label.split(':').next().unwrap_or("").to_owned();
        *st.ends.entry(key).or_default() += 1;
    }

    fn total_sent(&self) -> u64 {
        self.kinds
            .lock()
            .expect("stats lock")
            .values()
            .map(|s| s.sent)
            .sum()
    }
}

/// Writes the chain's config: token-budget (a budget far above what the soak spends, so it refunds
/// through `on_complete` on every request without refusing any) then request-guard (caps
/// `max_tokens`, denies `/v1/embeddings`). `generation` changes a setting, so a rewrite is a real change.
fn write_config(path: &Path, policies: &(PathBuf, PathBuf), generation: u64) {
    let capacity = 1_000_000_000 + generation;
    let toml = format!(
        "[[policy]]\npath = \"{}\"\nsettings = {{ capacity = {capacity}, refill_per_second = 1000000, \
         default_max_tokens = 64 }}\n\n[[policy]]\npath = \"{}\"\nsettings = {{ max_tokens = 1900, \
         over_max_tokens = \"cap\", max_prompt_chars = 100000, denied_paths = [\"/v1/embeddings\"] }}\n",
        policies.0.display(),
        policies.1.display()
    );
    // Write then rename, so the watcher never reads half a file.
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, toml).expect("write soak config");
    std::fs::rename(&tmp, path).expect("replace soak config");
}

/// Runs the soak and returns what it measured. Prints one line per report interval (and the summary
/// at the end) on stdout as it goes.
pub async fn run(opts: SoakOpts) -> SoakReport {
    let dir = unique_dir("soak");
    let policies = (
        crate::wat::built("token-budget"),
        crate::wat::built("request-guard"),
    );
    let config = dir.join("slotgate.toml");
    write_config(&config, &policies, 0);

    let llama = LlamaServer::start(opts.np).await;
    let gate = Gate::new()
        .upstream_path(llama.socket())
        .admin_unix()
        .slots(opts.np)
        .queue_depth(8)
        .queue_timeout("30s")
        .opt(
            "--client-stall-timeout",
            format!("{}s", STALL_TIMEOUT.as_secs()),
        )
        .max_body(&MAX_BODY.to_string())
        .opt("--config", config.display())
        .opt("--policy-watch", "1s")
        .start()
        .await;
    println!(
        "soak: {:?} of traffic, warm-up {:?}, {} workers, -np {}, seed {}; slotgate pid {} ({})",
        opts.duration,
        opts.warmup,
        opts.workers,
        opts.np,
        opts.seed,
        gate.pid(),
        crate::gate::binary_path().display(),
    );
    let before = outcome_counts(&gate.metrics().await);

    let t0 = Instant::now();
    let shared = Arc::new(Shared {
        gate,
        llama,
        config,
        policies,
        kinds: Mutex::new(BTreeMap::new()),
        traffic: RwLock::new(()),
        stop_at: t0 + opts.duration,
    });

    let mut workers = Vec::new();
    for w in 0..opts.workers {
        let shared = shared.clone();
        let seed = opts.seed.wrapping_mul(1000).wrapping_add(w as u64);
        workers.push(tokio::spawn(worker(shared, seed)));
    }
    let reloader = tokio::spawn(reloader(shared.clone(), opts.reload_every));

    // The monitor: a line per interval, and the idle baseline at the end of warm-up.
    let mut samples = Vec::new();
    let mut warm = None;
    let mut next_report = t0 + opts.report_every;
    let warm_at = t0 + opts.warmup;
    while Instant::now() < shared.stop_at {
        let next = if warm.is_none() {
            next_report.min(warm_at)
        } else {
            next_report
        };
        tokio::time::sleep_until(next.min(shared.stop_at).into()).await;
        if warm.is_none() && Instant::now() >= warm_at {
            let pause = shared.traffic.write().await;
            let idle = quiet(&shared, "warm-up").await;
            println!(
                "[{}] warm-up over: idle RSS {} fds {} (workers paused {:.1} s for it)",
                clock(t0.elapsed()),
                mib(idle.0),
                idle.1,
                (Instant::now() - warm_at).as_secs_f64()
            );
            warm = Some(idle);
            drop(pause);
        }
        if Instant::now() >= next_report {
            let s = sample(&shared, t0, &before).await;
            println!("{}", s.line);
            samples.push(s);
            next_report += opts.report_every;
        }
    }

    for w in workers {
        w.await.expect("soak worker panicked");
    }
    let reloads = reloader.await.expect("soak reloader panicked");
    let end = quiet(&shared, "the end").await;
    let last = sample(&shared, t0, &before).await;
    println!("{}", last.line);
    samples.push(last);
    let warm = warm.unwrap_or(end);

    let kinds = shared.kinds.lock().expect("stats lock").clone();
    let metrics = shared.gate.metrics().await;
    let outcomes = diff(&outcome_counts(&metrics), &before);
    // Summed as integers: an f64 sum of nothing is -0.
    let reloads_by = |result: &str| -> u64 {
        metrics
            .samples
            .iter()
            .filter(|s| s.name == "slotgate_policy_reloads_total")
            .filter(|s| s.labels.iter().any(|(k, v)| k == "result" && v == result))
            .map(|s| s.value as u64)
            .sum()
    };
    let (reloads_ok, reload_errors) = (reloads_by("ok"), reloads_by("error"));
    let status = shared.gate.status().await;
    let llama_busy = shared.llama.busy_slots().await;

    let pct = |from: f64, to: f64| {
        if from > 0.0 {
            (to - from) / from * 100.0
        } else {
            0.0
        }
    };
    let rss_growth_pct = pct(warm.0 as f64, end.0 as f64);
    // Every sample but the last, which was taken on the idle gate after the traffic stopped.
    let under_load = &samples[..samples.len().saturating_sub(1)];
    let half = under_load
        .iter()
        .find(|s| s.elapsed >= opts.duration / 2)
        .map_or(0, |s| s.rss_kib);
    let last = under_load.last().map_or(0, |s| s.rss_kib);
    let rss_second_half_pct = pct(half as f64, last as f64);
    let fd_growth_pct = pct(warm.1 as f64, end.1 as f64);
    let fd_allowance = ((warm.1 as f64 * opts.max_fd_growth_pct / 100.0).floor() as usize).max(1);

    let mut checks = Vec::new();
    let mut check = |what: String, ok: bool| checks.push((what, ok));
    check(
        format!(
            "slotgate idle: queue depth {}, busy {}, inflight {}",
            status["queue"]["depth"], status["slots"]["busy"], status["inflight"]
        ),
        status["queue"]["depth"].as_u64() == Some(0)
            && status["slots"]["busy"].as_u64() == Some(0)
            && status["inflight"].as_u64() == Some(0),
    );
    check(
        format!("llama-server /slots: {llama_busy} processing"),
        llama_busy == 0,
    );
    let unexpected: u64 = kinds.values().map(|k| k.unexpected).sum();
    check(
        format!("every request ended as its kind expects ({unexpected} unexpected ends)"),
        unexpected == 0,
    );
    let unended: Vec<String> = kinds
        .iter()
        .filter(|(_, s)| s.sent != s.ended())
        .map(|(k, s)| format!("{} sent {} ended {}", k.label(), s.sent, s.ended()))
        .collect();
    check(
        format!(
            "every request sent got exactly one end on the client{}",
            if unended.is_empty() {
                String::new()
            } else {
                format!(": {}", unended.join("; "))
            }
        ),
        unended.is_empty(),
    );
    let reached: u64 = kinds
        .iter()
        .filter(|(k, _)| k.reaches_pipeline())
        .map(|(_, s)| s.sent)
        .sum();
    let counted: u64 = outcomes.values().sum();
    check(
        format!("slotgate counted one outcome per request that reached it: {counted} outcomes for {reached} requests"),
        counted == reached,
    );
    let sum_ends = |k: Kind, end: &str| {
        kinds
            .get(&k)
            .and_then(|s| s.ends.get(end))
            .copied()
            .unwrap_or(0)
    };
    let denied = sum_ends(Kind::Denied, "403");
    let policy_denied = outcomes.get("policy_denied").copied().unwrap_or(0);
    check(
        format!("policy_denied outcomes {policy_denied} = denied requests answered 403 {denied}"),
        policy_denied == denied,
    );
    check(
        format!(
            "policy reloads: {reloads_ok} module reloads ok, {reload_errors} failed ({reloads} reloads sent)"
        ),
        // A SIGHUP that changes nothing reloads no module; every second reload rewrites the config.
        reload_errors == 0 && (reloads < 2 || reloads_ok > 0),
    );
    check(
        format!(
            "idle fds {} at the end vs {} after warm-up (at most +{fd_allowance})",
            end.1, warm.1
        ),
        end.1 <= warm.1 + fd_allowance,
    );
    check(
        format!(
            "idle RSS growth {rss_growth_pct:+.1} % <= {} %",
            opts.max_rss_growth_pct
        ),
        rss_growth_pct <= opts.max_rss_growth_pct,
    );

    let report = SoakReport {
        reloads,
        opts,
        samples,
        warm,
        end,
        rss_growth_pct,
        rss_second_half_pct,
        fd_growth_pct,
        kinds,
        outcomes,
        checks,
    };
    println!("{}", report.summary());
    report
}

/// Waits until slotgate and llama-server are idle and slotgate's fds have settled, then returns its
/// idle (RSS KiB, fds). The caller has paused or stopped the traffic.
async fn quiet(shared: &Shared, when: &str) -> (u64, usize) {
    let deadline = Instant::now() + IDLE_LIMIT;
    loop {
        let st = shared.gate.status().await;
        let idle = st["queue"]["depth"].as_u64() == Some(0)
            && st["slots"]["busy"].as_u64() == Some(0)
            && st["inflight"].as_u64() == Some(0);
        if idle && shared.llama.busy_slots().await == 0 {
            break;
        }
        if Instant::now() >= deadline {
            println!("soak: not idle {IDLE_LIMIT:?} after traffic stopped at {when}: {st}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let closed connections and the pooled health-probe connection settle; take the lowest count seen
    // over a couple of seconds, as assert_fds_settled does with its one-fd allowance.
    let mut fds = usize::MAX;
    for _ in 0..20 {
        fds = fds.min(shared.gate.open_fds());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = shared.gate.pid();
    println!(
        "soak: idle at {when}: RSS {} (anon {}, file {}), threads {}, fds {fds}",
        mib(rss_kib(pid)),
        mib(proc_status(pid, "RssAnon")),
        mib(proc_status(pid, "RssFile")),
        proc_status(pid, "Threads")
    );
    (rss_kib(pid), fds)
}

async fn sample(shared: &Shared, t0: Instant, before: &BTreeMap<String, u64>) -> Sample {
    let elapsed = t0.elapsed();
    let rss = rss_kib(shared.gate.pid());
    let fds = shared.gate.open_fds();
    let outcomes = diff(&outcome_counts(&shared.gate.metrics().await), before);
    let sent = shared.total_sent();
    let kinds = shared.kinds.lock().expect("stats lock").clone();
    let by_kind: Vec<String> = kinds
        .iter()
        .map(|(k, s)| format!("{} {}", k.label(), s.sent))
        .collect();
    let pid = shared.gate.pid();
    let line = format!(
        "[{}] rss {:>9} (anon {}, file {}) threads {} fds {:>3} | sent {sent}: {} | outcomes: {}",
        clock(elapsed),
        mib(rss),
        mib(proc_status(pid, "RssAnon")),
        mib(proc_status(pid, "RssFile")),
        proc_status(pid, "Threads"),
        fds,
        by_kind.join(" "),
        fmt_counts(&outcomes)
    );
    Sample {
        elapsed,
        rss_kib: rss,
        fds,
        sent,
        outcomes,
        line,
    }
}

fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:>2}:{:02}", s / 60, s % 60)
}

fn outcome_counts(m: &Metrics) -> BTreeMap<String, u64> {
    m.samples
        .iter()
        .filter(|s| s.name == "slotgate_requests_total")
        .filter_map(|s| {
            let (_, o) = s.labels.iter().find(|(k, _)| k == "outcome")?;
            Some((o.clone(), s.value as u64))
        })
        .collect()
}

fn diff(now: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    now.iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .collect()
}

/// Reloads the chain every `every` until the deadline; returns how many reloads it sent.
async fn reloader(shared: Arc<Shared>, every: Duration) -> u64 {
    let mut generation = 0;
    loop {
        let next = Instant::now() + every;
        if next >= shared.stop_at {
            return generation;
        }
        tokio::time::sleep_until(next.into()).await;
        let _acting = shared.traffic.read().await;
        generation += 1;
        // Alternate the two ways a chain reloads: a signal, and the watcher seeing the file change.
        if generation % 2 == 1 {
            shared.gate.signal("HUP");
        } else {
            write_config(&shared.config, &shared.policies, generation);
        }
    }
}

async fn worker(shared: Arc<Shared>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let client = shared.gate.client();
    while Instant::now() < shared.stop_at {
        let _acting = shared.traffic.read().await;
        let kind = Kind::pick(&mut rng);
        shared.sent(kind);
        let end = match tokio::time::timeout(REQUEST_LIMIT, one(&client, kind, &mut rng)).await {
            Ok(end) => end,
            Err(_) => End::unexpected(format!("hung: no end within {REQUEST_LIMIT:?}")),
        };
        shared.ended(kind, end);
    }
}

/// Sends one request of `kind` and says how it ended.
async fn one(client: &Client, kind: Kind, rng: &mut fastrand::Rng) -> End {
    match kind {
        Kind::Chat => chat(client, rng.u64(8..=32)).await,
        Kind::Stream => stream(client, rng.u64(8..=32)).await,
        Kind::Models => {
            let req = request("GET", "/v1/models", Bytes::new());
            expect_status(client.try_send(req).await, 200)
        }
        Kind::LeaveEarly => {
            let wait = Duration::from_millis(rng.u64(100..=1500));
            let body = llama::chat(PROMPT, 64, rng.bool());
            match tokio::time::timeout(wait, client.try_stream(CHAT, &body)).await {
                Err(_) => End::ok("left_before_head"),
                Ok(Ok(s)) if s.status == 200 => End::ok("left_after_head"),
                Ok(Ok(s)) => refusal_head(s).await,
                Ok(Err(e)) => End::unexpected(format!("transport: {e:#}")),
            }
        }
        Kind::LeaveMidStream => {
            let events = rng.usize(1..=6);
            let body = llama::chat(PROMPT, 200, true);
            match client.try_stream(CHAT, &body).await {
                Ok(mut s) if s.status == 200 => {
                    for _ in 0..events {
                        match s.next_chunk().await {
                            Some(Ok(_)) => {}
                            None => return End::ok("ended_before_leaving"),
                            Some(Err(e)) => return End::unexpected(format!("broken: {e}")),
                        }
                    }
                    End::ok("left_mid_stream")
                }
                Ok(s) => refusal_head(s).await,
                Err(e) => End::unexpected(format!("transport: {e:#}")),
            }
        }
        Kind::Stall => stall(client).await,
        Kind::Malformed => {
            let req = request(
                "POST",
                CHAT,
                Bytes::from_static(b"{\"messages\": [{\"role\": "),
            );
            expect_status(client.try_send(req).await, 400)
        }
        Kind::Oversized => {
            let mut body = llama::chat(PROMPT, 8, false);
            body["padding"] = "x".repeat(MAX_BODY + 1024).into();
            let req = request("POST", CHAT, Bytes::from(body.to_string()));
            expect_status(client.try_send(req).await, 413)
        }
        Kind::UnknownPath => {
            let req = request("POST", "/v1/nothing-here", Bytes::from_static(b"{}"));
            expect_status(client.try_send(req).await, 404)
        }
        Kind::WrongMethod => {
            let req = request("GET", CHAT, Bytes::new());
            expect_status(client.try_send(req).await, 405)
        }
        Kind::Denied => {
            let body = json!({"input": "soak", "model": "x"}).to_string();
            let req = request("POST", "/v1/embeddings", Bytes::from(body));
            expect_status(client.try_send(req).await, 403)
        }
        Kind::HugeHeader => huge_header(client).await,
    }
}

fn request(method: &str, path: &str, body: Bytes) -> http::Request<Full<Bytes>> {
    let method = http::Method::from_bytes(method.as_bytes()).expect("a method");
    client::json_request(method, path, body)
}

fn expect_status(sent: anyhow::Result<client::Response>, want: u16) -> End {
    match sent {
        Ok(r) if r.status == want => End::ok(want.to_string()),
        Ok(r) => End::unexpected(format!("{}: {}", r.status.as_u16(), r.body)),
        Err(e) => End::unexpected(format!("transport: {e:#}")),
    }
}

/// A refusal a well-behaved client may get under load: a listed status with the OpenAI error shape.
fn refusal(status: u16, body: &str) -> End {
    let shaped = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(|_| ()))
        .is_some();
    if REFUSALS.contains(&status) && shaped {
        End::ok(status.to_string())
    } else {
        End::unexpected(format!("{status}: {body}"))
    }
}

async fn refusal_head(s: Streaming) -> End {
    let status = s.status.as_u16();
    let (raw, error) = read_body(s).await;
    match error {
        None => refusal(status, &raw),
        Some(e) => End::unexpected(format!("{status} body broke: {e}")),
    }
}

/// Reads a streamed body to its end; (text, the error it ended with).
async fn read_body(mut s: Streaming) -> (String, Option<String>) {
    let mut raw = String::new();
    while let Some(chunk) = s.next_chunk().await {
        match chunk {
            Ok(b) => raw.push_str(&String::from_utf8_lossy(&b)),
            Err(e) => return (raw, Some(e)),
        }
    }
    (raw, None)
}

async fn chat(client: &Client, max_tokens: u64) -> End {
    let body = llama::chat(PROMPT, max_tokens, false);
    match client.try_post_json(CHAT, &body).await {
        Ok(r) if r.status == 200 => {
            let v: Value = serde_json::from_str(&r.body).unwrap_or_default();
            match v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
            {
                Some(n) if n == max_tokens => End::ok("200"),
                _ => End::unexpected(format!("200 without {max_tokens} tokens: {}", r.body)),
            }
        }
        Ok(r) => refusal(r.status.as_u16(), &r.body),
        Err(e) => End::unexpected(format!("transport: {e:#}")),
    }
}

async fn stream(client: &Client, max_tokens: u64) -> End {
    let body = llama::chat(PROMPT, max_tokens, true);
    let s = match client.try_stream(CHAT, &body).await {
        Ok(s) => s,
        Err(e) => return End::unexpected(format!("transport: {e:#}")),
    };
    if s.status != 200 {
        return refusal_head(s).await;
    }
    let (raw, error) = read_body(s).await;
    let (data, done) = client::parse_sse(&raw);
    let usage = data
        .iter()
        .rev()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|c| {
            c.pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
        });
    match (done, error, usage) {
        (true, None, Some(n)) if n == max_tokens => End::ok("200_done"),
        (done, error, usage) => End::unexpected(format!(
            "stream: done {done}, error {error:?}, usage {usage:?} for {max_tokens}"
        )),
    }
}

/// A client that reads the head of a long stream, then stops reading for longer than the stall
/// timeout, then reads what is left: slotgate must have cut it (no `[DONE]`, the socket closed).
/// Each token carries 20 log-probabilities (~2.5 KB), so the answer overflows the socket buffers
/// after a hundred or so tokens and slotgate's writes block.
async fn stall(client: &Client) -> End {
    let mut body = llama::chat(PROMPT, 600, true);
    body["logprobs"] = true.into();
    body["top_logprobs"] = 20.into();
    let body = body.to_string();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut sock = client.raw_unix().await;
    if let Err(e) = sock.write_all((head + &body).as_bytes()).await {
        return End::unexpected(format!("write: {e}"));
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut buf).await {
            Ok(0) | Err(_) => return End::unexpected("closed before the head"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let status = client::raw_status(&got).unwrap_or(0);
    if status != 200 {
        let rest = read_until_closed(&mut sock, Duration::from_secs(10))
            .await
            .unwrap_or_default();
        got.extend_from_slice(&rest);
        return refusal(status, &client::raw_body(&got));
    }
    tokio::time::sleep(STALL_TIMEOUT + Duration::from_secs(3)).await;
    match read_until_closed(&mut sock, REQUEST_LIMIT / 2).await {
        None => End::unexpected("still open long after the stall timeout"),
        Some(rest) => {
            got.extend_from_slice(&rest);
            if String::from_utf8_lossy(&got).contains("data: [DONE]") {
                // The whole answer fit in the buffers before the stall mattered: not a cut, not a fault.
                End::ok("complete")
            } else {
                End::ok("cut")
            }
        }
    }
}

/// A request whose one header is larger than slotgate's connection buffer. slotgate answers 431 or
/// closes; either way the connection must close, and the pipeline never sees it.
async fn huge_header(client: &Client) -> End {
    let mut sock = client.raw_unix().await;
    let req = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\nx-soak: {}\r\ncontent-length: 2\r\n\r\n{{}}",
        "h".repeat(128 * 1024)
    );
    // The server may close before the whole header is written; that is one of the expected ends.
    let _ = sock.write_all(req.as_bytes()).await;
    match read_until_closed(&mut sock, Duration::from_secs(30)).await {
        None => End::unexpected("still open 30 s after a header over the limit"),
        Some(got) => match client::raw_status(&got) {
            Some(431) => End::ok("431"),
            None => End::ok("closed"),
            Some(s) => End::unexpected(format!("{s}: {}", String::from_utf8_lossy(&got))),
        },
    }
}
