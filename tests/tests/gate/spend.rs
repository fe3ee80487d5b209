//! Spend (docs/spend.md): with `[prices]`, each request's cost is the tokens times the prices, the
//! prompt's cached part (as llama-server reports it) at the cached price, booked in the access line
//! and in the usage ledger per tenant, team, key and model; `GET /usage` and `slotgate usage` sum
//! it per person, team or month, in JSON and CSV; a SIGKILL forgets nothing written.

use std::time::Duration;

use http::Method;
use serde_json::{json, Value};
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::CHAT;
use slotgate_tests::wait::unique_dir;

const ADMIN: &str = "admin-token-for-spend";
const PRICES: &str = "[prices]\ncurrency = \"EUR\"\n\
[prices.default]\ninput = 1.0\ncached-input = 0.1\noutput = 2.0\n";

fn gate(dir: &std::path::Path) -> Gate {
    let config = dir.join("spend.toml");
    std::fs::write(&config, PRICES).unwrap();
    Gate::one_slot(8)
        .opt("--client-auth", "keys")
        .opt("--state-dir", dir.join("state").display())
        .config_file(&config)
        .admin_token(ADMIN)
}

fn key(gate: &RunningGate, args: &[&str]) -> String {
    let mut all = vec!["key", "create", "--json"];
    all.extend_from_slice(args);
    let (ok, out, err) = gate.admin_cli(&all);
    assert!(ok, "{out}{err}");
    serde_json::from_str::<Value>(out.trim()).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A chat of 1,000 prompt tokens, 900 of them from llama-server's cache, and 50 generated.
async fn chat(gate: &RunningGate, secret: &str, stream: bool) {
    let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 50, "stream": stream,
                      "stream_options": {"include_usage": true},
                      "fake_prompt_tokens": 1000, "fake_cached_tokens": 900,
                      "fake_completion_tokens": 50});
    let r = gate
        .client()
        .send_with(
            Method::POST,
            CHAT,
            &[("x-api-key", secret)],
            body.to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// 100 processed at 1.0, 900 cached at 0.1, 50 out at 2.0, per million.
const ONE: f64 = (100.0 * 1.0 + 900.0 * 0.1 + 50.0 * 2.0) / 1e6;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_requests_cost_is_its_tokens_times_the_prices_per_person_team_and_month() {
    let dir = unique_dir("spend");
    let (up, gate) = gate(&dir).start_with(FakeUpstream::instant()).await;
    let alice = key(&gate, &["--tenant", "alice", "--team", "research"]);
    let bob = key(&gate, &["--tenant", "bob", "--team", "research"]);
    let carol = key(&gate, &["--tenant", "carol"]);
    chat(&gate, &alice, false).await;
    chat(&gate, &alice, true).await;
    chat(&gate, &bob, false).await;
    chat(&gate, &carol, true).await;
    gate.wait_outcome("ok", 4).await;

    // The access line: the cached part and the cost.
    let log = gate.stderr_text();
    let line = log
        .lines()
        .find(|l| l.contains("slotgate::access") && l.contains("tenant=alice"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("cached_tokens=900"), "{line}");
    assert!(line.contains(&format!("cost={ONE:.6}")), "{line}");

    // Per person: the JSON sums, cost in the currency.
    let by_tenant = gate.admin_get("/usage?by=tenant").await.json();
    assert_eq!(by_tenant["currency"], "EUR", "{by_tenant}");
    let row = |v: &Value, name: &str, col: &str| {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[col] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {v}"))
    };
    let a = row(&by_tenant, "alice", "tenant");
    assert_eq!(
        (
            &a["requests"],
            &a["prompt_tokens"],
            &a["cached_tokens"],
            &a["completion_tokens"]
        ),
        (&json!(2), &json!(2000), &json!(1800), &json!(100)),
        "{a}"
    );
    let near = |v: &Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-9;
    assert!(near(&a["cost"], 2.0 * ONE), "{a}");
    assert!(near(&by_tenant["total"]["cost"], 4.0 * ONE), "{by_tenant}");

    // Per team: research is alice's and bob's; carol is in none.
    let by_team = gate.admin_get("/usage?by=team").await.json();
    assert!(
        near(&row(&by_team, "research", "team")["cost"], 3.0 * ONE),
        "{by_team}"
    );
    assert!(near(&row(&by_team, "", "team")["cost"], ONE), "{by_team}");

    // The month per person, from the command line, as CSV.
    let month = jiff::Timestamp::now().strftime("%Y-%m").to_string();
    let (ok, csv, err) = gate.admin_cli(&["usage", "--month", &month, "--by", "tenant", "--csv"]);
    assert!(ok, "{err}");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("tenant,requests,prompt_tokens,cached_tokens,completion_tokens,cost_eur")
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 3, "one row per person: {csv}");
    assert!(
        rows.contains(&format!("alice,2,2000,1800,100,{:.6}", 2.0 * ONE).as_str()),
        "{csv}"
    );
    let (ok, table, err) =
        gate.admin_cli(&["usage", "--month", &month, "--by", "tenant", "--cost"]);
    assert!(
        ok && table.contains("cost EUR") && table.contains("alice"),
        "{table}{err}"
    );
    let bad = gate.admin_get("/usage?by=colour").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(up.count(), 4);

    // A SIGKILL after the ledger's flush forgets nothing.
    tokio::time::sleep(Duration::from_millis(400)).await;
    gate.signal("KILL");
    drop(gate);
    let (_up, gate) = self::gate(&dir).start_with(FakeUpstream::instant()).await;
    let after = gate.admin_get("/usage?by=tenant").await.json();
    assert!(near(&after["total"]["cost"], 4.0 * ONE), "{after}");
    assert_eq!(row(&after, "alice", "tenant")["cached_tokens"], 1800);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_prices_no_cost_appears_anywhere() {
    let dir = unique_dir("spend-none");
    let (_up, gate) = Gate::one_slot(8)
        .opt("--state-dir", dir.join("state").display())
        .admin_token(ADMIN)
        .start_with(FakeUpstream::instant())
        .await;
    let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 5, "fake_prompt_tokens": 40, "fake_cached_tokens": 30});
    let r = gate.client().post_json(CHAT, &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    gate.wait_outcome("ok", 1).await;
    let usage = gate.admin_get("/usage").await.json();
    assert!(usage.get("currency").is_none(), "{usage}");
    assert!(usage["total"].get("cost").is_none(), "{usage}");
    assert_eq!(
        usage["total"]["cached_tokens"], 30,
        "the cached part is booked still"
    );
    let csv = gate.admin_get("/usage?format=csv").await.body;
    assert!(!csv.contains("cost"), "{csv}");
    assert!(!gate.stderr_text().contains(" cost="));
    gate.assert_idle().await;
}
