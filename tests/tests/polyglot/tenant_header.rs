//! token-budget's `tenant_header`, in the Rust policy and its AssemblyScript port, through the real
//! sidecar: behind a router that calls with one key for all its callers (LiteLLM), each caller's
//! `x-tenant` gets a budget of its own; without the header the router's key has one.

use std::path::Path;

use slotgate_tests::*;

/// A request charged 100 tokens plus its prompt estimate, and reported as having used exactly that.
fn spending(tag: &str) -> Req {
    Req::chat(tag)
        .set("max_tokens", 100)
        .prompt_tokens(0)
        .completion_tokens(100)
}

async fn send(gate: &RunningGate, tenant: Option<&str>, tag: &str) -> Response {
    let mut headers = vec![("authorization", "Bearer the-router-key".to_owned())];
    if let Some(t) = tenant {
        headers.push(("x-tenant", t.to_owned()));
    }
    gate.client()
        .post_json_with_headers(CHAT, &spending(tag).json(), &headers)
        .await
}

async fn each_caller_behind_one_key_has_a_budget(policy: &Path) {
    // About two requests of ~101 tokens per budget; a fixed quota (no refill).
    let settings = r#"{ capacity = 250, refill_per_second = 0, tenant_header = "x-tenant" }"#;
    let (up, gate) = Gate::one_slot(4)
        .policies(&[(policy, Some(settings))])
        .start_instant()
        .await;
    let mut served = std::collections::BTreeMap::new();
    for tenant in [Some("team-a"), Some("team-b"), None] {
        let mut n = 0;
        for i in 0..4 {
            let resp = send(&gate, tenant, &format!("{tenant:?}-{i}")).await;
            match resp.status.as_u16() {
                200 => n += 1,
                429 => {
                    assert_error_says(&resp, 429, "policy_denied", "token budget exhausted");
                }
                other => panic!("{other}: {}", resp.body),
            }
        }
        served.insert(format!("{tenant:?}"), n);
    }
    assert_eq!(
        served.values().copied().collect::<Vec<_>>(),
        [2, 2, 2],
        "two requests per budget: {served:?}"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rust_token_budget_keys_on_the_tenant_header() {
    each_caller_behind_one_key_has_a_budget(&wat::built("token-budget")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn assemblyscript_token_budget_keys_on_the_tenant_header() {
    each_caller_behind_one_key_has_a_budget(&wat::built_as("token-budget")).await;
}

#[test]
fn a_header_policies_cannot_see_is_refused_at_load() {
    let dir = wait::unique_dir("tenant-header");
    let settings = dir.join("settings.json");
    std::fs::write(
        &settings,
        r#"{"capacity": 10, "refill_per_second": 1, "tenant_header": "authorization"}"#,
    )
    .unwrap();
    for policy in [wat::built("token-budget"), wat::built_as("token-budget")] {
        let out = gate::run(&[
            "policy",
            "check",
            policy.to_str().unwrap(),
            "--settings",
            settings.to_str().unwrap(),
        ]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{text}");
        assert!(
            text.contains("tenant_header `authorization` is not a header policies see"),
            "{text}"
        );
    }
}
