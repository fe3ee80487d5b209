//! The ecosystem's hints (docs/sessions.md#priority-and-slo-hints): `x-slo-ttft-ms` as a deadline
//! only where the operator allows it, each API's `service_tier` as a priority hint by the
//! operator's rule, and a client that cannot raise its priority past its tenant's ceiling.

use std::time::Duration;

use slotgate_tests::gate::hash_key;
use slotgate_tests::*;

const SLO: &str = "x-slo-ttft-ms";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_slo_header_is_a_deadline_only_where_the_operator_allows_it() {
    for allowed in [true, false] {
        let mut gate = Gate::one_slot(4).queue_timeout("30s");
        if allowed {
            gate = gate.opt("--slo-ttft-deadline", "true");
        }
        let (up, gate) = gate.start_instant().await;
        let client = gate.client();
        let slow = gate.hold_slot(&Req::chat("slow").delay(ms(1200))).await;
        let req = Req::chat("slo").header(SLO, "300");
        let (resp, took) = spawn_post(&client, CHAT, &req).await.unwrap();
        match allowed {
            true => {
                assert_error(&resp, 504, "deadline_exceeded");
                assert!(took < Duration::from_secs(1), "{took:?}");
                assert!(!up.saw_tag("slo"), "forwarded past its objective");
            }
            // Not allowed: the header is the client's wish, not a rule; it waits and is served.
            false => {
                assert_eq!(resp.status, 200, "{}", resp.body);
                assert!(took >= ms(800), "{took:?}");
            }
        }
        slow.await.unwrap();
        // Allowed, a header that is no number of milliseconds is refused as a bad deadline.
        let bad = client
            .post_json_with_headers(CHAT, &Req::chat("bad").json(), &[(SLO, "soon")])
            .await;
        match allowed {
            true => {
                assert_error(&bad, 400, "invalid_deadline");
                assert!(bad.body.contains(SLO), "{}", bad.body);
            }
            false => assert_eq!(bad.status, 200, "{}", bad.body),
        }
        gate.assert_settled(&up, 1).await;
    }
}

/// Holds the only slot, queues one request per `service_tier`, and returns the order they were
/// served in.
async fn tier_order(gate: Gate) -> Vec<String> {
    let (up, gate) = gate.start_instant().await;
    let mut handles = vec![gate.hold_slot(&Req::chat("hold").delay(ms(500))).await];
    for tier in ["flex", "default", "priority"] {
        let req = Req::chat(tier).set("service_tier", tier).api_key("key-a");
        handles.push(gate.enqueue(&req).await);
    }
    for (resp, _) in join_all(handles).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.assert_settled(&up, 1).await;
    up.tags()[1..].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_tiers_are_priority_hints_by_the_operators_rule() {
    // Trusted hints, the default rule: priority first, flex last.
    let trusted = Gate::one_slot(8).trust_client_priority();
    assert_eq!(tier_order(trusted).await, ["priority", "default", "flex"]);
    // The operator's own rule turns it around.
    let reversed = Gate::one_slot(8)
        .trust_client_priority()
        .opt("--service-tier-priority", "flex=-5,default=0,priority=5");
    assert_eq!(tier_order(reversed).await, ["flex", "default", "priority"]);
    // Untrusted and no policy: hints change nothing, arrival order holds.
    assert_eq!(
        tier_order(Gate::one_slot(8)).await,
        ["flex", "default", "priority"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tier_never_lifts_a_request_past_its_tenants_ceiling() {
    // The tenant's class is 0 and its ceiling 0: `priority` asks for -1 and is clamped to 0, so it
    // keeps its place behind `default`; `flex` may always ask to wait longer.
    let settings = format!(
        "{{ tenants = {{ a = {{ api_keys = [\"{}\"], priority = 0 }} }} }}",
        hash_key("key-a")
    );
    let gate = Gate::one_slot(8).policies(&[(&wat::built("tenant-priority"), Some(&settings))]);
    assert_eq!(tier_order(gate).await, ["default", "priority", "flex"]);
}

/// On the Messages API an overload refusal is Anthropic's 529 `overloaded_error` by default, or the
/// operator's choice (`--messages-overload-status 429`, for Claude Code); a tenant's own limit is
/// a 429 either way, and OpenAI's routes keep their 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_overload_on_the_messages_api_is_anthropics_529_or_the_operators_status() {
    let msg = serde_json::json!({
        "model": "m", "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}]
    });
    for (setting, status, kind) in [
        (None, 529, "overloaded_error"),
        (Some("429"), 429, "rate_limit_error"),
    ] {
        let mut gate = Gate::one_slot(0);
        if let Some(s) = setting {
            gate = gate.opt("--messages-overload-status", s);
        }
        let (up, gate) = gate.start_instant().await;
        let held = gate.hold_slot(&Req::chat("held").delay(ms(400))).await;
        let refused = gate.client().post_json("/v1/messages", &msg).await;
        assert_eq!(refused.status, status, "{}", refused.body);
        let body = refused.json();
        assert_eq!(
            (&body["type"], &body["error"]["type"]),
            (&"error".into(), &kind.into()),
            "{body}"
        );
        assert!(refused.header("retry-after").is_some());
        assert_eq!(
            refused.header("x-slotgate-reason").as_deref(),
            Some("queue_full")
        );
        let chat = gate.client().post_chat(&Req::chat("openai")).await;
        assert_eq!(chat.status, 429, "OpenAI's routes: {}", chat.body);
        held.await.unwrap();
        gate.assert_settled(&up, 1).await;
    }
}
