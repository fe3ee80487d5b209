//! Quota operations that tell the truth (docs/quotas.md#the-commands): a limit set and taken away
//! again leaves exactly what was used as used; an operation naming a quota no policy keeps (a wrong
//! period, policy or key) is refused with those that exist and audited as refused, not `ok`; and a
//! request that needs more than is left, but less than the quota, is told how much is left and how
//! much it asked, and a smaller request passes.

use serde_json::{json, Value};
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::Req;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

const ADMIN: &str = "admin-token-quota-ops";
const SETTINGS: &str = "{ period = \"day\", tokens = 1000, requests = 100 }";

fn cli(gate: &RunningGate, args: &[&str]) -> (bool, String, String) {
    gate.admin_cli(args)
}

/// The tokens quota: (key, limit, used, left).
async fn tokens(gate: &RunningGate) -> (String, f64, f64, f64) {
    let list = gate.admin_get("/quotas").await.json();
    let q = list["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["key"].as_str().unwrap().starts_with("tokens:"))
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    (
        q["key"].as_str().unwrap().to_owned(),
        q["limit"].as_f64().unwrap(),
        q["used"].as_f64().unwrap(),
        q["left"].as_f64().unwrap(),
    )
}

fn chat(max_tokens: u64) -> Value {
    json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_and_none_keep_the_use_a_wrong_quota_is_refused_and_a_big_request_is_told_what_is_left()
{
    let up = FakeUpstream::instant().start().await;
    let state = unique_dir("quota-ops").join("state");
    let audit = unique_dir("quota-ops-audit").join("audit.jsonl");
    std::fs::create_dir_all(audit.parent().unwrap()).unwrap();
    let gate = Gate::new()
        .opt("--state-dir", state.display())
        .opt("--audit-log", audit.display())
        .admin_token(ADMIN)
        .policies(&[(&wat::built("quota"), Some(SETTINGS))])
        .upstream(&up)
        .start()
        .await;
    let client = gate.client();
    // About half the quota, used and settled.
    let r = client
        .post_chat(
            &Req::chat("half")
                .set("max_tokens", 600)
                .completion_tokens(500),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    gate.wait_outcome("ok", 1).await;
    let (key, limit, used, left) = tokens(&gate).await;
    assert_eq!(limit, 1000.0);
    assert!(used >= 500.0 && used + left == 1000.0, "{used} {left}");
    let target = [
        "--policy",
        "quota",
        "--key",
        key.as_str(),
        "--period",
        "day",
    ];

    // 0, then the policy's again: what was used stays used, exactly.
    for limit in ["0", "3000", "none"] {
        let (ok, out, err) = cli(&gate, &[&["quota", "set"][..], &target, &[limit]].concat());
        assert!(ok, "set {limit}: {out}{err}");
        let (_, l, u, _) = tokens(&gate).await;
        assert_eq!(u, used, "after set {limit}, the use moved");
        let want = match limit {
            "none" => 1000.0,
            n => n.parse().unwrap(),
        };
        assert_eq!(l, want, "after set {limit}");
    }
    let (_, _, _, left_after) = tokens(&gate).await;
    assert_eq!(
        left_after, left,
        "the round trip gives back nothing and takes nothing"
    );

    // A quota no policy keeps: refused, naming those that do, and not audited `ok`.
    for wrong in [
        &[
            "--policy",
            "quota",
            "--key",
            key.as_str(),
            "--period",
            "week",
        ][..],
        &[
            "--policy",
            "quotas",
            "--key",
            key.as_str(),
            "--period",
            "day",
        ],
        &[
            "--policy",
            "quota",
            "--key",
            "tokens:nobody",
            "--period",
            "day",
        ],
    ] {
        for op in [&["quota", "set"][..], &["quota", "top-up"]] {
            let amount = if op[1] == "set" { "5" } else { "1" };
            let (ok, out, err) = cli(&gate, &[op, wrong, &[amount]].concat());
            assert!(!ok, "{op:?} {wrong:?} was taken: {out}");
            assert!(
                err.contains("unknown_quota") || err.contains("no quota"),
                "{err}"
            );
            assert!(
                err.contains(&format!("quota {key} day")),
                "names what exists: {err}"
            );
        }
    }
    let (_, l, u, _) = tokens(&gate).await;
    assert_eq!((l, u), (1000.0, used), "nothing changed");
    let lines = std::fs::read_to_string(&audit).unwrap();
    let refused = lines
        .lines()
        .filter(|l| l.contains("\"status\":404"))
        .filter(|l| l.contains("\"result\":\"bad_request\""))
        .count();
    assert_eq!(refused, 6, "{lines}");

    // More than is left, less than the quota: told both numbers; a smaller request passes.
    let left_now = tokens(&gate).await.3;
    let asked = left_now as u64 + 20;
    let r = client.post_json("/v1/chat/completions", &chat(asked)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    let err = r.json()["error"].clone();
    assert_eq!(err["code"], "quota_insufficient", "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{:.0} left", left_now)) && !message.contains("spent"),
        "{message}"
    );
    let r = client.post_json("/v1/chat/completions", &chat(100)).await;
    assert_eq!(r.status, 200, "a smaller request passes: {}", r.body);

    // A grant above the limit: what is left grows by it, for this window only; audited.
    gate.wait_outcome("ok", 2).await;
    let (_, _, used_now, left_now) = tokens(&gate).await;
    let (ok, out, err) = cli(
        &gate,
        &[&["quota", "grant"][..], &target, &["1000"]].concat(),
    );
    assert!(ok, "{out}{err}");
    let (_, limit_now, used_after, left_after) = tokens(&gate).await;
    assert_eq!(used_after, used_now, "a grant takes nothing back");
    assert_eq!(left_after, left_now + 1000.0, "{out}");
    assert_eq!(
        limit_now, 2000.0,
        "the limit for this window, grant included"
    );
    // Now a request larger than the policy's whole quota's remainder passes.
    let r = client
        .post_json("/v1/chat/completions", &chat(left_now as u64 + 100))
        .await;
    assert_eq!(r.status, 200, "the grant is usable: {}", r.body);
    let lines = std::fs::read_to_string(&audit).unwrap();
    assert!(
        lines
            .lines()
            .any(|l| l.contains("\"action\":\"quota_grant\"") && l.contains("\"result\":\"ok\"")),
        "{lines}"
    );
    gate.assert_idle().await;
}
