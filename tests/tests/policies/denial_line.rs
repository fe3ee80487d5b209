//! A policy's denial is traceable: the access line names the policy and its reason, the refusal says
//! `policy_denied` in `X-Slotgate-Reason`.

use std::time::Duration;

use slotgate_tests::errors::assert_error_says;
use slotgate_tests::gate::Gate;
use slotgate_tests::request::Req;
use slotgate_tests::wait::{eventually, unique_dir};
use slotgate_tests::wat;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_line_of_a_denied_request_names_the_policy_and_its_reason() {
    let dir = unique_dir("denial-line");
    let guard = wat::denying(&dir, "guard", "blocked model");
    let (up, gate) = Gate::new()
        .opt("--log-format", "json")
        .policies(&[(&guard, None)])
        .start_instant()
        .await;
    let resp = gate
        .client()
        .post_chat(
            &Req::chat("x")
                .set("model", wat::MARKER)
                .header("x-request-id", "denied-1"),
        )
        .await;
    assert_error_says(&resp, 403, "policy_denied", "blocked model");
    assert_eq!(
        resp.header("x-slotgate-reason").as_deref(),
        Some("policy_denied")
    );
    let line = eventually(
        Duration::from_secs(3),
        "the denied request's line",
        || async {
            gate.stderr_text().lines().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["request_id"] == "denied-1").then_some(v)
            })
        },
    )
    .await;
    assert_eq!(line["outcome"], "policy_denied", "{line}");
    assert_eq!(line["reason"], "blocked model", "{line}");
    let policy = line["policy"]
        .as_str()
        .unwrap_or_else(|| panic!("no policy: {line}"));
    assert!(policy.contains("guard"), "{policy}");
    assert_eq!(up.count(), 0, "a denied request is never forwarded");
    gate.assert_settled(&up, 1).await;
}
