//! Sessions, agents and subagents (docs/sessions.md): the ids each agent sends in its own headers
//! reach the access line, `GET /live` and the policies, which can rank a subagent below its root
//! agent (`tenant-priority`'s `subagent_step`, as a v1 module and as a v2 component).

use std::time::Duration;

use serde_json::Value;
use slotgate_tests::*;

/// The headers of a root agent and of subagents, as each agent sends them.
fn claude_root(req: Req) -> Req {
    req.header("x-claude-code-session-id", "cc-session")
}

fn claude_sub(req: Req) -> Req {
    claude_root(req)
        .header("x-claude-code-agent-id", "cc-explore")
        .header("x-claude-code-parent-agent-id", "cc-main")
}

fn codex_sub(req: Req) -> Req {
    req.header("session-id", "cx-session")
        .header("thread-id", "cx-worker")
        .header(
            "x-codex-turn-metadata",
            r#"{"session_id":"cx-session","parent_thread_id":"cx-session"}"#,
        )
}

fn opencode_root(req: Req) -> Req {
    req.header("x-session-affinity", "ses_root")
        .header("X-Session-Id", "ses_root")
}

/// Holds the only slot, queues two subagents' requests before two root agents', and returns the
/// order the queued ones were served in, under tenant-priority `policy` with `subagent_step = 1`.
async fn served_order(policy: &str) -> Vec<String> {
    let settings = "{ unknown = { tenant = \"team\", priority = 0 }, subagent_step = 1 }";
    let (up, gate) = Gate::one_slot(8)
        .policies(&[(&wat::built(policy), Some(settings))])
        .start_instant()
        .await;
    let mut handles = vec![gate.hold_slot(&Req::chat("hold").delay(ms(600))).await];
    for req in [
        claude_sub(Req::chat("claude-sub")),
        codex_sub(Req::chat("codex-sub")),
        claude_root(Req::chat("claude-root")),
        opencode_root(Req::chat("opencode-root")),
    ] {
        handles.push(gate.enqueue(&req).await);
    }
    for (resp, _) in join_all(handles).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.assert_settled(&up, 1).await;
    let tags = up.tags();
    assert_eq!(tags[0], "hold");
    tags[1..].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subagent_waits_behind_the_root_agents_in_a_v1_policy() {
    assert_eq!(
        served_order("tenant-priority").await,
        ["claude-root", "opencode-root", "claude-sub", "codex-sub"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subagent_waits_behind_the_root_agents_in_a_v2_component() {
    assert_eq!(
        served_order("tenant-priority-v2").await,
        ["claude-root", "opencode-root", "claude-sub", "codex-sub"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ids_reach_live_and_the_access_line() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--log-format", "json")
        .start_instant()
        .await;
    let held = gate
        .hold_slot(
            &claude_sub(Req::chat("sub").delay(ms(800)))
                .header("x-request-id", "sess-1")
                .header("x-conversation-id", "conv-9"),
        )
        .await;
    let live: Value = gate.admin().get("/live").await.json();
    let mine = live["requests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["request_id"] == "sess-1")
        .unwrap_or_else(|| panic!("not in /live: {live}"));
    assert_eq!(
        [
            &mine["session"],
            &mine["agent"],
            &mine["parent_agent"],
            &mine["conversation"]
        ],
        ["cc-session", "cc-explore", "cc-main", "conv-9"],
        "{mine}"
    );
    // A request that names none shows none.
    let (resp, _) = held.await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    let plain = gate
        .client()
        .post_chat(&Req::chat("plain").header("x-request-id", "sess-2"))
        .await;
    assert_eq!(plain.status, 200, "{}", plain.body);

    let line = |id: &'static str| {
        let gate = &gate;
        async move {
            eventually(Duration::from_secs(3), "the access line", || async {
                gate.stderr_text().lines().find_map(|l| {
                    let v: Value = serde_json::from_str(l).ok()?;
                    (v["target"] == "slotgate::access" && v["request_id"] == id).then_some(v)
                })
            })
            .await
        }
    };
    let sub = line("sess-1").await;
    assert_eq!(
        [
            &sub["session"],
            &sub["agent"],
            &sub["parent_agent"],
            &sub["conversation"]
        ],
        ["cc-session", "cc-explore", "cc-main", "conv-9"],
        "{sub}"
    );
    let plain = line("sess-2").await;
    for key in ["session", "agent", "parent_agent", "conversation"] {
        assert!(plain.get(key).is_none(), "{key} on a plain line: {plain}");
    }
    gate.assert_settled(&up, 2).await;
}
