//! Policies v2 (WebAssembly components of `slotgate:policy@2.0.0`) in the real host: the Rust
//! examples' v2 ports decide as their v1 modules do, a chain mixes both and passes what earlier
//! policies decided, hostile components are bounded and the others unaffected, an import outside
//! the world is refused by name, and a reload from a v1 module to its v2 port under load loses no
//! request and keeps the budgets.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use slotgate::config::{PolicyIsolation, PolicySpec};
use slotgate::policy::PolicySet;
use slotgate_sdk::{Completion, Decision, Peer, RequestSummary};
use slotgate_tests::errors::assert_error;
use slotgate_tests::gate::{run as slotgate, succeeded as ok, Gate};
use slotgate_tests::request::Req;
use slotgate_tests::wait::{eventually, unique_dir};
use slotgate_tests::{wat, workspace};

/// The Rust examples with a v2 port (`<name>-v2.wasm`).
const PORTED: &[&str] = &["token-budget", "tenant-priority", "request-guard", "quota"];

fn example_settings(name: &str) -> Option<PathBuf> {
    let p = workspace()
        .join("policies")
        .join(name)
        .join("settings.example.json");
    p.exists().then_some(p)
}

/// `slotgate policy check <module>` with token-budget's example settings, which must succeed.
fn check_with_budget_settings(module: &str) -> String {
    let settings = example_settings("token-budget").unwrap();
    let settings = settings.display().to_string();
    ok(&slotgate(&[
        "policy",
        "check",
        module,
        "--settings",
        &settings,
    ]))
}

#[test]
fn every_v2_port_passes_check_as_a_component() {
    for name in PORTED {
        let module = wat::built(&format!("{name}-v2")).display().to_string();
        let settings = example_settings(name).map(|p| p.display().to_string());
        let mut args = vec!["policy", "check", &module];
        if let Some(s) = &settings {
            args.extend(["--settings", s]);
        }
        let out = ok(&slotgate(&args));
        assert!(out.contains("is a v2 policy"), "{name}: {out}");
        assert!(out.contains("canary evaluation: passed"), "{name}: {out}");
    }
    // The v1 modules still say what they are.
    let v1 = wat::built("token-budget").display().to_string();
    let out = check_with_budget_settings(&v1);
    assert!(out.contains("speaks ABI v1"), "{out}");
}

#[test]
fn policy_wit_prints_the_contract_and_component_writes_one() {
    let wit = ok(&slotgate(&["policy", "wit"]));
    assert!(wit.contains("package slotgate:policy@2.0.0;"), "{wit}");
    assert!(wit.contains("export evaluate: func("), "{wit}");
    assert_eq!(
        wit,
        std::fs::read_to_string(workspace().join("sdk/wit/policy.wit")).unwrap()
    );

    let dir = unique_dir("policy-component");
    let out = dir.join("token-budget.component.wasm");
    let core = wat::built("token-budget-v2").display().to_string();
    ok(&slotgate(&[
        "policy",
        "component",
        &core,
        "-o",
        &out.display().to_string(),
    ]));
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[..8], b"\0asm\x0d\0\x01\0", "a component's preamble");
    let checked = check_with_budget_settings(&out.display().to_string());
    assert!(checked.contains("is a v2 component"), "{checked}");
    // A v1 module is not made a component.
    let v1 = wat::built("token-budget").display().to_string();
    let refused = slotgate(&["policy", "component", &v1, "-o", "/dev/null"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not built against the v2 contract"),
        "{refused:?}"
    );
}

/// A fixed set of requests from several callers: keys, uids, anonymous, models, paths, sizes.
fn requests() -> Vec<RequestSummary> {
    let mut out = Vec::new();
    let keys = [
        Some(slotgate_tests::gate::hash_key("k-alice")),
        Some("sha256:0c55d73decea73c6807948b6fc35a5f7c446ea3a8400224532c1249fe73587a9".into()),
        None,
    ];
    let paths = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/messages",
        "/completion",
    ];
    for i in 0..60usize {
        let mut r = RequestSummary {
            method: "POST".into(),
            path: paths[i % paths.len()].into(),
            model: [None, Some("qwen"), Some("llama-70b")][i % 3].map(str::to_owned),
            stream: i % 2 == 0,
            max_tokens: [None, Some(64), Some(4000), Some(100_000)][i % 4],
            prompt_chars: (i as u64 * 997) % 40_000,
            api_key: keys[i % 3].clone(),
            peer: (i % 3 == 2 && i % 2 == 0).then_some(Peer {
                uid: 1000 + (i as u32 % 3),
                gid: 1000,
                pid: None,
            }),
            dialect: Some("chat".into()),
            ..RequestSummary::default()
        };
        r.prompt_tokens_estimate = r.prompt_chars.div_ceil(4);
        if i % 5 == 0 {
            r.prompt_tokens = Some(r.prompt_tokens_estimate + 3);
        }
        if i % 7 == 0 {
            r.headers.insert("x-tenant".into(), "team-a".into());
        }
        r.caller = Some(r.name_caller());
        out.push(r);
    }
    out
}

fn load(path: &Path, settings: Option<PathBuf>) -> PolicySet {
    PolicySet::load(&[PolicySpec::from_path(path.to_owned(), settings)], None)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A decision with its Retry-After left out: both count seconds to the same instant from clocks
/// read a few microseconds apart, which may round to neighbours.
fn comparable(d: Option<Decision>) -> Option<Decision> {
    d.map(|d| Decision {
        retry_after_seconds: None,
        ..d
    })
}

#[test]
fn each_v2_port_decides_as_its_v1_module_on_the_same_requests() {
    for name in PORTED {
        let settings = example_settings(name);
        let v1 = load(&wat::built(name), settings.clone());
        let v2 = load(&wat::built(&format!("{name}-v2")), settings);
        let (c1, c2) = (v1.current(), v2.current());
        let (mut allowed, mut denied) = (0, 0);
        for (i, r) in requests().iter().enumerate() {
            let now = 1_800_000_000_000 + i as u64 * 10;
            let (o1, own1) = c1.evaluate_each_at(r, now);
            let (o2, own2) = c2.evaluate_each_at(r, now);
            let (d1, d2) = (o1.decision(), o2.decision());
            assert_eq!(
                comparable(Some(d1.clone())),
                comparable(Some(d2)),
                "{name}, request {i}: {r:?}"
            );
            assert_eq!(
                own1.into_iter().map(comparable).collect::<Vec<_>>(),
                own2.iter().cloned().map(comparable).collect::<Vec<_>>()
            );
            if d1.is_allowed() {
                allowed += 1;
            } else {
                denied += 1;
            }
            // Both settle the same usage, so their budgets stay in step.
            let completion = Completion {
                abi: 1,
                request: r.clone(),
                chain_decision: d1,
                status: 200,
                outcome: "ok".into(),
                prompt_tokens: r.prompt_tokens_estimate,
                completion_tokens: 7,
                evaluated_unix_ms: now,
                ..Completion::default()
            };
            c1.complete(&completion, &own2);
            c2.complete(&completion, &own2);
        }
        assert!(
            allowed > 0 && (denied > 0 || *name == "tenant-priority"),
            "{name}: the requests exercise both answers ({allowed} allowed, {denied} denied)"
        );
        // The same buckets, at the same levels up to what refilled between the two runs.
        let levels = |s: &PolicySet| {
            let mut l: Vec<_> = s
                .shared()
                .bucket_levels(1000)
                .0
                .into_iter()
                .map(|b| (b.name.key, b.level))
                .collect();
            l.sort_by(|a, b| a.0.cmp(&b.0));
            l
        };
        let (l1, l2) = (levels(&v1), levels(&v2));
        assert_eq!(
            l1.iter().map(|l| &l.0).collect::<Vec<_>>(),
            l2.iter().map(|l| &l.0).collect::<Vec<_>>(),
            "{name}: the same buckets"
        );
        for (a, b) in l1.iter().zip(&l2) {
            assert!(
                (a.1 - b.1).abs() < 5.0,
                "{name}: budgets after settling: {l1:?} {l2:?}"
            );
        }
    }
}

fn probe_v2() -> PathBuf {
    wat::built("probe-policy-v2")
}

/// `slotgate policy eval` of the probe doing `action`: the report, or the error it printed.
fn eval_probe(action: &str) -> Result<Value, String> {
    let dir = unique_dir(&format!("probe-{action}"));
    let settings = dir.join("settings.json");
    std::fs::write(&settings, json!({ "do": action }).to_string()).unwrap();
    let input = dir.join("input.json");
    std::fs::write(&input, r#"{"path":"/v1/chat/completions"}"#).unwrap();
    let out = slotgate(&[
        "policy",
        "eval",
        "--policy",
        &probe_v2().display().to_string(),
        "--settings",
        &settings.display().to_string(),
        "--input",
        &input.display().to_string(),
        "--deadline",
        "50ms",
    ]);
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn hostile_components_are_bounded_with_the_right_kind() {
    for (action, kinds) in [
        ("spin", &["timeout", "fuel"][..]),
        ("bomb", &["memory"][..]),
        ("trap", &["trap"][..]),
        ("huge", &["invalid_output"][..]),
        ("host_loop", &["fuel", "timeout"][..]),
        // The SDK refuses the key before the host does, as in v1: a trap either way.
        ("long_key", &["trap", "invalid_output"][..]),
    ] {
        let started = std::time::Instant::now();
        let err = eval_probe(action).expect_err(action);
        assert!(
            kinds.iter().any(|k| err.contains(&format!("({k})"))),
            "{action}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{action} took {:?}",
            started.elapsed()
        );
    }
    let echo = eval_probe("echo").unwrap();
    assert_eq!(echo["decision"]["verdict"], "allow", "{echo}");
}

#[test]
fn an_import_outside_the_world_is_refused_naming_it() {
    let dir = unique_dir("component-import");
    let foreign = dir.join("foreign.wat");
    std::fs::write(
        &foreign,
        r#"(component (import "acme:net/socket@1.0.0" (instance (export "connect" (func)))))"#,
    )
    .unwrap();
    let out = slotgate(&["policy", "check", &foreign.display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("acme:net/socket@1.0.0"), "{err}");

    // A component that imports nothing and exports nothing is not a policy either.
    let empty = dir.join("empty.wat");
    std::fs::write(&empty, "(component)").unwrap();
    let out = slotgate(&["policy", "check", &empty.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("slotgate:policy@2.0.0"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_chain_passes_earlier_decisions_and_survives_a_hostile_component() {
    let dir = unique_dir("mixed-chain");
    let first = wat::fixed(
        &dir,
        "names",
        r#"{"verdict":"allow","tenant":"alpha","priority":3,"cost":42}"#,
    );
    let toml = format!(
        r#"[[policy]]
path = "{first}"

[[policy]]
name = "probe-v2"
path = "{v2}"
settings = {{ do = "spin", when_model = "HOSTILE" }}

[[policy]]
name = "probe-v1"
path = "{v1}"
"#,
        first = first.display(),
        v2 = probe_v2().display(),
        v1 = wat::built("probe-policy").display(),
    );
    let config = dir.join("slotgate.toml");
    std::fs::write(&config, toml).unwrap();
    let (up, gate) = Gate::new()
        .slots(2)
        .config_file(&config)
        .start_instant()
        .await;
    let client = gate.client();

    let resp = client.post_chat(&Req::chat("mixed")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let earlier = |h: &str| -> Value {
        serde_json::from_str(&resp.header(h).unwrap_or_else(|| panic!("{h} missing"))).unwrap()
    };
    // The component sees the v1 module's decision; the v1 module after it sees both.
    assert_eq!(
        earlier("x-probe-earlier-v2"),
        json!({"policies": 1, "tenant": "alpha", "priority": 3, "cost": 42})
    );
    assert_eq!(
        earlier("x-probe-earlier-v1"),
        json!({"policies": 2, "tenant": "alpha", "priority": 3, "cost": 42})
    );
    assert_eq!(resp.header("x-probe-dialect-v2").as_deref(), Some("chat"));

    // A spinning component ends by its deadline and fails closed, while requests beside it pass.
    let hostile = {
        let client = gate.client();
        tokio::spawn(async move {
            client
                .post_chat(&Req::chat("spin").set("model", "HOSTILE"))
                .await
        })
    };
    for i in 0..5 {
        let ok = client.post_chat(&Req::chat(&format!("beside-{i}"))).await;
        assert_eq!(ok.status, 200, "{}", ok.body);
    }
    let hostile = hostile.await.unwrap();
    assert_error(&hostile, 503, "policy_error");
    // Fuel or the deadline, whichever comes first on this machine.
    let mut errors = 0.0;
    for kind in ["timeout", "fuel"] {
        errors += gate
            .metric(
                "slotgate_policy_errors_total",
                &[("policy", "probe-v2"), ("kind", kind)],
            )
            .await
            .unwrap_or(0.0);
    }
    assert_eq!(errors, 1.0);
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_from_v1_to_its_v2_port_under_load_loses_nothing_and_keeps_budgets() {
    let dir = unique_dir("reload-v1-v2");
    let policy = dir.join("token-budget.wasm");
    std::fs::copy(wat::built("token-budget"), &policy).unwrap();
    // No refill: a chat request of Req::chat costs its prompt estimate plus `max_tokens` (16),
    // so the budget admits a fixed number of them in all, whichever version charges them.
    let settings = r#"{ capacity = 2000, refill_per_second = 0, default_max_tokens = 16 }"#;
    let config = wat::config(&dir, &[(&policy, Some(settings))]);
    let (up, gate) = Gate::new()
        .slots(2)
        .config_file(&config)
        .start_instant()
        .await;

    let one = gate.client().post_chat(&Req::chat("probe-cost")).await;
    assert_eq!(one.status, 200, "{}", one.body);

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<u16>::new()));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (client, stop, seen) = (gate.client(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = client.post_chat(&Req::chat(&format!("c{i}-{n}"))).await;
                    seen.lock().unwrap().push(r.status.as_u16());
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The port replaces the module in place, as an operator's deploy would.
    let tmp = dir.join("next.wasm");
    std::fs::copy(wat::built("token-budget-v2"), &tmp).unwrap();
    std::fs::rename(&tmp, &policy).unwrap();
    eventually(Duration::from_secs(30), "the v2 port serving", || {
        let gate = &gate;
        async move {
            let status = gate.admin_get("/status").await;
            let v: Value = serde_json::from_str(&status.body).ok()?;
            let p = &v["policies"]["chain"][0];
            (p["contract"] == "v2").then_some(())
        }
    })
    .await;
    // Until the budget is spent under the new version too.
    eventually(Duration::from_secs(60), "the budget spent", || {
        let seen = seen.clone();
        async move {
            let seen = seen.lock().unwrap();
            (seen.iter().rev().take(8).filter(|s| **s == 429).count() == 8).then_some(())
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let other: Vec<_> = seen.iter().filter(|s| !matches!(s, 200 | 429)).collect();
    assert!(other.is_empty(), "answers besides 200 and 429: {other:?}");
    assert!(seen.iter().filter(|s| **s == 200).count() > 1, "{seen:?}");
    // Every admitted request was settled to its real usage in the one bucket, across both
    // versions: what the fake sent fits in one capacity. Had the reload lost the budget, the
    // port would have admitted a second capacity's worth.
    let (prompt, completion) = up.usage_totals();
    let used = prompt + completion;
    assert!(
        (2000 - 200..=2000).contains(&used),
        "{used} tokens of usage admitted with a budget of 2000 ({} requests answered)",
        seen.len()
    );
    gate.assert_settled(&up, 2).await;
}

/// The probe, doing `action` for requests of the model `TRAP` (echoing for the others), with
/// `isolation` as configured.
fn probe_set(action: &str, isolation: Option<PolicyIsolation>) -> PolicySet {
    let dir = unique_dir(&format!("isolation-{action}"));
    let settings = dir.join("settings.json");
    let when = if action == "leak" { None } else { Some("TRAP") };
    std::fs::write(
        &settings,
        json!({ "do": action, "when_model": when }).to_string(),
    )
    .unwrap();
    let spec = PolicySpec {
        isolation,
        ..PolicySpec::from_path(probe_v2(), Some(settings))
    };
    PolicySet::load(&[spec], None).unwrap_or_else(|e| panic!("{e}"))
}

fn caller(key: Option<&str>, uid: Option<u32>) -> RequestSummary {
    let r = RequestSummary {
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        dialect: Some("chat".into()),
        api_key: key.map(slotgate_tests::gate::hash_key),
        peer: uid.map(|uid| Peer {
            uid,
            gid: 100,
            pid: None,
        }),
        ..RequestSummary::default()
    };
    RequestSummary {
        caller: Some(r.name_caller()),
        ..r
    }
}

/// What the probe's instance said: the calls it has served, and its memory in pages.
fn served(set: &PolicySet, r: &RequestSummary) -> (u64, u64) {
    let d = match set.current().evaluate(r) {
        slotgate::policy::ChainOutcome::Allow(d) => d,
        other => panic!("{other:?}"),
    };
    let header = |h: &str| -> u64 {
        d.mutations.response_headers[h]
            .parse()
            .unwrap_or_else(|e| panic!("{h}: {e}"))
    };
    (header("x-probe-calls-v2"), header("x-probe-pages-v2"))
}

#[test]
fn a_kept_instance_serves_one_caller_and_is_thrown_away_after_a_failure() {
    let set = probe_set("trap", None);
    let (a, b) = (caller(Some("k-a"), None), caller(Some("k-b"), None));
    let (uid, other_uid, anonymous) = (
        caller(None, Some(1000)),
        caller(None, Some(1001)),
        caller(None, None),
    );
    // One caller's calls go on in its instance; every other caller starts in one of its own.
    for n in 1..=3 {
        assert_eq!(served(&set, &a).0, n);
    }
    for other in [&b, &uid, &anonymous] {
        assert_eq!(served(&set, other).0, 1, "{other:?}");
    }
    assert_eq!(served(&set, &a).0, 4);
    assert_eq!(served(&set, &b).0, 2);
    assert_eq!(served(&set, &uid).0, 2);
    let kept = || {
        set.current()
            .policies()
            .next()
            .unwrap()
            .policy
            .instances_kept()
    };
    assert_eq!(kept(), 4);
    // A fifth caller: the least recently served one's instance (anonymous) makes room.
    assert_eq!(served(&set, &other_uid).0, 1);
    assert_eq!(kept(), 4);
    assert_eq!(served(&set, &anonymous).0, 1);
    assert_eq!(served(&set, &uid).0, 3);

    // A failed call's instance is never used again: the caller's next call starts afresh.
    let trap = RequestSummary {
        model: Some("TRAP".into()),
        ..a.clone()
    };
    assert!(matches!(
        set.current().evaluate(&trap),
        slotgate::policy::ChainOutcome::Failed { .. }
    ));
    assert_eq!(served(&set, &a).0, 1);

    // `isolation = "call"`: a fresh instance for every call, as for v1.
    let fresh = probe_set("trap", Some(PolicyIsolation::Call));
    for _ in 0..3 {
        assert_eq!(served(&fresh, &a).0, 1);
    }
    assert_eq!(
        fresh
            .current()
            .policies()
            .next()
            .unwrap()
            .policy
            .instances_kept(),
        0
    );
}

#[test]
fn a_kept_instance_gives_back_what_a_call_allocates_and_is_replaced_in_time() {
    let set = probe_set("trap", None);
    let a = caller(Some("k-a"), None);
    let (_, pages) = served(&set, &a);
    // Every call allocates (the input, the decision, its headers) and frees: the instance serves
    // call after call in the memory it started with, until it has served its share.
    let last = slotgate::policy::KEPT_CALLS as u64;
    for n in 2..=last {
        assert_eq!(served(&set, &a), (n, pages), "call {n}");
    }
    assert_eq!(
        served(&set, &a),
        (1, pages),
        "a fresh instance after {last} calls"
    );

    // A policy that leaks 1 MiB a call: its instance is replaced once it has grown by half the
    // room it had under the memory cap (16 MiB by default), so no call on a kept instance runs
    // short of memory.
    let leaky = probe_set("leak", None);
    let counts: Vec<(u64, u64)> = (0..24).map(|_| served(&leaky, &a)).collect();
    let most = counts.iter().map(|c| c.0).max().unwrap();
    assert!(most > 1 && most < 12, "{counts:?}");
    assert!(counts.iter().skip(1).any(|c| c.0 == 1), "{counts:?}");
    assert!(
        counts.iter().all(|c| c.1 * 65_536 <= 11 << 20),
        "never past half the room, and a call: {counts:?}"
    );
}

#[test]
fn a_v1_module_refuses_caller_isolation() {
    let spec = PolicySpec {
        isolation: Some(PolicyIsolation::Caller),
        ..PolicySpec::from_path(wat::built("probe-policy"), None)
    };
    let e = PolicySet::load(&[spec], None).err().expect("refused");
    let message = e.to_string();
    assert!(
        message.contains("isolation = \"caller\" is for v2 components"),
        "{message}"
    );
}
