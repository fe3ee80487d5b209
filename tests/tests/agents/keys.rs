//! Claude Code with a key slotgate issued (docs/keys.md): `ANTHROPIC_AUTH_TOKEN` set to a key from
//! `slotgate key create` is served under its tenant's name and ends as it does direct; an invented
//! key and the same key once revoked end in an authentication error from slotgate, before
//! llama-server sees anything.

use slotgate_tests::agents::{access_log, Agent, Stage};
use slotgate_tests::llama::serial;
use slotgate_tests::*;

use super::KEY;

const ADMIN: &str = "admin-token-agent-keys";

/// `slotgate ARGS --json`, which must succeed: what it printed.
fn cli(stage: &Stage, args: &[&str]) -> serde_json::Value {
    let (ok, out, err) = stage.gate.admin_cli(&[args, &["--json"]].concat());
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claude_code_with_a_slotgate_key_is_served_under_its_name_and_refused_once_revoked() {
    let _one = serial().await;
    let stage = Stage::start(
        1,
        Gate::new().opt("--client-auth", "keys").admin_token(ADMIN),
    )
    .await;
    let key = cli(&stage, &["key", "create", "--tenant", "claude-ci"]);
    let (id, secret) = (key["id"].as_str().unwrap(), key["secret"].as_str().unwrap());

    let direct = Agent::ClaudeCode.run(&stage.direct(KEY)).await;
    let through = Agent::ClaudeCode.run(&stage.through(secret)).await;
    through.assert_same_as(&direct);
    let log = access_log(&stage.gate.stderr_text());
    let prompts: Vec<_> = log
        .iter()
        .filter(|a| a.path == Agent::ClaudeCode.route())
        .collect();
    assert!(!prompts.is_empty(), "{log:#?}");
    for a in &prompts {
        assert_eq!(a.tenant.as_deref(), Some("claude-ci"), "{a:?}");
        assert_eq!(a.outcome, "ok", "{a:?}");
    }

    // An invented key, then the real one revoked: Claude Code fails on slotgate's 401.
    let invented = Agent::ClaudeCode
        .run(&stage.through("sk-ant-invented").no_retries())
        .await;
    cli(&stage, &["key", "revoke", id]);
    let revoked = Agent::ClaudeCode
        .run(&stage.through(secret).no_retries())
        .await;
    for (what, run) in [("invented", &invented), ("revoked", &revoked)] {
        assert!(
            run.code != Some(0) || run.error.is_some(),
            "Claude Code with the {what} key did not fail: {:?}\n{}",
            run.ending(),
            run.stdout
        );
        assert_ne!(run.answer.as_deref(), direct.answer.as_deref(), "{what}");
    }
    let log = access_log(&stage.gate.stderr_text());
    let refused = log
        .iter()
        .filter(|a| a.path == Agent::ClaudeCode.route() && a.outcome == "unauthorized")
        .count();
    assert!(refused >= 2, "{log:#?}");
    assert!(
        !stage
            .gate
            .stderr_text()
            .contains(&secret[secret.len() - 48..]),
        "the secret in slotgate's log"
    );
    stage.assert_idle().await;
}
