//! Budgets in money (docs/spend.md#budgets-in-money): the `quota` policy's `cost` quota is charged
//! the most a request may cost at its model's price, settled by the cost the usage ledger booked
//! (the prompt's cached part at the cached price), and once spent refuses with 429
//! `quota_exceeded`, naming its scope, its amount and the window's end in the operator's zone. The
//! caller reads it back, in the currency, on `GET /v1/slotgate/me`. The same for the ABI v1 module
//! and the v2 component.

use std::time::Duration;

use http::Method;
use serde_json::{json, Value};
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::CHAT;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

const ADMIN: &str = "admin-token-money";

/// Per million tokens: 1 EUR processed, 0.1 read from the cache, 2 generated.
const PRICES: &str = "[prices]\ncurrency = \"EUR\"\n\
[prices.default]\ninput = 1.0\ncached-input = 0.1\noutput = 2.0\n";

/// 0.0005 EUR a Berlin day each; the team research 1 EUR between them.
const SETTINGS: &str =
    "{ period = \"day@Europe/Berlin\", cost = 0.0005, teams = { \"research\" = { cost = 1.0 } } }";

/// One chat as the fake llama-server answers it: 1,000 prompt tokens, 900 from its cache, and 50
/// generated: 100 × 1 + 900 × 0.1 + 50 × 2 per million.
const ONE: f64 = (100.0 * 1.0 + 900.0 * 0.1 + 50.0 * 2.0) / 1e6;

async fn chat(gate: &RunningGate, key: &str) -> slotgate_tests::client::Response {
    let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 50, "fake_prompt_tokens": 1000, "fake_cached_tokens": 900,
                      "fake_completion_tokens": 50});
    gate.client()
        .send_with(Method::POST, CHAT, &[("x-api-key", key)], body.to_string())
        .await
}

/// What the operator's quota list says is used of `key`, once it reaches `want` (a request's
/// charge is settled a moment after its answer ends).
async fn used_reaches(gate: &RunningGate, key: &str, want: f64) -> Value {
    let mut last = Value::Null;
    for _ in 0..100 {
        last = gate.admin_get(&format!("/quotas?key={key}")).await.json();
        if let Some(used) = last["quotas"][0]["used"].as_f64() {
            if (used - want).abs() < 1e-9 {
                return last["quotas"][0].clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{key} never had {want} used: {last}");
}

async fn a_money_quota_is_settled_by_the_ledgers_cost_and_refuses_once_spent(module: &str) {
    let dir = unique_dir("money");
    let config = dir.join("slotgate.toml");
    std::fs::write(
        &config,
        format!(
            "{PRICES}\n[[policy]]\npath = \"{}\"\nsettings = {SETTINGS}\n",
            wat::built(module).display()
        ),
    )
    .unwrap();
    let up = FakeUpstream::instant().start().await;
    let gate = Gate::new()
        .opt("--client-auth", "keys")
        .opt("--state-dir", dir.join("state").display())
        .config_file(&config)
        .admin_token(ADMIN)
        .upstream(&up)
        .start()
        .await;
    let (ok, out, err) = gate.admin_cli(&[
        "key", "create", "--json", "--tenant", "alice", "--team", "research",
    ]);
    assert!(ok, "{out}{err}");
    let alice = serde_json::from_str::<Value>(out.trim()).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();

    // Each is charged its most up front (a prompt of a few tokens, 50 out at 2 per million) and
    // settled by what the ledger booked: cached tokens at their price.
    let first = chat(&gate, &alice).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        first.header("x-ratelimit-limit-tokens").is_none()
            && !first.headers.keys().any(|k| k.as_str().contains("cost")),
        "neither API has a name for money: {:?}",
        first.headers
    );
    let row = used_reaches(&gate, "cost:alice", ONE).await;
    assert_eq!(row["currency"], "EUR", "{row}");
    assert_eq!(row["limit"], 0.0005, "{row}");
    let r = chat(&gate, &alice).await;
    assert_eq!(r.status, 200, "0.00021 EUR was left: {}", r.body);
    used_reaches(&gate, "cost:alice", 2.0 * ONE).await;
    used_reaches(&gate, "cost:team:research", 2.0 * ONE).await;

    // Spent: refused until midnight in Berlin, naming whose quota, its amount and its end.
    let refused = chat(&gate, &alice).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "quota_exceeded", "{error}");
    let berlin = jiff::Timestamp::now().in_tz("Europe/Berlin").unwrap();
    let midnight = berlin
        .date()
        .tomorrow()
        .unwrap()
        .to_zoned(berlin.time_zone().clone())
        .unwrap()
        .timestamp();
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("the daily cost quota of 0.0005 EUR of tenant alice is spent")
            && message.contains(&format!("whole again at {midnight}")),
        "{message}"
    );
    // Contract 2.0.0's denial has no headers: its message alone names the scope.
    let scope = refused.header("x-slotgate-quota-scope");
    assert_eq!(
        scope.as_deref(),
        (module == "quota").then_some("tenant"),
        "{module}"
    );
    let retry: i64 = refused.header("retry-after").unwrap().parse().unwrap();
    let to_midnight = (midnight - jiff::Timestamp::now()).get_seconds();
    assert!((retry - to_midnight).abs() <= 2, "{retry} vs {to_midnight}");

    // Her own view, in the currency.
    let me = gate
        .client()
        .get_with("/v1/slotgate/me", &[("x-api-key", &alice)])
        .await
        .json();
    let cost = me["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["key"] == "cost:alice")
        .cloned()
        .unwrap_or_else(|| panic!("no money quota in {me}"));
    assert_eq!(
        (&cost["currency"], &cost["remaining"]),
        (&json!("EUR"), &json!(0.0)),
        "{cost}"
    );

    // The ledger: the two served, nothing for the refused one.
    gate.wait_outcome("ok", 2).await;
    let usage = gate.admin_get("/usage?by=tenant").await.json();
    let booked = usage["total"]["cost"].as_f64().unwrap();
    assert!((booked - 2.0 * ONE).abs() < 1e-9, "{usage}");
    assert_eq!(up.count(), 2);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_money_quota_of_the_v1_module() {
    a_money_quota_is_settled_by_the_ledgers_cost_and_refuses_once_spent("quota").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_money_quota_of_the_v2_component() {
    a_money_quota_is_settled_by_the_ledgers_cost_and_refuses_once_spent("quota-v2").await;
}
