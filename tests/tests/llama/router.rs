//! slotgate before llama-server's router mode (docs/router.md): the router is recognised (`/status`
//! says `role: router` and lists its models with their states); each model gets a pool of its own
//! (its slots, queue and overrides), loaded by slotgate and never evicted while busy; a model that
//! cannot load is a 503 naming it, one the router does not serve a 404 at once; a router run on
//! llama-server's defaults with `--api-key` serves the OpenAI and Anthropic SDKs; and sheddable work
//! yields only to an urgent request for its own model.

use std::time::{Duration, Instant};

use serde_json::json;
use slotgate_tests::llama::{chat, serial, LlamaServer, RunningLlama};
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_router_is_recognised_and_an_unknown_model_is_refused_at_once() {
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha", "beta"], 2, &[]).await;
    let gate = Gate::new().queue_timeout("60s").start_before(&llama).await;
    let s = gate
        .wait_status(Duration::from_secs(10), "the router and its models", |s| {
            s["upstream"]["router"]["models"]
                .as_array()
                .is_some_and(|m| m.len() == 2)
        })
        .await;
    assert_eq!(s["upstream"]["role"], "router", "{s}");
    assert_eq!(s["upstream"]["router"]["max_instances"], 2, "{s}");
    let ids: Vec<&str> = s["upstream"]["router"]["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta"], "{s}");
    assert_eq!(
        s["upstream"]["router"]["models"][0]["status"], "unloaded",
        "{s}"
    );

    // A model it serves: loaded on demand and answered.
    let mut body = chat("hello", 8, false);
    body["model"] = json!("alpha");
    let resp = gate.client().post_json(CHAT, &body).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        resp.json()["usage"]["completion_tokens"],
        8,
        "{}",
        resp.body
    );
    let s = gate
        .wait_status(Duration::from_secs(10), "alpha loaded", |s| {
            s["upstream"]["router"]["models"][0]["status"] == "loaded"
        })
        .await;
    assert_eq!(
        s["upstream"]["router"]["models"][1]["status"], "unloaded",
        "{s}"
    );
    // Its own slots and context, from its /props (never asked of beta: that would load it).
    let s = gate
        .wait_status(Duration::from_secs(10), "alpha's slots", |s| {
            s["upstream"]["router"]["models"][0]["slots"] == 2
        })
        .await;
    let models = &s["upstream"]["router"]["models"];
    assert_eq!(models[0]["n_ctx_slot"], 2048, "{s}");
    assert!(models[1]["slots"].is_null(), "{s}");
    assert_eq!(models[1]["status"], "unloaded", "{s}");

    // One it does not: 404 at once, in the OpenAI shape, naming what it serves.
    body["model"] = json!("gamma");
    let t0 = Instant::now();
    let resp = gate.client().post_json(CHAT, &body).await;
    assert_eq!(resp.status, 404, "{}", resp.body);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(
        resp.header("x-slotgate-reason").as_deref(),
        Some("bad_request")
    );
    let e = &resp.json()["error"];
    assert_eq!(e["code"], "model_not_found", "{}", resp.body);
    assert_eq!(e["type"], "invalid_request_error", "{}", resp.body);
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("`gamma`") && message.contains("alpha, beta"),
        "{message}"
    );
    // The Anthropic dialect answers in its own shape.
    let resp = gate
        .client()
        .post_json(
            "/v1/messages",
            &json!({"model": "gamma", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status, 404, "{}", resp.body);
    assert_eq!(resp.json()["type"], "error", "{}", resp.body);

    gate.assert_idle().await;
    // The router's /slots and /metrics need a model: alpha's slots are idle.
    let slots = llama.get("/slots?model=alpha").await.json();
    let slots = slots.as_array().unwrap_or_else(|| panic!("{slots}"));
    assert_eq!(slots.len(), 2, "{slots:?}");
    assert!(
        slots.iter().all(|s| s["is_processing"] == false),
        "{slots:?}"
    );
}

/// A chat for `model` generating `max_tokens`.
pub(crate) fn chat_for(model: &str, max_tokens: u64) -> serde_json::Value {
    let mut body = chat("hello there", max_tokens, false);
    body["model"] = json!(model);
    body
}

/// A chat for `model` generating `max_tokens`, sent in a task.
fn spawn_chat(
    gate: &RunningGate,
    model: &str,
    max_tokens: u64,
) -> tokio::task::JoinHandle<slotgate_tests::Response> {
    let (client, body) = (gate.client(), chat_for(model, max_tokens));
    tokio::spawn(async move { client.post_json(CHAT, &body).await })
}

/// slotgate before `llama`'s router, waiting up to 120 s in the queue; `models` loaded through it.
async fn gate_with_loaded(llama: &RunningLlama, models: &[&str]) -> RunningGate {
    let gate = Gate::new().queue_timeout("120s").start_before(llama).await;
    for m in models {
        let resp = gate.client().post_json(CHAT, &chat_for(m, 4)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate
}

/// The pool slotgate keeps for `model` in `/status`, if it has one.
pub(crate) fn pool<'a>(s: &'a serde_json::Value, model: &str) -> Option<&'a serde_json::Value> {
    s["models"].as_array()?.iter().find(|p| p["model"] == model)
}

/// The router's state of `model` in `/status`.
pub(crate) fn router_state(s: &serde_json::Value, model: &str) -> String {
    s["upstream"]["router"]["models"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["id"] == model))
        .map_or("absent".into(), |m| {
            m["status"].as_str().unwrap_or("?").to_owned()
        })
}

/// Every model's pool is idle: nothing in service or waiting.
async fn assert_pools_idle(gate: &RunningGate) {
    gate.assert_idle().await;
    let s = gate.status().await;
    for p in s["models"].as_array().unwrap() {
        assert_eq!(
            (p["busy"].as_u64(), p["depth"].as_u64()),
            (Some(0), Some(0)),
            "{p}"
        );
    }
}

/// llama-server's own gauge for one model (`/metrics?model=`, never loading it).
async fn llama_gauge(llama: &slotgate_tests::llama::RunningLlama, model: &str, name: &str) -> f64 {
    let text = llama
        .get(&format!("/metrics?model={model}&autoload=false"))
        .await
        .body;
    Metrics::parse(&text).value(name, &[]).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_model_is_served_with_its_own_slots_once_slotgate_has_loaded_it() {
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha", "beta"], 2, &[]).await;
    let gate = Gate::new().queue_timeout("60s").start_before(&llama).await;
    gate.wait_status(Duration::from_secs(10), "the router's models", |s| {
        router_state(s, "beta") == "unloaded"
    })
    .await;

    // Two requests for each of two unloaded models, at once: each model's first wait is its load.
    let max_tokens = 1500;
    let tasks: Vec<_> = ["alpha", "alpha", "beta", "beta"]
        .into_iter()
        .map(|m| spawn_chat(&gate, m, max_tokens))
        .collect();
    // Both models' pools run two each at once, and llama-server defers none of them.
    let (mut both, mut deferred, mut processing) = (false, 0.0f64, (0.0f64, 0.0f64));
    let t0 = Instant::now();
    while !tasks.iter().all(|t| t.is_finished()) && t0.elapsed() < Duration::from_secs(120) {
        let s = gate.status().await;
        let busy = |m| pool(&s, m).and_then(|p| p["busy"].as_u64()).unwrap_or(0);
        both |= busy("alpha") == 2 && busy("beta") == 2;
        if router_state(&s, "alpha") == "loaded" && router_state(&s, "beta") == "loaded" {
            let (a, b) = (
                llama_gauge(&llama, "alpha", "llamacpp:requests_processing").await,
                llama_gauge(&llama, "beta", "llamacpp:requests_processing").await,
            );
            processing = (processing.0.max(a), processing.1.max(b));
            deferred = deferred
                .max(llama_gauge(&llama, "alpha", "llamacpp:requests_deferred").await)
                .max(llama_gauge(&llama, "beta", "llamacpp:requests_deferred").await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for t in tasks {
        let resp = t.await.unwrap();
        slotgate_tests::llama::chat_usage(&resp, max_tokens);
    }
    assert!(both, "the two models never ran two requests each at once");
    assert_eq!(
        processing,
        (2.0, 2.0),
        "llama-server's requests_processing per model"
    );
    assert_eq!(deferred, 0.0, "llama-server deferred a request");

    // slotgate loaded each once, and learned each one's slots and context from its child.
    let s = gate.status().await;
    for m in ["alpha", "beta"] {
        let p = pool(&s, m).unwrap_or_else(|| panic!("no pool for {m}: {s}"));
        assert_eq!(p["slots"], 2, "{p}");
        assert_eq!(p["n_ctx_slot"], 2048, "{p}");
        assert_eq!(
            p["kv_pool_tokens"],
            serde_json::Value::Null,
            "-np 2: a context per slot: {p}"
        );
        assert_eq!(p["admitting"], true, "{p}");
        assert!(
            p["load"]["last_seconds"].as_f64().is_some_and(|s| s > 0.0),
            "{p}"
        );
        let loads = gate
            .metric(
                "slotgate_model_loads_total",
                &[("model", m), ("result", "loaded")],
            )
            .await;
        assert_eq!(loads, Some(1.0), "{m}");
        let ok = gate
            .metric(
                "slotgate_model_requests_total",
                &[("model", m), ("outcome", "ok")],
            )
            .await;
        assert_eq!(ok, Some(2.0), "{m}");
        assert_eq!(
            gate.metric("slotgate_model_slots_total", &[("model", m)])
                .await,
            Some(2.0)
        );
    }
    assert_pools_idle(&gate).await;
}

/// beta's answers: shorter than alpha's (1,800), so beta is idle first, and long enough to be
/// still busy when `slotgate top` looks (about 0.5 s on a fast machine).
const BETA_TOKENS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_third_model_waits_for_an_idle_one_and_no_request_loses_its_model() {
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha", "beta", "gamma"], 2, &[]).await;
    // alpha and beta loaded (--models-max 2 reached).
    let gate = gate_with_loaded(&llama, &["alpha", "beta"]).await;
    // Both busy, each on its two slots: alpha with long answers, beta with shorter ones.
    let long = |m: &str, n| spawn_chat(&gate, m, n);
    let alpha = [long("alpha", 1800), long("alpha", 1800)];
    let beta = [long("beta", BETA_TOKENS), long("beta", BETA_TOKENS)];
    gate.wait_status(Duration::from_secs(10), "alpha and beta busy", |s| {
        pool(s, "alpha").is_some_and(|p| p["busy"] == 2)
            && pool(s, "beta").is_some_and(|p| p["busy"] == 2)
    })
    .await;
    // gamma: the router would evict one of them now; slotgate waits for one to be idle.
    let t0 = Instant::now();
    let gamma = long("gamma", 8);
    let s = gate
        .wait_status(Duration::from_secs(10), "gamma waiting for room", |s| {
            pool(s, "gamma").is_some_and(|p| p["load"]["doing"] == "waiting for room")
        })
        .await;
    assert_eq!(pool(&s, "gamma").unwrap()["depth"], 1, "{s}");
    assert_eq!(router_state(&s, "gamma"), "unloaded", "{s}");
    // A request outside the slots for gamma (the router would load it, and evict, for a
    // `/tokenize`): it waits for slotgate's load too.
    let tokenize = {
        let client = gate.client();
        tokio::spawn(async move {
            client
                .post_json(
                    "/tokenize",
                    &json!({"model": "gamma", "content": "hello there"}),
                )
                .await
        })
    };
    // `slotgate top` shows each model's pool: two loaded and busy, gamma waiting for room.
    let once = slotgate_tests::gate::run(&[
        "top",
        "--once",
        "--width",
        "100",
        "--admin",
        gate.admin_addr(),
    ]);
    let once = slotgate_tests::gate::succeeded(&once);
    let row = |model: &str| {
        once.lines()
            .find(|l| l.starts_with(model))
            .unwrap_or_else(|| panic!("no {model} row in\n{once}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(once.contains("Models 2/3 loaded"), "{once}");
    assert!(row("alpha").starts_with("alpha loaded 2/2 0/"), "{once}");
    assert!(row("beta").starts_with("beta loaded 2/2 0/"), "{once}");
    assert!(
        row("gamma").starts_with("gamma waiting for room") && row("gamma").contains(" 0/1 1/"),
        "{once}"
    );
    assert_eq!(router_state(&gate.status().await, "gamma"), "unloaded");
    // Looked at after the snapshot: beta's answers may be over soon after it on a fast machine.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!tokenize.is_finished(), "the count did not wait for gamma");
    // Nothing of alpha's or beta's fails; beta, idle first, is the one unloaded.
    for t in beta {
        slotgate_tests::llama::chat_usage(&t.await.unwrap(), BETA_TOKENS);
    }
    let resp = gamma.await.unwrap();
    slotgate_tests::llama::chat_usage(&resp, 8);
    let gamma_took = t0.elapsed();
    let counted = tokenize.await.unwrap();
    assert_eq!(counted.status, 200, "{}", counted.body);
    assert!(
        counted.json()["tokens"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{}",
        counted.body
    );
    let s = gate.status().await;
    assert_eq!(
        router_state(&s, "alpha"),
        "loaded",
        "alpha was busy and must stay: {s}"
    );
    assert!(
        !alpha.iter().all(|t| t.is_finished()),
        "gamma should be served while alpha is still busy (took {gamma_took:?})"
    );
    for t in alpha {
        slotgate_tests::llama::chat_usage(&t.await.unwrap(), 1800);
    }
    assert_eq!(
        gate.metric("slotgate_model_unloads_total", &[("model", "beta")])
            .await,
        Some(1.0)
    );
    assert_eq!(
        gate.metric("slotgate_model_unloads_total", &[("model", "alpha")])
            .await,
        None
    );
    let s = gate.status().await;
    assert_eq!(router_state(&s, "beta"), "unloaded", "{s}");
    assert_eq!(router_state(&s, "gamma"), "loaded", "{s}");
    assert_eq!(pool(&s, "beta").unwrap()["admitting"], false, "{s}");
    // beta again: it waits for alpha or gamma to be idle (both are now), and is served.
    let resp = gate.client().post_json(CHAT, &chat_for("beta", 4)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let outcomes = gate.metrics().await;
    for outcome in [
        "upstream_4xx",
        "upstream_5xx",
        "upstream_error",
        "queue_timeout",
    ] {
        assert_eq!(
            outcomes.value_or_zero("slotgate_requests_total", &[("outcome", outcome)]),
            0.0,
            "{outcome}"
        );
    }
    assert_pools_idle(&gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_that_cannot_load_is_a_503_naming_it_and_is_retried_after_a_backoff() {
    let _one = serial().await;
    let llama = LlamaServer::start_router_with(&["alpha"], &["broken"], 2, &[]).await;
    let gate = Gate::new().queue_timeout("60s").start_before(&llama).await;
    gate.wait_status(Duration::from_secs(10), "the router's models", |s| {
        router_state(s, "broken") == "unloaded"
    })
    .await;
    // Two waiting for it: both get the 503, naming it and its exit.
    let tasks: Vec<_> = (0..2).map(|_| spawn_chat(&gate, "broken", 8)).collect();
    for t in tasks {
        let resp = t.await.unwrap();
        assert_eq!(resp.status, 503, "{}", resp.body);
        let e = &resp.json()["error"];
        assert_eq!(e["code"], "model_unavailable", "{}", resp.body);
        assert_eq!(e["type"], "server_error", "{}", resp.body);
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("`broken`") && message.contains("exited with code"),
            "{message}"
        );
        assert!(resp.header("retry-after").is_some(), "{:?}", resp.headers);
        assert_eq!(
            resp.header("x-slotgate-reason").as_deref(),
            Some("upstream_error")
        );
    }
    // At once while it backs off, without asking the router again.
    let t0 = Instant::now();
    let resp = gate.client().post_json(CHAT, &chat_for("broken", 8)).await;
    assert_eq!(resp.status, 503, "{}", resp.body);
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    let failed = [("model", "broken"), ("result", "failed")];
    assert_eq!(
        gate.metric("slotgate_model_loads_total", &failed).await,
        Some(1.0)
    );
    let s = gate.status().await;
    let p = pool(&s, "broken").unwrap();
    assert_eq!(p["load"]["failures"], 1, "{p}");
    assert!(
        p["load"]["error"].as_str().unwrap().contains("exited"),
        "{p}"
    );
    // Another model is served meanwhile.
    let resp = gate.client().post_json(CHAT, &chat_for("alpha", 8)).await;
    slotgate_tests::llama::chat_usage(&resp, 8);
    // After the backoff, the next request tries again (and fails again, with a longer backoff).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let resp = gate.client().post_json(CHAT, &chat_for("broken", 8)).await;
    assert_eq!(resp.status, 503, "{}", resp.body);
    assert_eq!(
        gate.metric("slotgate_model_loads_total", &failed).await,
        Some(2.0)
    );
    let retry: u64 = resp.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry, 2, "the backoff doubles");
    assert_pools_idle(&gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_model_flooded_does_not_delay_another_and_overrides_apply() {
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha", "beta"], 2, &[]).await;
    // alpha: one slot, two queue places, its own timeout; beta: the defaults.
    let config = unique_dir("router-config").join("slotgate.toml");
    std::fs::write(
        &config,
        "[models.alpha]\nslots = 1\nqueue-depth = 2\nqueue-timeout = \"90s\"\n",
    )
    .unwrap();
    let gate = Gate::new()
        .queue_timeout("60s")
        .queue_depth(8)
        .config_file(&config)
        .start_before(&llama)
        .await;
    for m in ["alpha", "beta"] {
        let resp = gate.client().post_json(CHAT, &chat_for(m, 4)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    let s = gate.status().await;
    let a = pool(&s, "alpha").unwrap();
    assert_eq!(
        (
            a["slots"].as_u64(),
            a["capacity"].as_u64(),
            a["slots_source"].as_str()
        ),
        (Some(1), Some(2), Some("fixed")),
        "{a}"
    );
    assert_eq!(a["queue_timeout_seconds"], 90.0, "{a}");
    let b = pool(&s, "beta").unwrap();
    assert_eq!(
        (b["slots"].as_u64(), b["capacity"].as_u64()),
        (Some(2), Some(8)),
        "{b}"
    );

    // Five long requests for alpha: one runs, two wait, two are refused with its Retry-After.
    let flood: Vec<_> = (0..5).map(|_| spawn_chat(&gate, "alpha", 1200)).collect();
    gate.wait_status(Duration::from_secs(10), "alpha's queue full", |s| {
        pool(s, "alpha").is_some_and(|p| p["busy"] == 1 && p["depth"] == 2)
    })
    .await;
    gate.wait_metric(
        "slotgate_model_requests_total",
        &[("model", "alpha"), ("outcome", "queue_full")],
        2.0,
    )
    .await;
    // beta's requests meanwhile: admitted at once, answered while alpha's backlog is still there.
    for _ in 0..3 {
        let resp = gate.client().post_json(CHAT, &chat_for("beta", 16)).await;
        slotgate_tests::llama::chat_usage(&resp, 16);
        assert_eq!(queue_wait_ms(&resp), 0);
    }
    let s = gate.status().await;
    assert_eq!(
        pool(&s, "alpha").unwrap()["depth"],
        2,
        "alpha still backed up: {s}"
    );
    let (mut ok, mut refused) = (0, 0);
    for t in flood {
        let resp = t.await.unwrap();
        match resp.status.as_u16() {
            200 => ok += 1,
            429 => {
                refused += 1;
                assert_eq!(resp.json()["error"]["code"], "queue_full", "{}", resp.body);
                assert!(resp.header("retry-after").is_some());
            }
            other => panic!("{other}: {}", resp.body),
        }
    }
    assert_eq!((ok, refused), (3, 2));
    assert_eq!(
        gate.metric(
            "slotgate_model_requests_total",
            &[("model", "beta"), ("outcome", "queue_full")]
        )
        .await,
        None
    );
    assert_pools_idle(&gate).await;
}

/// The router as people run it: no `-np` (each child 4 slots over one shared KV pool), with
/// `--api-key`, reached by the OpenAI and Anthropic SDKs from PyPI. slotgate's own calls (its
/// `/models`, loads, `/props?model=`, counts) carry the key it was given; requests outside the
/// slots that name a model wait for slotgate's load instead of having the router load it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_on_its_defaults_with_a_key_serves_the_sdks() {
    use slotgate_tests::python::{arg, assert_anthropic_whole, driver, python};
    const KEY: &str = "sk-router-secret";
    let _one = serial().await;
    python();
    let llama =
        LlamaServer::start_router_defaults(&["alpha", "beta"], 2, 4096, &["--api-key", KEY]).await;
    let file = unique_dir("router-key").join("llama.key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    let (gate, base) = crate::llama_today::gate_before(
        &llama,
        Gate::new()
            .queue_timeout("60s")
            .opt("--upstream-api-key-file", file.display()),
    )
    .await;
    let s = gate
        .wait_status(
            Duration::from_secs(10),
            "the router's models, read with the key",
            |s| router_state(s, "beta") == "unloaded",
        )
        .await;
    assert_eq!(s["upstream"]["role"], "router", "{s}");
    let key = format!("Bearer {KEY}");
    let auth = [("authorization", key.as_str())];

    // `GET /props?model=beta` while beta is unloaded: slotgate loads it, then forwards.
    let props = gate
        .client()
        .send_with(http::Method::GET, "/props?model=beta", &auth, "")
        .await;
    assert_eq!(props.status, 200, "{}", props.body);
    assert_eq!(props.json()["total_slots"], 4, "{}", props.body);
    assert_eq!(
        gate.metric(
            "slotgate_model_loads_total",
            &[("model", "beta"), ("result", "loaded")]
        )
        .await,
        Some(1.0),
        "slotgate, not the router, loaded beta"
    );
    // An unknown model there too: 404 at once.
    let none = gate
        .client()
        .send_with(http::Method::GET, "/props?model=zeta", &auth, "")
        .await;
    assert_eq!(none.status, 404, "{}", none.body);
    assert_eq!(none.json()["error"]["code"], "model_not_found");

    // The SDKs, with the server's key: OpenAI chat (alpha, unloaded: it waits for its load) and a
    // stream (beta), Anthropic messages and count_tokens (alpha).
    let sdk = |script: &str, model: &str, extra: &[&str]| {
        let mut args = vec![
            arg("--base-url"),
            arg(match script {
                "openai_calls.py" => format!("{base}/v1"),
                _ => base.clone(),
            }),
            arg("--model"),
            arg(model),
            arg("--api-key"),
            arg(KEY),
        ];
        args.extend(extra.iter().map(arg));
        args
    };
    let c: serde_json::Value = driver(
        "openai_calls.py",
        &sdk("openai_calls.py", "alpha", &["chat", "--max-tokens", "12"]),
    )
    .await;
    assert_eq!(c["object"], "chat.completion", "{c}");
    assert_eq!(c["usage"]["completion_tokens"], 12, "{c}");
    let st: serde_json::Value = driver(
        "openai_calls.py",
        &sdk(
            "openai_calls.py",
            "beta",
            &["stream", "--max-tokens", "9", "--include-usage"],
        ),
    )
    .await;
    assert_eq!(st["finish_reason"], "length", "{st}");
    assert_eq!(st["usage"]["completion_tokens"], 9, "{st}");
    let m: serde_json::Value = driver(
        "anthropic_calls.py",
        &sdk(
            "anthropic_calls.py",
            "alpha",
            &["messages", "--max-tokens", "6"],
        ),
    )
    .await;
    assert_eq!(m["type"], "message", "{m}");
    assert_anthropic_whole(&m, 6);
    let n: serde_json::Value = driver(
        "anthropic_calls.py",
        &sdk("anthropic_calls.py", "alpha", &["count"]),
    )
    .await;
    assert!(n["input_tokens"].as_u64().is_some_and(|n| n > 0), "{n}");

    // Each pool learned its child's defaults: 4 slots over one shared pool of 4096 tokens.
    let s = gate.status().await;
    for model in ["alpha", "beta"] {
        let p = pool(&s, model).unwrap_or_else(|| panic!("no pool for {model}: {s}"));
        assert_eq!(p["slots"], 4, "{p}");
        assert_eq!(p["kv_pool_tokens"], 4096, "{p}");
        assert_eq!(p["admitting"], true, "{p}");
    }
    // Four requests for alpha at once: its four slots, one shared pool, llama-server defers none.
    let req = Req::from_json(chat_for("alpha", 200)).header("authorization", &key);
    let tasks: Vec<_> = (0..4)
        .map(|_| spawn_post(&gate.client(), CHAT, &req))
        .collect();
    let mut busy = 0;
    let t0 = Instant::now();
    while !tasks.iter().all(|t| t.is_finished()) && t0.elapsed() < Duration::from_secs(60) {
        let s = gate.status().await;
        busy = busy.max(
            pool(&s, "alpha")
                .and_then(|p| p["busy"].as_u64())
                .unwrap_or(0),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (resp, _) in join_all(tasks).await {
        slotgate_tests::llama::chat_usage(&resp, 200);
    }
    assert_eq!(busy, 4, "alpha's four slots at once");
    let text = llama.get("/metrics?model=alpha&autoload=false").await.body;
    assert_eq!(
        Metrics::parse(&text).value("llamacpp:requests_deferred", &[]),
        Some(0.0),
        "{text}"
    );
    // Nothing was refused by the router (no 401: every call of slotgate's carried the key).
    let metrics = gate.metrics().await;
    for outcome in ["upstream_4xx", "upstream_5xx", "upstream_error"] {
        assert_eq!(
            metrics.value_or_zero("slotgate_requests_total", &[("outcome", outcome)]),
            0.0,
            "{outcome}"
        );
    }
    assert_eq!(gate.status().await["upstream"]["auth"]["refused"], false);
    assert_pools_idle(&gate).await;
}

/// Children on llama-server's default threads (each a thread per core): two models decoding at
/// once would run several times slower than one after the other, so slotgate's pools take turns.
/// Four requests for two models at once: each model runs its batch on both its slots, never while
/// the other decodes, and every request is served in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_on_every_core_take_turns_and_each_runs_its_batch_whole() {
    let _one = serial().await;
    let llama = LlamaServer::start_router_all_cores(&["alpha", "beta"], 2).await;
    let gate = gate_with_loaded(&llama, &["alpha", "beta"]).await;
    let s = gate
        .wait_status(Duration::from_secs(10), "the models taking turns", |s| {
            s["model_turns"]["taking_turns"] == true
        })
        .await;
    assert_eq!(s["model_turns"]["setting"], "auto", "{s}");
    let max_tokens = 400;
    let tasks: Vec<_> = ["alpha", "alpha", "beta", "beta"]
        .into_iter()
        .map(|m| spawn_chat(&gate, m, max_tokens))
        .collect();
    let (mut together, mut peak, mut behind) = (0, (0, 0), 0.0f64);
    let t0 = Instant::now();
    while !tasks.iter().all(|t| t.is_finished()) && t0.elapsed() < Duration::from_secs(120) {
        let s = gate.status().await;
        let busy = |m| pool(&s, m).and_then(|p| p["busy"].as_u64()).unwrap_or(0);
        let (a, b) = (busy("alpha"), busy("beta"));
        if a > 0 && b > 0 {
            together += 1;
        }
        peak = (peak.0.max(a), peak.1.max(b));
        // Whichever waits behind the other's turn has that turn in its estimate.
        for (model, other) in [("beta", a), ("alpha", b)] {
            let p = pool(&s, model).unwrap();
            if other > 0 && p["busy"] == 0 && p["depth"].as_u64() > Some(0) {
                behind = behind.max(p["estimated_wait_seconds"].as_f64().unwrap());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in tasks {
        slotgate_tests::llama::chat_usage(&t.await.unwrap(), max_tokens);
    }
    assert_eq!(together, 0, "both models decoded at once");
    assert!(
        behind > 0.0,
        "the waiting model's estimate left out the other's turn"
    );
    assert_eq!(peak, (2, 2), "each model's batch on both its slots");
    assert_pools_idle(&gate).await;
}

/// With `--sheddable-priority 10` before a router: sheddable work yields only to an urgent request
/// for the same model, as each model's slots are its own. Two background streams hold alpha's two
/// slots; an urgent request for beta is served beside them without shedding anything, one for
/// alpha sheds one of them (the other finishes whole), and alpha's child stops generating it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_models_urgent_request_sheds_only_that_models_sheddable_work() {
    let _one = serial().await;
    // The long-context model, two slots of 8,192 tokens each per child: streams of seconds.
    let llama =
        LlamaServer::start_router_defaults(&["alpha", "beta"], 2, 16_384, &["-np", "2"]).await;
    let gate = Gate::new()
        .queue_timeout("120s")
        .trust_client_priority()
        .opt("--sheddable-priority", 10)
        .start_before(&llama)
        .await;
    for m in ["alpha", "beta"] {
        let resp = gate.client().post_json(CHAT, &chat_for(m, 4)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    let at = |mut body: serde_json::Value, priority: i64, stream: bool| {
        body["priority"] = priority.into();
        if stream {
            body["stream"] = true.into();
        }
        body
    };
    // Two streams of 6,000 tokens: seconds of generation side by side on one thread.
    let mut readers = Vec::new();
    for _ in 0..2 {
        let body = at(chat_for("alpha", 6_000), 10, true);
        let mut stream = gate.client().stream(CHAT, &body).await;
        assert_eq!(stream.status, 200);
        stream.first_event(Duration::from_secs(30)).await;
        readers.push(tokio::spawn(stream.read_sse(Duration::from_secs(120))));
    }
    let s = gate.status().await;
    let alpha = pool(&s, "alpha").unwrap();
    assert_eq!(
        (alpha["busy"].clone(), alpha["sheddable"].clone()),
        (2.into(), 2.into()),
        "{s}"
    );

    // beta's slots are free: nothing is shed for it.
    let resp = gate
        .client()
        .post_json(CHAT, &at(chat_for("beta", 8), 0, false))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let s = gate.status().await;
    assert_eq!(s["shedding"]["yielding"], 0, "{s}");
    assert_eq!(pool(&s, "alpha").unwrap()["sheddable"], 2, "{s}");

    // alpha's are not: one of its streams yields.
    let urgent = gate
        .client()
        .post_json(CHAT, &at(chat_for("alpha", 8), 0, false))
        .await;
    assert_eq!(urgent.status, 200, "{}", urgent.body);
    let waited = queue_wait_ms(&urgent);
    // alpha's child stopped generating the shed stream: one slot processing while the streams,
    // started together for the same length, are not both over.
    let processing = || async {
        let slots = llama.get("/slots?model=alpha").await.json();
        let busy = slots
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["is_processing"] == true)
            .count();
        (busy == 1).then_some(())
    };
    eventually(
        Duration::from_secs(5),
        "alpha's child down to one slot",
        processing,
    )
    .await;
    assert!(
        !readers.iter().all(|r| r.is_finished()),
        "the surviving stream was still under way"
    );
    let mut ended = (0, 0);
    for r in join_all(readers).await {
        if r.done {
            ended.1 += 1;
            continue;
        }
        let last: serde_json::Value = serde_json::from_str(r.data.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "shed", "{last}");
        ended.0 += 1;
    }
    eprintln!("alpha's urgent request waited {waited} ms; (shed, finished) = {ended:?}");
    assert_eq!(
        ended,
        (1, 1),
        "one of alpha's streams shed, the other whole"
    );
    assert!(waited < 2_000, "alpha's urgent request waited {waited} ms");
    let s = gate.status().await;
    assert_eq!(
        pool(&s, "alpha").unwrap()["shed_after_first_byte"],
        1,
        "{s}"
    );
    assert_eq!(pool(&s, "beta").unwrap()["shed_after_first_byte"], 0, "{s}");
    assert_eq!(s["shedding"]["shed_after_first_byte"], 1, "{s}");
    assert_pools_idle(&gate).await;
    assert_eq!(
        llama_gauge(&llama, "alpha", "llamacpp:requests_processing").await,
        0.0
    );
}
