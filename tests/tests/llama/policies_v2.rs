//! End to end: a chain of v2 policies in three languages (slotgate:policy@2.0.0 components) in the
//! real `slotgate` binary in front of a real llama-server: tenant-priority in TypeScript names the
//! tenant and its priority, request-guard in Python denies, token-budget in Rust charges the
//! estimate and settles it to the usage llama-server reported, and the probe after them shows what
//! the chain passed along. And the four Rust examples as components in one chain: a priority, a
//! denial, a budget and a quota charged and settled. The components are built from the registries by
//! `scripts/build-policies.sh`, `build-policies-py.sh` and `build-policies-ts.sh`.

use std::time::Duration;

use serde_json::{json, Value};
use slotgate_tests::llama::LlamaServer;
use slotgate_tests::*;

/// What each language's example is called when built.
const TS_PRIORITY: &str = "tenant-priority-ts";
const PY_GUARD: &str = "request-guard-py";
const RUST_BUDGET: &str = "token-budget-v2";

const KEY: &str = "k-frontend";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_of_three_languages_denies_prioritises_and_settles_on_the_real_llama_server() {
    let _serial = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(2).await;
    let dir = unique_dir("policies-v2-e2e");
    let hashed = slotgate_tests::gate::hash_key(KEY);
    let priority = frontend_priority(&hashed);
    let guard = json!({ "max_tokens": 64, "over_max_tokens": "deny", "cache_isolation": true });
    let budget = json!({ "capacity": 100000, "refill_per_second": 0, "default_max_tokens": 64 });
    let config = chain_config(
        &dir,
        &[
            (TS_PRIORITY, Some(&priority)),
            (PY_GUARD, Some(&guard)),
            (RUST_BUDGET, Some(&budget)),
            ("probe-policy-v2", None),
        ],
    );
    let gate = Gate::new()
        .upstream_path(llama.socket())
        .slots(2)
        .config_file(&config)
        .opt("--cost-tokenizer", "estimate")
        // Compiled once: a Python or JavaScript component takes seconds to compile.
        .env(
            "SLOTGATE_POLICY_CACHE_DIR",
            &policy_cache().display().to_string(),
        )
        .start()
        .await;
    let client = gate.client();
    let with_key = [("authorization", format!("Bearer {KEY}"))];

    // Allowed: the TypeScript policy's tenant and priority, the Rust policy's cost, reach the probe.
    let (resp, earlier) = say_hello_as_the_frontend(&client, 3).await;
    let cost = earlier["cost"].as_u64().expect("token-budget's cost");
    assert!(cost > 8, "the estimate and max_tokens: {earlier}");
    let usage: Value = serde_json::from_str::<Value>(&resp.body).unwrap()["usage"].clone();
    let used = usage["total_tokens"].as_u64().expect("usage.total_tokens");

    // Denied by Python, in the OpenAI error shape, before llama-server sees it.
    let too_long = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 500});
    let denied = client
        .post_json_with_headers(CHAT, &too_long, &with_key)
        .await;
    assert_error(&denied, 403, "policy_denied");
    assert!(
        denied.body.contains("max_tokens"),
        "the Python policy's message: {}",
        denied.body
    );

    // Charged the estimate, then settled to llama-server's usage: the bucket is down by `used`.
    let level_of = |status: &Value| -> Option<f64> {
        status["state"]["buckets"]["emptiest"]
            .as_array()?
            .iter()
            .find(|b| b["key"] == hashed.as_str())?["level"]
            .as_f64()
    };
    let status = gate
        .wait_status(
            Duration::from_secs(10),
            &format!("the budget settled to {used} tokens used"),
            |status| level_of(status).is_some_and(|l| (100000.0 - l - used as f64).abs() < 0.5),
        )
        .await;
    let contracts: Vec<_> = status["policies"]["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["contract"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(contracts, ["v2", "v2", "v2", "v2"]);
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// A config file in `dir` with a `[[policy]]` for each built policy, in order, with its settings.
fn chain_config(dir: &std::path::Path, chain: &[(&str, Option<&Value>)]) -> std::path::PathBuf {
    let mut toml = String::new();
    for (name, settings) in chain {
        toml += &format!("[[policy]]\npath = \"{}\"\n", wat::built(name).display());
        if let Some(settings) = settings {
            toml += &format!("settings = {}\n", toml_inline(settings));
        }
        toml += "\n";
    }
    let config = dir.join("slotgate.toml");
    std::fs::write(&config, toml).unwrap();
    config
}

/// tenant-priority's settings: the key hashed to `hashed` is `chat-frontend` at priority -5, any
/// other caller `public` at 0.
fn frontend_priority(hashed: &str) -> Value {
    json!({
        "tenants": { "chat-frontend": { "api_keys": [hashed], "priority": -5, "ceiling": -10 } },
        "unknown": { "tenant": "public", "priority": 0, "ceiling": 0 },
    })
}

/// A short chat sent with [`KEY`]: answered 200, with the probe (after `policies` others) seeing
/// the tenant-priority policy's tenant and priority. The answer and what the probe saw.
async fn say_hello_as_the_frontend(client: &Client, policies: u64) -> (client::Response, Value) {
    let with_key = [("authorization", format!("Bearer {KEY}"))];
    let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8});
    let resp = client.post_json_with_headers(CHAT, &body, &with_key).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let earlier = probe_earlier(&resp);
    assert_eq!(earlier["policies"], policies, "{earlier}");
    assert_eq!(earlier["tenant"], "chat-frontend", "{earlier}");
    assert_eq!(earlier["priority"], -5, "{earlier}");
    (resp, earlier)
}

/// What the probe at the end of the chain saw of the policies before it.
fn probe_earlier(resp: &client::Response) -> Value {
    serde_json::from_str(
        &resp
            .header("x-probe-earlier-v2")
            .expect("the probe's header"),
    )
    .unwrap()
}

/// JSON as a TOML inline value (its objects as inline tables).
fn toml_inline(v: &Value) -> String {
    let t: toml::Value = serde_json::from_value(v.clone()).unwrap();
    match t {
        toml::Value::Table(table) => {
            let parts: Vec<String> = table
                .iter()
                .map(|(k, v)| format!("{k:?} = {}", toml_inline(&serde_json::to_value(v).unwrap())))
                .collect();
            format!("{{ {} }}", parts.join(", "))
        }
        toml::Value::Array(items) => {
            let parts: Vec<String> = items
                .iter()
                .map(|v| toml_inline(&serde_json::to_value(v).unwrap()))
                .collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.to_string(),
    }
}

/// The compile cache the tests share, beside the other caches.
fn policy_cache() -> std::path::PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| "/tmp".into(), std::path::PathBuf::from);
    home.join(".cache/slotgate/policy-cache")
}

/// The four Rust examples as v2 components, in one chain in front of the real llama-server:
/// tenant-priority names the tenant and its priority (seen by the probe after it), request-guard
/// denies, token-budget and quota charge and settle from llama-server's usage, and quota's
/// rate-limit headers count what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_examples_as_components_decide_on_the_real_llama_server() {
    let _serial = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(2).await;
    let dir = unique_dir("rust-v2-e2e");
    let hashed = slotgate_tests::gate::hash_key(KEY);
    let priority = frontend_priority(&hashed);
    let guard = json!({ "max_tokens": 64, "over_max_tokens": "deny" });
    let budget = json!({ "capacity": 100000, "refill_per_second": 0, "default_max_tokens": 64 });
    let quota =
        json!({ "period": "day", "tokens": 50000, "requests": 100, "default_max_tokens": 64 });
    let config = chain_config(
        &dir,
        &[
            ("tenant-priority-v2", Some(&priority)),
            ("request-guard-v2", Some(&guard)),
            ("token-budget-v2", Some(&budget)),
            ("quota-v2", Some(&quota)),
            ("probe-policy-v2", None),
        ],
    );
    let gate = Gate::new()
        .slots(2)
        .config_file(&config)
        .opt("--cost-tokenizer", "estimate")
        .start_before(&llama)
        .await;
    let client = gate.client();
    let with_key = [("authorization", format!("Bearer {KEY}"))];

    let (resp, _) = say_hello_as_the_frontend(&client, 4).await;
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("99"),
        "quota's headers: {:?}",
        resp.headers
    );
    let used = serde_json::from_str::<Value>(&resp.body).unwrap()["usage"]["total_tokens"]
        .as_u64()
        .expect("usage.total_tokens");

    let too_long = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 500});
    let denied = client
        .post_json_with_headers(CHAT, &too_long, &with_key)
        .await;
    assert_error(&denied, 403, "policy_denied");

    // Both budgets settled to the usage llama-server reported.
    let settled = |status: &Value| -> bool {
        let bucket = status["state"]["buckets"]["emptiest"]
            .as_array()
            .and_then(|b| b.iter().find(|b| b["key"] == hashed.as_str()))
            .and_then(|b| b["level"].as_f64());
        let quota_left = status["state"]["quotas"]["emptiest"]
            .as_array()
            .and_then(|q| {
                q.iter()
                    .find(|q| q["key"].as_str().is_some_and(|k| k.contains("tokens")))
            })
            .and_then(|q| q["left"].as_f64());
        bucket.is_some_and(|l| (100000.0 - l - used as f64).abs() < 0.5)
            && quota_left.is_some_and(|l| (50000.0 - l - used as f64).abs() < 0.5)
    };
    gate.wait_status(
        Duration::from_secs(10),
        &format!("budgets settled to {used} tokens"),
        settled,
    )
    .await;
    gate.assert_idle().await;
    llama.assert_idle().await;
}
