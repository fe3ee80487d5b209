//! `GET /live` on the admin listener, what `slotgate top` draws: the requests inside slotgate with
//! their id, tenant, phase and tokens so far; the waiters in the order they are then served, each
//! with its expected start; per-tenant totals with refusals by reason; rates and history. Empty
//! again once the requests are over.

use std::time::Duration;

use serde_json::Value;
use slotgate_tests::gate::hash_key;
use slotgate_tests::*;

/// A stream of 40 chunks 50 ms apart (2 s), sent with `key` as its API key and `id` as its id.
fn stream(key: &str, id: &str) -> Req {
    Req::chat(id)
        .chunks(40, Duration::from_millis(50))
        .header("authorization", &format!("Bearer {key}"))
        .header("x-request-id", id)
}

async fn live(gate: &RunningGate) -> Value {
    let r = gate.admin().get("/live").await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn ids(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap_or("?"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_lists_requests_waiters_in_service_order_and_tenant_totals() {
    let (up, gate) = Gate::one_slot(2).start_instant().await;
    let client = gate.client();
    let (alice, bob) = (hash_key("alice-key"), hash_key("bob-key"));

    let first = spawn_post(&client, CHAT, &stream("alice-key", "live-a1"));
    gate.wait_status(Duration::from_secs(3), "one in service", |s| {
        s["slots"]["busy"] == 1
    })
    .await;
    let second = spawn_post(&client, CHAT, &stream("alice-key", "live-a2"));
    gate.wait_queue_depth(1).await;
    let third = spawn_post(&client, CHAT, &stream("bob-key", "live-b1"));
    gate.wait_queue_depth(2).await;
    // bob holds its share of the full queue: another of its requests is refused, and counted for
    // bob by its reason.
    let refused = client
        .post_json_with_headers(
            CHAT,
            &Req::chat("x").json(),
            &[
                ("authorization", "Bearer bob-key"),
                ("x-request-id", "live-b2"),
            ],
        )
        .await;
    assert_eq!(refused.status, 429, "{}", refused.body);

    // Streaming now: generated tokens grow while it is in service.
    let v = eventually(
        Duration::from_secs(3),
        "the first stream under way",
        || async {
            let v = live(&gate).await;
            let first = v["requests"]
                .as_array()?
                .iter()
                .find(|r| r["request_id"] == "live-a1")?;
            (first["generated_tokens"].as_u64()? >= 3).then_some(v)
        },
    )
    .await;
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert!(v["uptime_seconds"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["upstream"]["ready"], true, "{v}");
    assert_eq!(v["slots"]["total"], 1, "{v}");
    assert_eq!(v["slots"]["busy"], 1, "{v}");
    assert_eq!(
        ids(&v["requests"]),
        ["live-a1", "live-a2", "live-b1"],
        "{v}"
    );
    let a1 = &v["requests"][0];
    assert_eq!(a1["tenant"], alice.as_str(), "{v}");
    assert_eq!(a1["phase"], "answering", "{v}");
    assert_eq!(a1["path"], CHAT, "{v}");
    assert_eq!(
        (a1["stream"].as_bool(), a1["slots"].as_u64()),
        (Some(true), Some(1)),
        "{v}"
    );
    assert!(a1["in_service_seconds"].as_f64().unwrap() > 0.0, "{v}");
    assert!(a1["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["requests"][1]["phase"], "queued", "{v}");
    assert!(v["requests"][1]["in_service_seconds"].is_null(), "{v}");

    // bob has been served less than alice (whose request is in service): bob's waiter goes first,
    // though it came later.
    let q = &v["queue"];
    assert_eq!(
        (q["depth"].as_u64(), q["capacity"].as_u64()),
        (Some(2), Some(2)),
        "{v}"
    );
    assert_eq!(ids(&q["waiters"]), ["live-b1", "live-a2"], "{v}");
    let w = &q["waiters"];
    assert_eq!(w[0]["tenant"], bob.as_str(), "{v}");
    assert_eq!(w[0]["path"], CHAT, "{v}");
    assert!(w[0]["reserved_tokens"].as_u64().unwrap() > 0, "{v}");
    let (s0, s1) = (
        w[0]["expected_start_seconds"].as_f64().unwrap(),
        w[1]["expected_start_seconds"].as_f64().unwrap(),
    );
    assert!(0.0 < s0 && s0 < s1, "{v}");
    assert!(
        w[1]["age_seconds"].as_f64() > w[0]["age_seconds"].as_f64(),
        "{v}"
    );
    let tenant = |v: &Value, name: &str| {
        v["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no tenant {name} in {v}"))
    };
    let b = tenant(&v, &bob);
    assert_eq!(
        (
            b["waiting"].as_u64(),
            b["refused"]["tenant_queue_full"].as_u64()
        ),
        (Some(1), Some(1)),
        "{v}"
    );
    assert_eq!(tenant(&v, &alice)["in_service"], 1, "{v}");

    for (resp, _) in join_all(vec![first, second, third]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.assert_settled(&up, 1).await;

    // Over: nothing inside, totals and rates say what happened.
    let v = live(&gate).await;
    assert_eq!(v["requests"], serde_json::json!([]), "{v}");
    assert_eq!(v["queue"]["waiters"], serde_json::json!([]), "{v}");
    let outcomes = &v["totals"]["outcomes"];
    assert_eq!(
        (
            outcomes["ok"].as_u64(),
            outcomes["tenant_queue_full"].as_u64()
        ),
        (Some(3), Some(1)),
        "{v}"
    );
    let a = tenant(&v, &alice);
    assert_eq!(a["requests"], 2, "{v}");
    assert!(a["served_tokens"].as_u64().unwrap() > 0, "{v}");
    let share = a["share"].as_f64().unwrap() + tenant(&v, &bob)["share"].as_f64().unwrap();
    assert!((share - 1.0).abs() < 1e-9, "{v}");
    // The two waiters queued about 2 and 4 s; counted once their second is over.
    let v = eventually(
        Duration::from_secs(3),
        "the queue waits in the rates",
        || async {
            let v = live(&gate).await;
            (v["rates"]["queue_waits"] == 3).then_some(v)
        },
    )
    .await;
    let p95 = v["rates"]["queue_wait_p95_seconds"].as_f64().unwrap();
    assert!((3.0..6.0).contains(&p95), "{v}");
    let history: u64 = v["history"]["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(history, 4, "{v}");
    assert_eq!(
        v["history"]["requests"].as_array().unwrap().len(),
        60,
        "{v}"
    );
}
