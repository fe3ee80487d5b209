//! Hot reload of the policy chain: on SIGHUP and when a watched file changes, a new version is
//! compiled, validated and canaried off the request path and swapped in; a broken one (not wasm,
//! missing exports, wrong ABI, a start function that never ends, a canary that traps, a config file
//! that does not parse) is rejected and counted while the old version keeps serving. All of it under
//! steady load, where no request may fail.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slotgate_tests::errors::{assert_error, assert_error_says};
use slotgate_tests::fake_upstream::RunningUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::{eventually, unique_dir};
use slotgate_tests::wat::{self, install, versioned};

/// Clients sending back to back while the policies change under them.
const LOAD_CLIENTS: usize = 4;
/// Generous bound for a reload to show in responses (compile + canary in a debug build).
const RELOAD_SEEN: Duration = Duration::from_secs(20);

/// One response under load: status, `x-policy-version`, body.
type Sample = (u16, Option<String>, String);

/// Steady traffic from several clients; every response is kept.
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Sample>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(gate: &RunningGate) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..LOAD_CLIENTS)
            .map(|i| {
                let (client, stop, seen) = (gate.client(), stop.clone(), seen.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let resp = client.post_chat(&Req::chat(&format!("c{i}-{n}"))).await;
                        let version = resp.header("x-policy-version");
                        seen.lock()
                            .unwrap()
                            .push((resp.status.as_u16(), version, resp.body));
                        n += 1;
                    }
                })
            })
            .collect();
        Load { stop, seen, tasks }
    }

    /// Waits until responses carry `version`, and returns how many responses there were by then.
    async fn wait_version(&self, version: &str) -> usize {
        let seen = self.seen.clone();
        eventually(
            RELOAD_SEEN,
            &format!("responses from policy v{version}"),
            || {
                let seen = seen.clone();
                async move {
                    let seen = seen.lock().unwrap();
                    seen.last()
                        .filter(|(_, v, _)| v.as_deref() == Some(version))
                        .map(|_| seen.len())
                }
            },
        )
        .await
    }

    /// Waits for `n` more responses and returns the versions they carried.
    async fn next_versions(&self, n: usize) -> Vec<Option<String>> {
        let from = self.seen.lock().unwrap().len();
        let seen = self.seen.clone();
        eventually(RELOAD_SEEN, "more responses", || {
            let seen = seen.clone();
            async move {
                let seen = seen.lock().unwrap();
                (seen.len() >= from + n).then(|| seen[from..].iter().map(|s| s.1.clone()).collect())
            }
        })
        .await
    }

    /// Stops the clients; every response must have been a 200.
    async fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("load client panicked");
        }
        let seen = self.seen.lock().unwrap();
        let failed: Vec<_> = seen
            .iter()
            .filter(|(status, _, _)| *status != 200)
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {} requests failed during reloads, e.g. {:?}",
            failed.len(),
            seen.len(),
            failed.first()
        );
        seen.len()
    }
}

async fn reloads(gate: &RunningGate, policy: &str, result: &str) -> f64 {
    gate.metric(
        "slotgate_policy_reloads_total",
        &[("policy", policy), ("result", result)],
    )
    .await
    .unwrap_or(0.0)
}

async fn generation(gate: &RunningGate) -> u64 {
    gate.status().await["policies"]["generation"]
        .as_u64()
        .expect("status has policies.generation")
}

async fn start(args: &[&str]) -> (RunningUpstream, RunningGate) {
    let mut g = Gate::new().slots(2).queue_depth(64);
    for a in args {
        g = g.arg(a);
    }
    g.start_instant().await
}

/// Broken versions, each of which a reload must reject: (what, module text).
fn broken_modules(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let garbage = dir.join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm\x01\0\0\0 this is not a module").unwrap();
    let no_evaluate = dir.join("no-evaluate.wat");
    std::fs::write(
        &no_evaluate,
        r#"(module (memory (export "memory") 1)
             (func (export "slotgate_abi_version") (result i32) (i32.const 1))
             (func (export "slotgate_alloc") (param i32) (result i32) (i32.const 1024)))"#,
    )
    .unwrap();
    vec![
        ("not wasm", garbage),
        ("missing evaluate", no_evaluate),
        (
            "wrong ABI",
            wat::policy(dir, "abi2", 2, r#"{"verdict":"allow"}"#, "", ""),
        ),
        (
            "start function loops",
            wat::policy(
                dir,
                "start-loop",
                1,
                r#"{"verdict":"allow"}"#,
                "",
                "(func $spin (loop $l (br $l))) (start $spin)",
            ),
        ),
        (
            "canary traps",
            wat::policy(dir, "trap", 1, r#"{"verdict":"allow"}"#, "unreachable", ""),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_swaps_good_versions_in_and_rejects_broken_ones_under_load() {
    let dir = unique_dir("reload-hup");
    let live = dir.join("live.wat");
    install(&versioned(&dir, 1), &live);
    let live_arg = live.display().to_string();
    let (up, gate) = start(&["--policy", &live_arg, "--policy-watch", "0s"]).await;
    assert_eq!(generation(&gate).await, 1);
    let load = Load::start(&gate);
    load.wait_version("1").await;

    install(&versioned(&dir, 2), &live);
    gate.signal("HUP");
    load.wait_version("2").await;
    assert_eq!(generation(&gate).await, 2);
    assert_eq!(reloads(&gate, "live", "ok").await, 1.0);

    for (i, (what, module)) in broken_modules(&dir).into_iter().enumerate() {
        install(&module, &live);
        gate.signal("HUP");
        let want = (i + 1) as f64;
        eventually(
            RELOAD_SEEN,
            &format!("reload of `{what}` rejected"),
            || async { (reloads(&gate, "live", "error").await >= want).then_some(()) },
        )
        .await;
        let versions = load.next_versions(LOAD_CLIENTS * 3).await;
        assert!(
            versions.iter().all(|v| v.as_deref() == Some("2")),
            "after rejecting `{what}`, v2 must keep serving: {versions:?}"
        );
        assert_eq!(
            generation(&gate).await,
            2,
            "`{what}` must not be swapped in"
        );
        assert!(
            gate.stderr_text().contains("policy reload rejected"),
            "the rejection is logged"
        );
    }

    install(&versioned(&dir, 3), &live);
    gate.signal("HUP");
    load.wait_version("3").await;
    let served = load.finish().await;
    assert!(served > 50, "too little load to prove anything: {served}");
    assert_eq!(reloads(&gate, "live", "ok").await, 2.0);
    assert_eq!(reloads(&gate, "live", "error").await, 5.0);
    let status = gate.status().await;
    assert_eq!(status["policies"]["generation"], 3, "{status}");
    assert_eq!(gate.livez().await, 200);
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_changed_module_file_is_picked_up_without_a_signal() {
    let dir = unique_dir("reload-watch");
    let live = dir.join("live.wat");
    install(&versioned(&dir, 1), &live);
    let live_arg = live.display().to_string();
    let (up, gate) = start(&["--policy", &live_arg, "--policy-watch", "100ms"]).await;
    let load = Load::start(&gate);
    load.wait_version("1").await;

    install(&versioned(&dir, 2), &live);
    load.wait_version("2").await;

    // Half a module, as a copy caught mid-write would leave it: rejected, v2 keeps serving.
    let v3 = std::fs::read(versioned(&dir, 3)).unwrap();
    std::fs::write(&live, &v3[..v3.len() / 2]).unwrap();
    eventually(RELOAD_SEEN, "the truncated module rejected", || async {
        (reloads(&gate, "live", "error").await >= 1.0).then_some(())
    })
    .await;
    let versions = load.next_versions(LOAD_CLIENTS * 3).await;
    assert!(
        versions.iter().all(|v| v.as_deref() == Some("2")),
        "{versions:?}"
    );

    // The rest of the write lands: v3 serves.
    std::fs::write(&live, &v3).unwrap();
    load.wait_version("3").await;
    load.finish().await;
    assert_eq!(reloads(&gate, "live", "ok").await, 2.0);
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_rereads_the_config_file_and_keeps_the_old_chain_if_it_does_not_parse() {
    let dir = unique_dir("reload-config");
    let allow = versioned(&dir, 1);
    let deny = wat::fixed(
        &dir,
        "closed",
        r#"{"verdict":"deny","status":403,"message":"closed for maintenance"}"#,
    );
    let config = dir.join("slotgate.toml");
    let write_config = |policy: &Path, name: &str| {
        std::fs::write(
            &config,
            format!(
                "policy-watch = \"0s\"\n[[policy]]\nname = \"{name}\"\npath = \"{}\"\n",
                policy.display()
            ),
        )
        .unwrap();
    };
    write_config(&allow, "gate");
    let config_arg = config.display().to_string();
    let (up, gate) = start(&["--config", &config_arg]).await;
    let client = gate.client();
    let resp = client.post_chat(&Req::chat("a")).await;
    assert_eq!(resp.header("x-policy-version").as_deref(), Some("1"));

    // A config file that does not parse: rejected, counted, the chain unchanged.
    std::fs::write(&config, "[[policy]\npath = ").unwrap();
    gate.signal("HUP");
    eventually(RELOAD_SEEN, "the bad config rejected", || async {
        (reloads(&gate, "(config)", "error").await >= 1.0).then_some(())
    })
    .await;
    let resp = client.post_chat(&Req::chat("b")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header("x-policy-version").as_deref(), Some("1"));

    // The chain named in the config changes: the new policy decides from now on.
    write_config(&deny, "gate");
    gate.signal("HUP");
    // Each try under its own tag: one the old chain still allowed is forwarded once, not "twice".
    let mut attempt = 0;
    let resp = eventually(RELOAD_SEEN, "the new chain deciding", || {
        attempt += 1;
        let body = Req::chat(&format!("c{attempt}")).json();
        let client = &client;
        async move {
            let resp = client.post_json(CHAT, &body).await;
            (resp.status == 403).then_some(resp)
        }
    })
    .await;
    assert_error_says(&resp, 403, "policy_denied", "closed for maintenance");
    assert_eq!(reloads(&gate, "gate", "ok").await, 1.0);
    let status = gate.status().await;
    assert_eq!(status["policies"]["chain"][0]["name"], "gate", "{status}");
    let resp = client.post_chat(&Req::chat("d")).await;
    assert_error(&resp, 403, "policy_denied");
    assert!(
        !up.tags().contains(&"d".to_owned()),
        "a denied request is never forwarded"
    );
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_keeps_every_tenants_budget() {
    let dir = unique_dir("reload-budget");
    let settings = dir.join("budget.json");
    let write_settings = |default_max: u64| {
        std::fs::write(
            &settings,
            format!(r#"{{"capacity": 1000, "refill_per_second": 0, "default_max_tokens": {default_max}}}"#),
        )
        .unwrap();
    };
    write_settings(100);
    let budget = wat::built("token-budget").display().to_string();
    let settings_arg = settings.display().to_string();
    let (up, gate) = start(&[
        "--policy",
        &budget,
        "--policy-settings",
        &settings_arg,
        "--policy-watch",
        "0s",
    ])
    .await;
    let client = gate.client();
    // 900 of the 1000 tokens spent (the fake reports that much usage, so nothing is refunded).
    let big = Req::chat("big")
        .set("max_tokens", 890)
        .prompt_tokens(10)
        .completion_tokens(890);
    assert_eq!(client.post_json(CHAT, &big.json()).await.status, 200);

    // New settings, same capacity: the bucket is the same bucket, still nearly empty.
    write_settings(200);
    gate.signal("HUP");
    eventually(RELOAD_SEEN, "the settings change reloaded", || async {
        (reloads(&gate, "token-budget", "ok").await >= 1.0).then_some(())
    })
    .await;
    let resp = client
        .post_chat(&Req::chat("over").set("max_tokens", 500))
        .await;
    assert_error(&resp, 429, "policy_denied");
    assert_eq!(up.tags(), ["big"]);
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compiled_modules_are_reused_from_memory_on_reload_and_from_disk_on_restart() {
    let dir = unique_dir("reload-cache");
    let cache = dir.join("cache");
    let settings = dir.join("guard.json");
    std::fs::write(&settings, r#"{"max_tokens": 100}"#).unwrap();
    let module = wat::built("request-guard").display().to_string();
    let (cache_arg, settings_arg) = (cache.display().to_string(), settings.display().to_string());
    let args = [
        "--policy",
        module.as_str(),
        "--policy-settings",
        settings_arg.as_str(),
        "--policy-watch",
        "0s",
        "--policy-cache-dir",
        cache_arg.as_str(),
    ];
    let disk = |s: &serde_json::Value, key: &str| {
        s["policies"]["compile_cache"]["disk"][key]
            .as_u64()
            .unwrap_or_else(|| panic!("status has compile_cache.disk.{key}: {s}"))
    };

    let (up, gate) = start(&args).await;
    let status = gate.status().await;
    assert_eq!(disk(&status, "hits"), 0, "a cold cache: {status}");
    // The module, the module instrumented for its snapshot, and the snapshot (request-guard keeps
    // its parsed settings, so it serves from a snapshot taken after it parsed them).
    assert_eq!(disk(&status, "misses"), 3, "{status}");
    assert_eq!(
        status["policies"]["chain"][0]["preinitialised"], true,
        "{status}"
    );
    // A settings change reloads the policy and compiles only the new snapshot: the module and its
    // instrumented form come from memory.
    std::fs::write(&settings, r#"{"max_tokens": 50}"#).unwrap();
    gate.signal("HUP");
    eventually(RELOAD_SEEN, "the settings reloaded", || async {
        (reloads(&gate, "request-guard", "ok").await >= 1.0).then_some(())
    })
    .await;
    let status = gate.status().await;
    assert_eq!(status["policies"]["generation"], 2, "{status}");
    assert_eq!(
        (disk(&status, "hits"), disk(&status, "misses")),
        (0, 4),
        "one compile, of the new snapshot: {status}"
    );
    // The old snapshot is dropped; the module, its instrumented form and the new snapshot stay.
    assert_eq!(status["policies"]["compile_cache"]["memory_modules"], 3);
    assert_eq!(
        gate.stderr_text().matches("policy module ready").count(),
        4,
        "compiled four times in all"
    );
    // The new settings are the ones in force: 60 tokens is over the new cap of 50.
    assert_capped_at_50(&up, &gate, Req::chat("capped").set("max_tokens", 60)).await;
    drop(gate);
    drop(up);

    // wasmtime writes the cache entry in the background.
    eventually(RELOAD_SEEN, "a cache entry on disk", || async {
        let files = walk(&cache);
        (files > 0).then_some(())
    })
    .await;
    let (up, gate) = start(&args).await;
    let status = gate.status().await;
    assert_eq!(
        (disk(&status, "hits"), disk(&status, "misses")),
        (3, 0),
        "a restart loads all three compiled modules from disk (the snapshot is the same bytes \
         for the same module and settings): {status}"
    );
    assert!(
        gate.stderr_text().contains("source=\"disk-cache\""),
        "the log says where the module came from"
    );
    assert_capped_at_50(&up, &gate, Req::chat("x").set("max_tokens", 500)).await;
}

/// `req`, the first request this fresh gate forwards, is served with its `max_tokens` lowered to
/// the cap of 50; then the gate settles.
async fn assert_capped_at_50(up: &RunningUpstream, gate: &RunningGate, req: Req) {
    let resp = gate.client().post_chat(&req).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(up.requests_seen()[0].body["max_tokens"], 50);
    gate.assert_settled(up, 2).await;
}

/// Regular files under `dir`, recursively.
fn walk(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => walk(&e.path()),
                Ok(t) if t.is_file() => 1,
                _ => 0,
            })
            .sum()
    })
}
