//! Hostile policies, gate-level: every way a policy can misbehave ends in bounded time with the configured
//! failure mode, while the gate keeps serving everyone else.
//!
//! Evaluate-time cases (the module loads and passes its canary, then misbehaves on some requests): a
//! runaway loop, a memory-growth bomb, unbounded recursion, a trap, bad outputs (too long, outside
//! memory, not JSON, not a decision, none) and a loop of host calls. Their policies come from
//! [`wat::hostile`]: they allow every request except those whose evaluate input contains
//! [`wat::MARKER`] (sent as the body's `model`), on which the hostile code runs. Each scenario sends
//! rounds of hostile requests with ordinary ones through the same gate and asserts that:
//! - every ordinary request is answered 200 by the upstream itself (no collateral damage);
//! - every hostile request ends within [`HOSTILE_BOUND`]: 503 `policy_error` naming the policy and the
//!   failure's kind with `on-error = "deny"` (the default), or served 200 with `on-error = "allow"`;
//! - `slotgate_policy_errors_total{policy,kind}` counted exactly the hostile evaluations, under the
//!   right kind, and `slotgate_requests_total` the right outcomes;
//! - the gate settles (nothing queued, busy or in flight), `/livez` answers 200 and the process lives.
//!
//! Load-time cases (a module that cannot be loaded: a start function or ABI call that never returns,
//! missing or mistyped exports, a foreign import, a wrong ABI version): `slotgate run` refuses to start
//! within [`LOAD_BOUND`], exits non-zero naming the policy and the reason, and never binds its socket;
//! `slotgate check` and `slotgate policy check` refuse the module too.
//!
//! The deadline counts the time an evaluation ran (a busy machine extends it, up to a wall-clock
//! ceiling of 10 deadlines). Wherever the deadline is not what a case is about, its entry still gets
//! [`SLACK`], so that fuel or memory, not the clock, ends it and the failure kinds are exact.
//!
//! `the_marker_selects_only_hostile_requests` is the suite's control: it proves the marker separates
//! the two kinds of traffic, so the other cases cannot pass by accident.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use slotgate_tests::errors::assert_error;
use slotgate_tests::*;

/// Slots of every scenario's gate.
const SLOTS: usize = 2;
/// Room for every ordinary request of a round and every fail-open hostile one at once.
const QUEUE: usize = 32;
/// Rounds of a mixed load; each sends [`HOSTILE_PER_ROUND`] hostile and [`NORMAL_PER_ROUND`]
/// ordinary requests at once.
const ROUNDS: usize = 3;
const HOSTILE_PER_ROUND: usize = 2;
const NORMAL_PER_ROUND: usize = 4;
const HOSTILE: usize = ROUNDS * HOSTILE_PER_ROUND;
const NORMAL: usize = ROUNDS * NORMAL_PER_ROUND;
/// How long a hostile request may take, end to end: generous (default deadline 20 ms), only a bound.
const HOSTILE_BOUND: Duration = Duration::from_secs(5);
/// A `[[policy]]` deadline for cases about something else than the deadline (see the module doc).
const SLACK: &str = "deadline = \"2s\"";
/// How long `slotgate` may take to refuse a bad module and exit.
const LOAD_BOUND: Duration = Duration::from_secs(30);

const ERRORS: &str = "slotgate_policy_errors_total";
const DECISIONS: &str = "slotgate_policy_decisions_total";
/// The decision every [`wat::policy`] module answers when nothing hostile happens.
const ALLOW: &str = r#"{"verdict":"allow"}"#;

// ---------------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------------

/// One `[[policy]]` entry of a scenario.
struct Entry {
    /// The policy's name (its file stem): the `policy` label and the name in error messages.
    name: String,
    path: PathBuf,
    /// More lines of its `[[policy]]` table: limits such as `fuel = 1000000` ([`SLACK`] unless set).
    limits: String,
    /// The error kinds its hostile evaluations may end in; empty if it must answer them normally.
    kinds: &'static [&'static str],
}

impl Entry {
    /// A [`wat::hostile`] policy running `hostile` (with module fields `extra`) on marked requests.
    fn hostile(dir: &Path, name: &str, hostile: &str, extra: &str) -> Self {
        Self::at(name, wat::hostile(dir, name, hostile, extra))
    }

    /// The policy at `path`, its deadline [`SLACK`].
    fn at(name: &str, path: PathBuf) -> Self {
        Entry {
            name: name.to_owned(),
            path,
            limits: SLACK.to_owned(),
            kinds: &[],
        }
    }

    fn limits(mut self, toml: &str) -> Self {
        self.limits = toml.to_owned();
        self
    }

    fn fails_with(mut self, kinds: &'static [&'static str]) -> Self {
        self.kinds = kinds;
        self
    }
}

/// A fresh gate and fake upstream with `chain` configured, every entry with `on-error = on_error`.
async fn start(dir: &Path, chain: &[&Entry], on_error: &str) -> (RunningUpstream, RunningGate) {
    let mut text = String::new();
    for e in chain {
        text.push_str(&format!(
            "[[policy]]\npath = \"{}\"\non-error = \"{on_error}\"\n{}\n\n",
            e.path.display(),
            e.limits
        ));
    }
    let config = dir.join(format!("slotgate-{on_error}.toml"));
    std::fs::write(&config, text).expect("write config");
    // The flood below is 300 connections of one uid at once, past the per-peer default (256).
    Gate::new()
        .slots(SLOTS)
        .queue_depth(QUEUE)
        .opt("--max-connections-per-peer", 512)
        .config_file(&config)
        .start_instant()
        .await
}

/// A request whose evaluate input carries the marker: the policies under test turn hostile on it.
fn hostile_req(tag: &str) -> Req {
    Req::chat(tag).set("model", wat::MARKER)
}

/// An ordinary request, held a little while at the upstream so that slots are really in use.
fn normal_req(tag: &str) -> Req {
    Req::chat(tag).delay(ms(5))
}

/// One request of a load and how it ended.
struct Sent {
    tag: String,
    resp: Response,
    took: Duration,
}

/// Hostile and ordinary requests of one mixed load.
struct Mixed {
    hostile: Vec<Sent>,
    normal: Vec<Sent>,
}

async fn collect(
    handles: Vec<(String, tokio::task::JoinHandle<(Response, Duration)>)>,
) -> Vec<Sent> {
    let (tags, handles): (Vec<_>, Vec<_>) = handles.into_iter().unzip();
    tags.into_iter()
        .zip(join_all(handles).await)
        .map(|(tag, (resp, took))| Sent { tag, resp, took })
        .collect()
}

/// [`ROUNDS`] rounds: each starts [`HOSTILE_PER_ROUND`] hostile requests and, while their evaluations
/// run, [`NORMAL_PER_ROUND`] ordinary ones, and waits only for the ordinary ones. The hostile ones are
/// collected at the end.
async fn mixed_load(gate: &RunningGate) -> Mixed {
    let client = gate.client();
    let mut hostile = Vec::new();
    let mut normal = Vec::new();
    for round in 0..ROUNDS {
        for i in 0..HOSTILE_PER_ROUND {
            let tag = format!("hostile-{round}-{i}");
            hostile.push((tag.clone(), spawn_post(&client, CHAT, &hostile_req(&tag))));
        }
        let batch = (0..NORMAL_PER_ROUND)
            .map(|i| {
                let tag = format!("normal-{round}-{i}");
                (tag.clone(), spawn_post(&client, CHAT, &normal_req(&tag)))
            })
            .collect();
        normal.extend(collect(batch).await);
    }
    Mixed {
        hostile: collect(hostile).await,
        normal,
    }
}

/// Every ordinary request was answered 200 by the upstream (it echoes the request's tag).
fn assert_normal_served(load: &Mixed) {
    for s in &load.normal {
        assert_eq!(
            s.resp.status, 200,
            "ordinary request {} sent alongside hostile ones: {}",
            s.tag, s.resp.body
        );
        assert_eq!(
            s.resp.tag().as_deref(),
            Some(s.tag.as_str()),
            "{}",
            s.resp.body
        );
    }
}

/// The upstream saw exactly the requests of `groups` (the same tags, each once).
fn assert_upstream_saw(up: &RunningUpstream, groups: &[&[Sent]]) {
    let mut want: Vec<String> = groups
        .iter()
        .flat_map(|g| g.iter().map(|s| s.tag.clone()))
        .collect();
    want.sort();
    let mut seen = up.tags();
    seen.sort();
    assert_eq!(seen, want, "the requests that reached the upstream");
}

/// `(policy, kind)` named by a fail-closed 503's message.
fn failure_named(resp: &Response) -> (String, String) {
    let message = resp.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let between = |open: char, close: char| {
        let start = message.find(open).map(|i| i + 1)?;
        let len = message[start..].find(close)?;
        Some(message[start..start + len].to_owned())
    };
    match (between('`', '`'), between('(', ')')) {
        (Some(p), Some(k)) => (p, k),
        _ => panic!("a policy_error names its policy and kind: {message}"),
    }
}

/// The per-policy counters after one mixed load: the failing policies counted [`HOSTILE`] errors, all
/// of their own kinds; the others (and the failing ones on ordinary requests) counted allows.
async fn assert_policy_counters(gate: &RunningGate, chain: &[&Entry]) {
    let m = gate.metrics().await;
    for e in chain {
        let p = e.name.as_str();
        let errors = m.sum(ERRORS, &[("policy", p)]);
        let allows = m.value_or_zero(DECISIONS, &[("policy", p), ("decision", "allow")]);
        if e.kinds.is_empty() {
            assert_eq!(errors, 0.0, "policy {p} must not fail:\n{}", m.text);
            assert_eq!(allows, (NORMAL + HOSTILE) as f64, "{p}:\n{}", m.text);
            continue;
        }
        let of_kinds: f64 = e
            .kinds
            .iter()
            .map(|k| m.value_or_zero(ERRORS, &[("policy", p), ("kind", k)]))
            .sum();
        assert_eq!(
            (of_kinds, errors),
            (HOSTILE as f64, HOSTILE as f64),
            "{p}: every hostile evaluation counted once, as one of {:?}:\n{}",
            e.kinds,
            m.text
        );
        let failed = m.value_or_zero(DECISIONS, &[("policy", p), ("decision", "error")]);
        assert_eq!(failed, HOSTILE as f64, "{p}:\n{}", m.text);
        assert_eq!(allows, NORMAL as f64, "{p}:\n{}", m.text);
    }
}

/// How every scenario ends: still serving, settled, live, and not exited.
async fn assert_settled_and_alive(gate: &mut RunningGate, up: &RunningUpstream) {
    let after = gate.client().post_chat(&Req::chat("after")).await;
    assert_eq!(after.status, 200, "served after the storm: {}", after.body);
    gate.assert_settled(up, SLOTS).await;
    assert_eq!(gate.livez().await, 200);
    assert!(
        gate.try_exited().is_none(),
        "slotgate exited; stderr:\n{}",
        gate.stderr_text()
    );
}

/// `on-error = "deny"`: a mixed load through `chain`; hostile requests fail closed in bounded time,
/// named after the first failing policy and one of its kinds; nothing else is disturbed.
async fn assert_fails_closed(dir: &Path, chain: &[&Entry]) {
    let culprit = chain
        .iter()
        .find(|e| !e.kinds.is_empty())
        .expect("a chain with a failing policy");
    let (up, mut gate) = start(dir, chain, "deny").await;
    let load = mixed_load(&gate).await;

    assert_normal_served(&load);
    for s in &load.hostile {
        assert_error(&s.resp, 503, "policy_error");
        let (policy, kind) = failure_named(&s.resp);
        assert_eq!(policy, culprit.name, "{}", s.resp.body);
        assert!(culprit.kinds.contains(&kind.as_str()), "{}", s.resp.body);
        assert!(
            s.took < HOSTILE_BOUND,
            "{} took {:?} to fail",
            s.tag,
            s.took
        );
    }
    assert_upstream_saw(&up, &[&load.normal]);
    gate.wait_outcome("policy_error", HOSTILE as u64).await;
    gate.wait_outcome("ok", NORMAL as u64).await;
    assert_policy_counters(&gate, chain).await;
    let log = gate.stderr_text();
    assert!(
        log.contains("policy evaluation failed")
            && log.contains(&format!("policy={} ", culprit.name)),
        "the failures are logged with the policy's name:\n{log}"
    );
    assert_settled_and_alive(&mut gate, &up).await;
}

/// `on-error = "allow"`: the same mixed load; hostile requests are served as if allowed (in bounded
/// time), and the errors are still counted.
async fn assert_fails_open(dir: &Path, chain: &[&Entry]) {
    let (up, mut gate) = start(dir, chain, "allow").await;
    let load = mixed_load(&gate).await;

    assert_normal_served(&load);
    for s in &load.hostile {
        assert_eq!(
            s.resp.status, 200,
            "fail open serves {}: {}",
            s.tag, s.resp.body
        );
        assert_eq!(s.resp.tag().as_deref(), Some(s.tag.as_str()));
        assert!(s.took < HOSTILE_BOUND, "{} took {:?}", s.tag, s.took);
    }
    assert_upstream_saw(&up, &[&load.normal, &load.hostile]);
    gate.wait_outcome("ok", (NORMAL + HOSTILE) as u64).await;
    assert_eq!(
        gate.metrics()
            .await
            .value_or_zero("slotgate_requests_total", &[("outcome", "policy_error")]),
        0.0
    );
    assert_policy_counters(&gate, chain).await;
    assert_settled_and_alive(&mut gate, &up).await;
}

/// Both failure modes for one hostile policy; `open_limits` replaces its limits in the fail-open run.
async fn assert_contained(dir: &Path, entry: Entry, open_limits: Option<&str>) {
    assert_fails_closed(dir, &[&entry]).await;
    let entry = match open_limits {
        Some(l) => entry.limits(l),
        None => entry,
    };
    assert_fails_open(dir, &[&entry]).await;
}

/// Runs the binary with `args` (clean environment); it must exit within [`LOAD_BOUND`].
async fn slotgate(args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::from(gate::command());
    cmd.args(args).kill_on_drop(true);
    tokio::time::timeout(LOAD_BOUND, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("`slotgate {}` ran past {LOAD_BOUND:?}", args.join(" ")))
        .expect("run slotgate")
}

/// `policy` (limits `limits`, as `(key, value)` of its `[[policy]]` entry and `policy check` flags) is
/// refused before anything is served: `slotgate run` exits non-zero within [`LOAD_BOUND`] naming the
/// policy and one of `reasons`, without creating its listen socket; `slotgate check` and (when
/// `policy_check`) `slotgate policy check` exit 2 with the same reason.
async fn assert_refused(
    policy: &Path,
    limits: &[(&str, &str)],
    reasons: &[&str],
    policy_check: bool,
) {
    let name = policy.file_stem().unwrap().to_str().unwrap();
    let dir = unique_dir("refused");
    let mut text = format!("[[policy]]\npath = \"{}\"\n", policy.display());
    for (k, v) in limits {
        match v.parse::<u64>() {
            Ok(n) => text.push_str(&format!("{k} = {n}\n")),
            Err(_) => text.push_str(&format!("{k} = \"{v}\"\n")),
        }
    }
    let config = dir.join("slotgate.toml");
    std::fs::write(&config, text).unwrap();
    let named = |what: &str, err: &str| {
        assert!(
            err.contains(&format!("policy `{name}`")) || err.contains(&format!("{name}.wat")),
            "{what} names the policy: {err}"
        );
        assert!(
            reasons.iter().any(|r| err.contains(r)),
            "{what} gives one of the reasons {reasons:?}: {err}"
        );
    };

    let sock = dir.join("never.sock");
    let started = Instant::now();
    let out = Gate::new()
        .listen_unix(&sock)
        .config_file(&config)
        .upstream_url("http://127.0.0.1:1")
        .run_to_exit(LOAD_BOUND)
        .await;
    assert!(
        !out.status.success(),
        "slotgate started with {name}: {}",
        out.stderr
    );
    named("slotgate run", &out.stderr);
    assert!(!sock.exists(), "nothing is bound before the policies load");
    assert!(started.elapsed() < LOAD_BOUND);

    let out = slotgate(&["check", "--config", config.to_str().unwrap()]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "slotgate check: {err}");
    named("slotgate check", &err);

    if policy_check {
        let mut args = vec![
            "policy".to_owned(),
            "check".into(),
            policy.display().to_string(),
        ];
        for (k, v) in limits {
            args.extend([format!("--{k}"), (*v).to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = slotgate(&args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "slotgate policy check: {err}");
        named("slotgate policy check", &err);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rewrites the module at `path` into `<name>.wat` with `from` replaced by `to` (which must occur).
fn variant(path: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} is not in {}", path.display());
    let out = path.with_file_name(format!("{name}.wat"));
    std::fs::write(&out, text.replace(from, to)).unwrap();
    out
}

// ---------------------------------------------------------------------------------------------------
// The control: the marker separates hostile from ordinary traffic
// ---------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_marker_selects_only_hostile_requests() {
    let dir = unique_dir("hostile-marker");
    let deny = br#"{"verdict":"deny","status":403,"message":"marked"}"#;
    let policy = wat::hostile(
        &dir,
        "marked",
        &wat::output(1024, deny.len() as u32),
        &wat::data(1024, deny),
    );
    let entry = Entry::at("marked", policy);
    let (up, mut gate) = start(&dir, &[&entry], "deny").await;
    let load = mixed_load(&gate).await;
    assert_normal_served(&load);
    for s in &load.hostile {
        assert_error(&s.resp, 403, "policy_denied");
        assert!(s.resp.body.contains("marked"), "{}", s.resp.body);
    }
    assert_upstream_saw(&up, &[&load.normal]);
    let m = gate.metrics().await;
    let decided = |d: &str| m.value_or_zero(DECISIONS, &[("policy", "marked"), ("decision", d)]);
    assert_eq!(
        (decided("allow"), decided("deny"), m.sum(ERRORS, &[])),
        (NORMAL as f64, HOSTILE as f64, 0.0),
        "{}",
        m.text
    );
    assert_settled_and_alive(&mut gate, &up).await;
}

// ---------------------------------------------------------------------------------------------------
// Evaluate-time cases
// ---------------------------------------------------------------------------------------------------

/// 1. A loop that never ends is cut off by the fuel or the deadline, whichever comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_endless_loop_is_cut_off_by_fuel_or_deadline() {
    let dir = unique_dir("hostile-spin");
    let spin = "(loop $spin (br $spin))";
    // The default fuel (10M) against a deadline with room for the ordinary evaluations (see the
    // module doc): whichever comes first.
    let entry = Entry::hostile(&dir, "spin", spin, "")
        .limits("deadline = \"100ms\"")
        .fails_with(&["fuel", "timeout"]);
    assert_fails_closed(&dir, &[&entry]).await;
    // Either limit alone ends it too.
    let fuel_only = Entry::hostile(&dir, "spin-fuel", spin, "")
        .limits("fuel = 1000000\ndeadline = \"10s\"")
        .fails_with(&["fuel"]);
    assert_fails_open(&dir, &[&fuel_only]).await;
    let deadline_only = Entry::hostile(&dir, "spin-deadline", spin, "")
        .limits("fuel = 100000000000\ndeadline = \"200ms\"")
        .fails_with(&["timeout"]);
    assert_fails_open(&dir, &[&deadline_only]).await;
}

/// 1b. Ordinary requests are served *while* runaway evaluations are still running: with a deadline of
/// seconds, they are all answered before the first hostile request is (which then fails open).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ordinary_requests_are_served_while_a_runaway_evaluation_runs() {
    let dir = unique_dir("hostile-overlap");
    let deadline = Duration::from_secs(1);
    let entry = Entry::hostile(&dir, "stuck", "(loop $spin (br $spin))", "")
        .limits("fuel = 100000000000\ndeadline = \"1s\"");
    let (up, mut gate) = start(&dir, &[&entry], "allow").await;
    let client = gate.client();
    let started = Instant::now();
    let stuck: Vec<_> = (0..2)
        .map(|i| spawn_post(&client, CHAT, &hostile_req(&format!("stuck-{i}"))))
        .collect();
    tokio::time::sleep(ms(100)).await;
    for i in 0..6 {
        let tag = format!("meanwhile-{i}");
        let resp = client.post_json(CHAT, &normal_req(&tag).json()).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert_eq!(resp.tag().as_deref(), Some(tag.as_str()));
    }
    let served_in = started.elapsed();
    assert!(
        served_in < deadline,
        "ordinary requests took {served_in:?}, more than the runaway evaluations' {deadline:?}"
    );
    assert!(
        stuck.iter().all(|h| !h.is_finished()),
        "the runaway evaluations ended before their {deadline:?} deadline"
    );
    for (resp, took) in join_all(stuck).await {
        assert_eq!(resp.status, 200, "fail open: {}", resp.body);
        // The deadline counts the time the evaluation ran; on a busy machine it ends at the latest
        // at the wall-clock ceiling of 10 deadlines.
        assert!(took < deadline * 10 + HOSTILE_BOUND, "took {took:?}");
    }
    let m = gate.metrics().await;
    m.assert_value(ERRORS, &[("policy", "stuck"), ("kind", "timeout")], 2.0);
    assert_settled_and_alive(&mut gate, &up).await;
}

/// 1d. A fast chain is evaluated inline on the async worker that serves the request (no hand-off to
/// the blocking pool; the worker's other tasks move to another thread meanwhile). Its first runaway
/// evaluation, inline, holds up no ordinary request, ends by its deadline and moves that chain
/// version to the blocking pool for good, so later runaways, even several at once, are evaluated
/// there: ordinary requests are served while they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runaway_evaluation_moves_an_inline_chain_to_the_blocking_pool() {
    let dir = unique_dir("hostile-inline");
    let deadline = Duration::from_millis(400);
    let entry = Entry::hostile(&dir, "sometimes", "(loop $spin (br $spin))", "")
        .limits("fuel = 100000000000\ndeadline = \"400ms\"");
    let (up, mut gate) = start(&dir, &[&entry], "deny").await;
    let client = gate.client();
    let evaluated = |s: serde_json::Value| s["policies"]["evaluated"].as_str().map(str::to_owned);
    for i in 0..5 {
        let resp = client
            .post_json(CHAT, &normal_req(&format!("fast-{i}")).json())
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    let status = gate.status().await;
    assert_eq!(
        evaluated(status.clone()).as_deref(),
        Some("inline"),
        "{status} {}",
        gate.stderr_text()
    );

    for (resp, _) in served_beside_runaways(&client, 1, "first", deadline).await {
        assert_error(&resp, 503, "policy_error");
    }
    assert_eq!(
        evaluated(gate.status().await).as_deref(),
        Some("blocking_pool"),
        "the runaway moved the chain"
    );
    assert!(gate
        .stderr_text()
        .contains("policy chain now evaluated on the blocking pool"));

    // Two runaways at once, as many as the gate has workers: on the blocking pool, so ordinary
    // requests are all served before either ends.
    for (resp, _) in served_beside_runaways(&client, 2, "later", deadline).await {
        assert_error(&resp, 503, "policy_error");
    }
    let m = gate.metrics().await;
    m.assert_value(ERRORS, &[("policy", "sometimes"), ("kind", "timeout")], 3.0);
    assert_settled_and_alive(&mut gate, &up).await;
}

/// Sends `runaways` hostile requests (tagged `tag-N`), then six ordinary ones one after another, and
/// checks those were all served before any runaway ended (within `deadline`). Returns the runaways'
/// answers.
async fn served_beside_runaways(
    client: &Client,
    runaways: usize,
    tag: &str,
    deadline: Duration,
) -> Vec<(Response, Duration)> {
    let started = Instant::now();
    let stuck: Vec<_> = (0..runaways)
        .map(|i| spawn_post(client, CHAT, &hostile_req(&format!("{tag}-{i}"))))
        .collect();
    tokio::time::sleep(ms(50)).await;
    for i in 0..6 {
        let resp = client
            .post_json(CHAT, &normal_req(&format!("beside-{tag}-{i}")).json())
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    let served_in = started.elapsed();
    assert!(
        served_in < deadline && stuck.iter().all(|h| !h.is_finished()),
        "ordinary requests took {served_in:?}: they waited for the runaway evaluations ({deadline:?})"
    );
    join_all(stuck).await
}

/// 1c. A flood of runaway evaluations, more than the engine's pool of 256 instances, all end as
/// `timeout` (evaluations take turns, at most 64 at once, so none can fail for want of an instance),
/// and an ordinary request sent in the middle of it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_runaway_evaluations_all_end_by_their_deadline() {
    const FLOOD: usize = 300;
    let dir = unique_dir("hostile-flood");
    let entry = Entry::hostile(&dir, "flood", "(loop $spin (br $spin))", "")
        .limits("fuel = 100000000000\ndeadline = \"5ms\"");
    let (up, mut gate) = start(&dir, &[&entry], "deny").await;
    let client = gate.client();
    let flood: Vec<_> = (0..FLOOD)
        .map(|i| spawn_post(&client, CHAT, &hostile_req(&format!("flood-{i}"))))
        .collect();
    let resp = client.post_json(CHAT, &normal_req("ordinary").json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    for (resp, _) in join_all(flood).await {
        assert_error(&resp, 503, "policy_error");
    }
    let m = gate.metrics().await;
    assert_eq!(
        m.value_or_zero(ERRORS, &[("policy", "flood"), ("kind", "timeout")]),
        FLOOD as f64,
        "every runaway evaluation ends by its deadline, none for want of an instance: {}",
        m.text
    );
    assert_settled_and_alive(&mut gate, &up).await;
}

/// 2. Growing memory without end hits the policy's memory cap, which ends the evaluation (kind
/// `memory`) instead of letting the module see -1 and answer anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_bomb_hits_the_memory_cap() {
    let dir = unique_dir("hostile-memory");
    // Keeps growing while growth succeeds; if a failed growth returned -1 to it, it would allow.
    let bomb = "(loop $grow (br_if $grow (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))";
    let entry = Entry::hostile(&dir, "bomb", bomb, "").fails_with(&["memory"]);
    // Default cap (16 MiB) failing closed; a configured 1 MiB cap failing open.
    let one_mib = format!("memory = \"1MiB\"\n{SLACK}");
    assert_contained(&dir, entry, Some(&one_mib)).await;
}

/// 3. Unbounded recursion overflows the wasm stack: a trap, never a crash of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deep_recursion_overflows_the_stack_as_a_trap() {
    let dir = unique_dir("hostile-recursion");
    // Every frame also keeps a few locals alive, so the stack fills fast.
    let deep = "(func $deep (param $d i64) (result i64)
    (local $a i64) (local $b i64) (local $c i64)
    (local.set $a (i64.add (local.get $d) (i64.const 1)))
    (local.set $b (call $deep (local.get $a)))
    (local.set $c (i64.add (local.get $b) (local.get $a)))
    (local.get $c))";
    let entry = Entry::hostile(&dir, "recurse", "(drop (call $deep (i64.const 0)))", deep)
        .fails_with(&["trap"]);
    // The overflow is caught inside the blocking thread: the process lives on (checked by
    // `assert_settled_and_alive`).
    assert_contained(&dir, entry, None).await;
}

/// 4. `unreachable`: a plain trap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trap_fails_the_request_not_the_gate() {
    let dir = unique_dir("hostile-trap");
    let entry = Entry::hostile(&dir, "trap", "unreachable", "").fails_with(&["trap"]);
    assert_contained(&dir, entry, None).await;
}

/// 5. Outputs the host must refuse, each from its own policy in one chain: longer than the 64 KiB
/// limit (by one byte, and by gigabytes), outside the guest's memory (just past its end, and near
/// 4 GiB), not JSON, JSON that is not a valid decision, a deny with a status other than 403/429, and
/// no output at all. A policy answering exactly 64 KiB (a decision padded with spaces) comes first
/// and is accepted: the limit is the documented one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_outputs_are_refused() {
    let dir = unique_dir("hostile-output");
    const LIMIT: u32 = 64 << 10;
    const PAGE: u32 = 64 << 10;
    // `{"verdict":"allow"}` (at 16, as `wat::policy` lays it out) padded with spaces to `len` bytes,
    // in memory grown for it.
    let padded = |len: u32| {
        format!(
            "(drop (memory.grow (i32.const 2)))
    (memory.copy (i32.const {PAGE}) (i32.const 16) (i32.const {a}))
    (memory.fill (i32.const {fill}) (i32.const 32) (i32.const {rest}))
    {out}",
            a = ALLOW.len(),
            fill = PAGE + ALLOW.len() as u32,
            rest = len - ALLOW.len() as u32,
            out = wat::output(PAGE, len),
        )
    };
    let text = |name: &str, bytes: &[u8]| {
        Entry::hostile(
            &dir,
            name,
            &wat::output(1024, bytes.len() as u32),
            &wat::data(1024, bytes),
        )
        .fails_with(&["invalid_output"])
    };
    let at_limit = Entry::hostile(&dir, "at-limit", &padded(LIMIT), "");
    let over =
        Entry::hostile(&dir, "over-limit", &padded(LIMIT + 1), "").fails_with(&["invalid_output"]);
    let huge =
        Entry::hostile(&dir, "huge", &wat::output(0, u32::MAX), "").fails_with(&["invalid_output"]);
    let past_end = Entry::hostile(&dir, "past-end", &wat::output(PAGE - 100, 200), "")
        .fails_with(&["invalid_output"]);
    let wild = Entry::hostile(&dir, "wild", &wat::output(0xffff_ff00, 0x100), "")
        .fails_with(&["invalid_output"]);
    let not_json = text("not-json", b"\xff\xfe{not json");
    let not_decision = text("not-decision", br#"{"verdict":"maybe"}"#);
    let bad_status = text("bad-status", br#"{"verdict":"deny","status":500}"#);
    let nothing = Entry::hostile(&dir, "nothing", "(return (i64.const 0))", "")
        .fails_with(&["invalid_output"]);
    let chain = [
        &at_limit,
        &over,
        &huge,
        &past_end,
        &wild,
        &not_json,
        &not_decision,
        &bad_status,
        &nothing,
    ];
    assert_fails_closed(&dir, &chain).await;
    assert_fails_open(&dir, &chain).await;
}

/// 6. A loop of host calls runs out of fuel: each call costs 1000 on top of its instructions. The
/// module counts its calls in a host token bucket; a probe request then checks that the hostile
/// evaluations made no more calls than 1000 fuel apiece allows (and a good share of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_call_loop_runs_out_of_fuel() {
    let dir = unique_dir("hostile-hostcalls");
    const FUEL: u64 = 1_000_000;
    const CAPACITY: f64 = 1e9;
    let per_eval = FUEL / 1000;
    let (most, least) = (per_eval * HOSTILE as u64, per_eval / 2 * HOSTILE as u64);
    let take = |amount: String| {
        format!("(call $take (i32.const 4096) (i32.const 5) (f64.const {CAPACITY}) (f64.const 0) (f64.const {amount}))")
    };
    let hammer = format!("(loop $calls (drop {}) (br $calls))", take("1".into()));
    // The bucket holds CAPACITY - calls. Taking CAPACITY - least + 1 must fail (calls >= least);
    // taking CAPACITY - most must succeed (calls <= most).
    let (few, many) = (
        br#"{"verdict":"deny","status":429,"message":"too few host calls"}"#,
        br#"{"verdict":"deny","status":429,"message":"too many host calls"}"#,
    );
    let probe = format!(
        "(if (f64.eq {} (f64.const 0)) (then {}))
    (if (f64.ne {} (f64.const 0)) (then {}))",
        take(format!("{}", CAPACITY - least as f64 + 1.0)),
        wat::output(1024, few.len() as u32),
        take(format!("{}", CAPACITY - most as f64)),
        wat::output(2048, many.len() as u32),
    );
    let extra = format!(
        "{}\n  {}\n  {}",
        wat::data(4096, b"calls"),
        wat::data(1024, few),
        wat::data(2048, many)
    );
    let path = wat::on_markers(
        &dir,
        "hostcalls",
        &[(wat::MARKER, &hammer), ("PROBE", &probe)],
        &extra,
    );
    let entry = Entry::at("hostcalls", path)
        .limits(&format!("fuel = {FUEL}\ndeadline = \"10s\""))
        .fails_with(&["fuel"]);
    let (up, mut gate) = start(&dir, &[&entry], "deny").await;
    let load = mixed_load(&gate).await;
    assert_normal_served(&load);
    for s in &load.hostile {
        assert_error(&s.resp, 503, "policy_error");
        assert_eq!(failure_named(&s.resp), ("hostcalls".into(), "fuel".into()));
        assert!(s.took < HOSTILE_BOUND, "{} took {:?}", s.tag, s.took);
    }
    assert_upstream_saw(&up, &[&load.normal]);
    assert_policy_counters(&gate, &[&entry]).await;
    let probed = gate
        .client()
        .post_chat(&Req::chat("probe").set("model", "PROBE"))
        .await;
    assert_eq!(
        probed.status, 200,
        "{HOSTILE} evaluations with {FUEL} fuel each made between {least} and {most} host calls: {}",
        probed.body
    );
    assert_settled_and_alive(&mut gate, &up).await;

    // The same loop with the default fuel (10M: 10000 calls) and a short deadline: fuel or
    // deadline, whichever comes first; failing open.
    let defaults = Entry::hostile(
        &dir,
        "hostcalls-default",
        &hammer,
        &wat::data(4096, b"calls"),
    )
    .limits("deadline = \"100ms\"")
    .fails_with(&["fuel", "timeout"]);
    assert_fails_open(&dir, &[&defaults]).await;
}

// ---------------------------------------------------------------------------------------------------
// Load-time cases
// ---------------------------------------------------------------------------------------------------

/// 7. Code that never returns at load time (the start function, `slotgate_abi_version`,
/// `slotgate_validate_settings`, the canary evaluation) is bounded like an evaluation: the start is
/// refused in bounded time, by the fuel or the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_that_never_finishes_loading_is_refused_in_bounded_time() {
    let dir = unique_dir("hostile-load-loop");
    let either = ["fuel exhausted", "deadline exceeded"];
    let start = wat::policy(
        &dir,
        "start-loop",
        1,
        ALLOW,
        "",
        "(func $s (loop $l (br $l))) (start $s)",
    );
    assert_refused(&start, &[], &either, true).await;
    assert_refused(
        &start,
        &[("fuel", "100000"), ("deadline", "10s")],
        &["fuel exhausted"],
        true,
    )
    .await;
    assert_refused(
        &start,
        &[("fuel", "100000000000"), ("deadline", "100ms")],
        &["deadline exceeded"],
        true,
    )
    .await;

    let good = wat::fixed(&dir, "good", ALLOW);
    let version = variant(
        &good,
        "version-loop",
        "(result i32) (i32.const 1))",
        "(result i32) (loop $l (br $l)) (i32.const 1))",
    );
    assert_refused(&version, &[], &either, true).await;

    let validate = wat::policy(
        &dir,
        "validate-loop",
        1,
        ALLOW,
        "",
        r#"(func (export "slotgate_validate_settings") (param i32 i32) (result i64)
    (loop $l (br $l)) (i64.const 0))"#,
    );
    assert_refused(&validate, &[], &either, true).await;

    // Only `slotgate run` and `slotgate check` run the canary evaluation (see the report on
    // `policy check`).
    let canary = wat::policy(&dir, "canary-loop", 1, ALLOW, "(loop $l (br $l))", "");
    assert_refused(&canary, &[], &either, false).await;
}

/// 8. Missing or mistyped exports, and imports from outside `slotgate`, are refused at load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_exports_and_foreign_imports_are_refused() {
    let dir = unique_dir("hostile-exports");
    let good = wat::fixed(&dir, "good", ALLOW);
    let missing = |export: &str| format!("missing required export `{export}`");
    let cases = [
        (
            variant(
                &good,
                "no-evaluate",
                "\"slotgate_evaluate\"",
                "\"evaluate\"",
            ),
            missing("slotgate_evaluate"),
        ),
        (
            variant(&good, "no-alloc", "\"slotgate_alloc\"", "\"alloc\""),
            missing("slotgate_alloc"),
        ),
        (
            variant(
                &good,
                "no-version",
                "\"slotgate_abi_version\"",
                "\"version\"",
            ),
            missing("slotgate_abi_version"),
        ),
        (
            variant(
                &good,
                "no-memory",
                "(memory (export \"memory\") 1)",
                "(memory 1)",
            ),
            "must export its `memory`".into(),
        ),
        (
            variant(
                &good,
                "evaluate-global",
                "(func (export \"slotgate_evaluate\")",
                "(global (export \"slotgate_evaluate\") i32 (i32.const 0)) (func",
            ),
            "`slotgate_evaluate` must be a function".into(),
        ),
        (
            variant(
                &good,
                "foreign-import",
                "(import \"slotgate\" \"bucket_take\"",
                "(import \"wasi_snapshot_preview1\" \"bucket_take\"",
            ),
            "may only import from `slotgate`".into(),
        ),
        (
            variant(
                &good,
                "unknown-host-fn",
                "(import \"slotgate\" \"bucket_take\"",
                "(import \"slotgate\" \"spawn_shell\"",
            ),
            "spawn_shell".into(),
        ),
    ];
    for (policy, reason) in &cases {
        assert_refused(policy, &[], &[reason.as_str()], true).await;
    }
}

/// 9. A module speaking another ABI version is refused at load, whatever the version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_abi_version_is_refused() {
    let dir = unique_dir("hostile-abi");
    for (name, version) in [("abi-2", 2), ("abi-0", 0), ("abi-minus-1", -1)] {
        let policy = wat::policy(&dir, name, version, ALLOW, "", "");
        let reason = format!("module speaks ABI {version}; this slotgate speaks 1");
        assert_refused(&policy, &[], &[reason.as_str()], true).await;
    }
}
