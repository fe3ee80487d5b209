//! Policies on the request path: denials with their status and Retry-After, priority and request
//! mutations from an allow, fail-closed and fail-open errors, monitor mode, and a bad policy refused at
//! start-up. Real wasm (hand-written WAT) evaluated by the real binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use slotgate_tests::errors::{assert_error, retry_after};
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

async fn gate_with(
    args: &[String],
) -> (slotgate_tests::fake_upstream::RunningUpstream, RunningGate) {
    let mut g = Gate::new().slots(1);
    for a in args {
        g = g.arg(a);
    }
    g.start_instant().await
}

fn flag(p: &Path) -> [String; 2] {
    ["--policy".into(), p.display().to_string()]
}

fn config(dir: &Path, text: &str) -> [String; 2] {
    let path: PathBuf = dir.join("slotgate.toml");
    std::fs::write(&path, text).unwrap();
    ["--config".into(), path.display().to_string()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deny_answers_with_the_policys_status_message_and_retry_after() {
    let dir = unique_dir("policy-deny");
    let deny = wat::fixed(
        &dir,
        "budget",
        r#"{"verdict":"deny","status":429,"message":"token budget exhausted","retry_after_seconds":7}"#,
    );
    let (up, gate) = gate_with(&flag(&deny)).await;
    let resp = gate.client().post_chat(&Req::chat("denied")).await;
    assert_eq!(
        assert_error(&resp, 429, "policy_denied"),
        "rate_limit_error"
    );
    assert!(
        resp.body.contains("token budget exhausted"),
        "{}",
        resp.body
    );
    assert_eq!(retry_after(&resp), 7);
    assert!(
        up.tags().is_empty(),
        "a denied request must never be forwarded"
    );
    gate.wait_outcome("policy_denied", 1).await;
    let metrics = gate.metrics().await;
    metrics.assert_present(
        "slotgate_policy_decisions_total",
        &[("policy", "budget"), ("decision", "deny")],
        1.0,
    );
    assert!(
        metrics.has_samples("slotgate_policy_eval_seconds"),
        "{}",
        metrics.text
    );
    assert!(
        metrics.has_samples("slotgate_policy_fuel_consumed"),
        "{}",
        metrics.text
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allow_sets_priority_and_mutates_the_request() {
    let dir = unique_dir("policy-allow");
    let allow = wat::fixed(
        &dir,
        "guard",
        r#"{"verdict":"allow","priority":4,"tenant":"t","mutations":{"cap_max_tokens":32,"disable_prompt_cache":true,"strip_id_slot":true,"response_headers":{"x-tenant":"t"}}}"#,
    );
    let (up, gate) = gate_with(&flag(&allow)).await;
    let req = Req::chat("m").set("max_tokens", 500).set("id_slot", 0);
    let resp = gate.client().post_json(CHAT, &req.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header("x-tenant").as_deref(), Some("t"));
    let seen = up.requests_seen();
    assert_eq!(seen.len(), 1);
    let body = &seen[0].body;
    assert_eq!(body["max_tokens"], 32, "{body}");
    assert_eq!(body["cache_prompt"], false, "{body}");
    assert!(body.get("id_slot").is_none(), "{body}");
    assert_eq!(
        body["fake_tag"], "m",
        "the rest of the body is kept: {body}"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_policy_fails_closed_by_default_and_open_when_configured() {
    let dir = unique_dir("policy-fail");
    // The canary evaluation at load would refuse a module that always traps; this one traps only on
    // real traffic: inputs longer than the canary's (the long `model` name below is in the input).
    let trap_on_long = wat::policy(
        &dir,
        "trap-long",
        1,
        r#"{"verdict":"allow"}"#,
        "(if (i32.gt_u (local.get $n) (i32.const 400)) (then unreachable))",
        "",
    );
    let long = Req::chat("x").set("model", "m".repeat(500));

    let (up, gate) = gate_with(&flag(&trap_on_long)).await;
    let resp = gate.client().post_json(CHAT, &long.json()).await;
    assert_error(&resp, 503, "policy_error");
    assert!(up.tags().is_empty());
    let metrics = gate.metrics().await;
    metrics.assert_present(
        "slotgate_policy_errors_total",
        &[("policy", "trap-long"), ("kind", "trap")],
        1.0,
    );
    gate.assert_settled(&up, 1).await;
    drop(gate);

    let open = config(
        &dir,
        &format!(
            "[[policy]]\npath = \"{}\"\non-error = \"allow\"\n",
            trap_on_long.display()
        ),
    );
    let (up, gate) = gate_with(&open).await;
    let resp = gate.client().post_json(CHAT, &long.json()).await;
    assert_eq!(
        resp.status, 200,
        "fail-open lets the request through: {}",
        resp.body
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runaway_policy_is_cut_off_and_other_requests_keep_being_served() {
    let dir = unique_dir("policy-runaway");
    let spin = wat::policy(
        &dir,
        "spin",
        1,
        r#"{"verdict":"allow"}"#,
        // Only inputs over 1000 bytes spin: an ordinary request's and the canary's are well
        // under it, the hostile one's model name alone is over it.
        "(if (i32.gt_u (local.get $n) (i32.const 1000)) (then (loop $l (br $l))))",
        "",
    );
    let text = format!(
        "[[policy]]\npath = \"{}\"\nfuel = 100000000000\ndeadline = \"50ms\"\n",
        spin.display()
    );
    let (up, gate) = gate_with(&config(&dir, &text)).await;
    let client = gate.client();
    let long = Req::chat("spin").set("model", "m".repeat(1500));
    let hostile: Vec<_> = (0..4)
        .map(|_| slotgate_tests::request::spawn_post(&client, CHAT, &long))
        .collect();
    // While the runaway evaluations are cut off, ordinary requests are answered.
    for i in 0..5 {
        let resp = client.post_chat(&Req::chat(&format!("ok{i}"))).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    for (resp, took) in slotgate_tests::request::join_all(hostile).await {
        assert_error(&resp, 503, "policy_error");
        assert!(
            took < Duration::from_secs(5),
            "a runaway evaluation took {took:?}"
        );
    }
    let metrics = gate.metrics().await;
    metrics.assert_present(
        "slotgate_policy_errors_total",
        &[("policy", "spin"), ("kind", "timeout")],
        4.0,
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn monitor_mode_evaluates_but_never_decides() {
    let dir = unique_dir("policy-monitor");
    let deny = wat::fixed(
        &dir,
        "strict",
        r#"{"verdict":"deny","status":403,"message":"no"}"#,
    );
    let allow = wat::fixed(&dir, "lenient", r#"{"verdict":"allow"}"#);
    let text = format!(
        "[[policy]]\npath = \"{}\"\nmode = \"monitor\"\n[[policy]]\npath = \"{}\"\nmode = \"monitor\"\n",
        deny.display(),
        allow.display()
    );
    let (up, gate) = gate_with(&config(&dir, &text)).await;
    let resp = gate.client().post_chat(&Req::chat("watched")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let metrics = gate.metrics().await;
    metrics.assert_present(
        "slotgate_policy_decisions_total",
        &[("policy", "strict"), ("decision", "deny")],
        1.0,
    );
    // What it would have done, to which request and whom, in one line to grep.
    let id = resp.header("x-request-id").expect("a request id");
    let log = gate.stderr_text();
    let line = log
        .lines()
        .find(|l| l.contains("monitor-mode decision"))
        .unwrap_or_else(|| panic!("no monitor line in {log}"));
    for part in [
        "policy=strict".to_owned(),
        format!("request_id={id}"),
        "tenant=".to_owned(),
        "verdict=\"deny\"".to_owned(),
        "status=403".to_owned(),
        "said=\"no\"".to_owned(),
    ] {
        assert!(line.contains(&part), "{part} not in {line}");
    }
    // And in the request's access line, both monitor policies in chain order: the message a JSON
    // string inside the field's own quoted value.
    let access = log
        .lines()
        .find(|l| l.contains("slotgate::access") && l.contains(&format!("request_id={id}")))
        .unwrap_or_else(|| panic!("no access line in {log}"));
    let monitor = r#"monitor="strict:deny:403:-:\"no\" lenient:allow""#;
    assert!(access.contains(monitor), "{monitor} not in {access}");
    assert!(access.contains("outcome=ok"), "{access}");
    gate.assert_settled(&up, 1).await;
}

#[test]
fn a_broken_policy_fails_check_and_start() {
    let dir = unique_dir("policy-broken");
    let always_traps = wat::policy(
        &dir,
        "always",
        1,
        r#"{"verdict":"allow"}"#,
        "unreachable",
        "",
    );
    let out = slotgate_tests::gate::command()
        .args(["check", "--policy", always_traps.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("always") && err.contains("trap"), "{err}");
}
