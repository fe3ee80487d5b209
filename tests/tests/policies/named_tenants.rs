//! One name per person everywhere (docs/keys.md#one-name-everywhere): under `--client-auth keys`
//! the tenant a key was issued to is the name the `quota` policy charges, its settings take, the
//! quota list and its refusals say, the ledger books, the access line and `/live` show, and the
//! caller reads back on `GET /v1/slotgate/me`. No `sha256:` hash appears for a keyed caller.

use http::Method;
use serde_json::{json, Value};
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::CHAT;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

const ADMIN: &str = "admin-token-named";

/// Three requests a day each; alice two.
const SETTINGS: &str =
    "{ period = \"day\", requests = 3, tokens = 100000, tenants = { \"alice\" = { requests = 2 } } }";

fn cli(gate: &RunningGate, args: &[&str]) -> String {
    let (ok, out, err) = gate.admin_cli(args);
    assert!(ok, "{args:?}: {out}{err}");
    out
}

fn secret(gate: &RunningGate, tenant: &str, team: &str) -> String {
    let out = cli(
        gate,
        &[
            "key", "create", "--json", "--tenant", tenant, "--team", team,
        ],
    );
    serde_json::from_str::<Value>(out.trim()).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn chat(gate: &RunningGate, key: &str) -> slotgate_tests::client::Response {
    let body =
        json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    gate.client()
        .send_with(Method::POST, CHAT, &[("x-api-key", key)], body.to_string())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_given_a_key_has_one_name_in_quotas_ledger_logs_and_their_own_view() {
    let up = FakeUpstream::instant().start().await;
    let state = unique_dir("named").join("state");
    let gate = Gate::new()
        .opt("--client-auth", "keys")
        .opt("--state-dir", state.display())
        .admin_token(ADMIN)
        .policies(&[(&wat::built("quota"), Some(SETTINGS))])
        .upstream(&up)
        .start()
        .await;
    let alice = secret(&gate, "alice", "research");
    let bob = secret(&gate, "bob", "research");

    for _ in 0..2 {
        let r = chat(&gate, &alice).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = chat(&gate, &bob).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-ratelimit-remaining-requests").as_deref(),
        Some("2"),
        "bob's own quota of 3, not alice's"
    );
    // alice's third: refused, naming her.
    let refused = chat(&gate, &alice).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("tenant alice"), "{message}");

    // Her own view: who she is and what is left, under her name.
    let me = gate
        .client()
        .get_with("/v1/slotgate/me", &[("x-api-key", &alice)])
        .await;
    assert_eq!(me.status, 200, "{}", me.body);
    let v = me.json();
    assert_eq!(v["tenant"], "alice");
    assert_eq!(v["team"], "research");
    let requests = v["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["key"] == "requests:alice")
        .unwrap_or_else(|| panic!("no requests quota in {v}"));
    assert_eq!(requests["limit"], 2.0);
    assert_eq!(requests["remaining"], 0.0);
    assert!(requests["resets"].as_str().unwrap().ends_with('Z'));
    // Nobody else's quotas, and none to a caller without a key.
    assert!(!me.body.contains("bob"), "{}", me.body);
    let anon = gate.client().get("/v1/slotgate/me").await;
    assert_eq!(anon.status, 401, "{}", anon.body);

    // The operator's views: one name each (the ledger books a request as its answer ends).
    gate.wait_outcome("ok", 3).await;
    let quotas = cli(&gate, &["quota", "list", "--json"]);
    assert!(
        quotas.contains("requests:alice") && quotas.contains("tokens:bob"),
        "{quotas}"
    );
    let usage = cli(&gate, &["usage", "--csv"]);
    assert!(
        usage.contains(",alice,") && usage.contains(",bob,"),
        "{usage}"
    );
    let live = gate.admin_get("/live").await.json();
    let tenants: Vec<&str> = live["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["tenant"].as_str().or(t["name"].as_str()))
        .collect();
    assert!(tenants.contains(&"alice"), "{tenants:?}");
    let stderr = gate.stderr_text();
    assert!(
        stderr.contains("tenant=alice") && stderr.contains("tenant=bob"),
        "{stderr}"
    );
    for text in [&quotas, &usage, &live.to_string(), &stderr, &me.body] {
        assert!(
            !text.contains("sha256:"),
            "a hash where a name should be: {text}"
        );
    }
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_team_quota_refuses_every_key_of_the_team_and_names_the_team() {
    let up = FakeUpstream::instant().start().await;
    let state = unique_dir("team").join("state");
    let settings =
        "{ period = \"day\", requests = 10, teams = { \"research\" = { requests = 3 } } }";
    let gate = Gate::new()
        .opt("--client-auth", "keys")
        .opt("--state-dir", state.display())
        .opt("--log-format", "json")
        .admin_token(ADMIN)
        .policies(&[(&wat::built("quota"), Some(settings))])
        .upstream(&up)
        .start()
        .await;
    let alice = secret(&gate, "alice", "research");
    let bob = secret(&gate, "bob", "research");
    let carol = secret(&gate, "carol", "ops");
    for key in [&alice, &alice, &bob] {
        assert_eq!(chat(&gate, key).await.status, 200);
    }
    // The team's three are spent: each of its keys is refused, naming the team; carol is not.
    for key in [&alice, &bob] {
        let r = chat(&gate, key).await;
        assert_eq!(r.status, 429, "{}", r.body);
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("of team research is spent"), "{message}");
        assert!(message.contains("whole again at"), "{message}");
        assert_eq!(r.header("x-slotgate-quota-scope").as_deref(), Some("team"));
    }
    assert_eq!(chat(&gate, &carol).await.status, 200);
    // bob sees the team's quota, and his own, in his view.
    let me = gate
        .client()
        .get_with("/v1/slotgate/me", &[("x-api-key", &bob)])
        .await
        .json();
    let team = me["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["key"] == "requests:team:research")
        .unwrap_or_else(|| panic!("{me}"));
    assert_eq!(team["remaining"], 0.0, "{me}");
    // The access line of a refusal names the team too.
    let denied: Vec<Value> = gate
        .stderr_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["outcome"] == "policy_denied")
        .collect();
    assert_eq!(denied.len(), 2, "{denied:?}");
    for line in &denied {
        assert!(
            line["reason"].as_str().unwrap().contains("team research"),
            "{line}"
        );
    }
    gate.assert_idle().await;
}
