//! The per-tenant concurrency cap (docs/scheduling.md, "Per-tenant concurrency cap"): a tenant at
//! its cap is refused (`--tenant-over-cap refuse`) or waits while another tenant is served; beyond
//! its `max-waiting` it is refused; a policy's `max_in_service` caps the request's tenant too.
//!
//! Tenants are API keys (`Authorization: Bearer ...`). Each scenario ends with the gate idle: queue
//! depth, busy slots and in-flight back to 0.

use std::time::Duration;

use slotgate_tests::gate::hash_key;
use slotgate_tests::*;

/// How long the first request of tenant A holds its slot: everything else happens meanwhile.
const HOLD_MS: u64 = 800;

fn a(tag: &str) -> Req {
    Req::chat(tag).api_key("key-a")
}

fn b(tag: &str) -> Req {
    Req::chat(tag).api_key("key-b")
}

/// /status's entry for the tenant of API key `key`.
fn tenant_entry(st: &serde_json::Value, key: &str) -> serde_json::Value {
    let name = hash_key(key);
    st["fairness"]["tenants"]
        .as_array()
        .expect("fairness.tenants")
        .iter()
        .find(|t| t["tenant"] == name.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed: {st}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refuse_a_tenant_at_its_cap_gets_429_tenant_busy_while_another_is_served() {
    let (up, gate) = Gate::new()
        .slots(2)
        .queue_depth(4)
        .opt("--tenant-max-in-service", 1)
        .opt("--tenant-over-cap", "refuse")
        .start_instant()
        .await;
    let a1 = gate.hold_slot(&a("a1").delay(ms(HOLD_MS))).await;
    gate.wait_metric("slotgate_tenants_at_cap", &[], 1.0).await;

    // A's second request is refused at once, with a slot free: A is at its cap.
    let (busy, took) = spawn_post(&gate.client(), CHAT, &a("a2")).await.unwrap();
    assert_error_says(&busy, 429, "tenant_busy", "concurrency cap");
    let secs = retry_after(&busy);
    assert!(
        secs <= 2,
        "A's one request ends within a service time: {secs}s"
    );
    assert!(
        took < Duration::from_millis(500),
        "the refusal took {took:?}"
    );

    // B takes the free slot while A's first still runs.
    let (served, _) = spawn_post(&gate.client(), CHAT, &b("b1")).await.unwrap();
    assert_eq!(served.status, 200, "{}", served.body);
    assert!(!a1.is_finished(), "b1 was served while a1 held its slot");
    let (first, _) = a1.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.body);

    assert_eq!(up.tags(), ["a1", "b1"], "a2 never reached llama-server");
    gate.wait_outcome("tenant_busy", 1).await;
    gate.wait_metric("slotgate_tenants_at_cap", &[], 0.0).await;
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_a_tenant_at_its_cap_waits_while_another_is_served_then_runs_in_order() {
    let (up, gate) = Gate::new()
        .slots(2)
        .queue_depth(4)
        .opt("--tenant-max-in-service", 1)
        .start_instant()
        .await;
    let a1 = gate.hold_slot(&a("a1").delay(ms(HOLD_MS))).await;
    // A slot is free, but A is at its cap: its next requests wait, in their order.
    let a2 = gate.enqueue(&a("a2").delay(ms(50))).await;
    let a3 = gate.enqueue(&a("a3").delay(ms(50))).await;
    let st = gate.status().await;
    let listed = tenant_entry(&st, "key-a");
    assert_eq!(
        (&listed["in_service"], &listed["waiting"]),
        (&1.into(), &2.into()),
        "{st}"
    );
    assert_eq!(listed["max_in_service"], 1, "{st}");
    assert_eq!(st["fairness"]["tenant_caps"]["over_cap"], "wait", "{st}");

    // B arrives after A's waiters and is served first, at once, on the free slot.
    let (served, _) = spawn_post(&gate.client(), CHAT, &b("b1")).await.unwrap();
    assert_eq!(served.status, 200, "{}", served.body);
    assert!(queue_wait_ms(&served) < 300, "b1 queued behind A's waiters");
    assert!(!a2.is_finished(), "a2 must wait for a1");

    let results = join_all(vec![a1, a2, a3]).await;
    for (resp, _) in &results {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    // a2 waited for a1's end (it queued right after a1 took its slot).
    let waited = queue_wait_ms(&results[1].0);
    assert!(waited >= HOLD_MS / 2, "a2 waited only {waited} ms");
    assert_eq!(up.tags(), ["a1", "b1", "a2", "a3"]);
    gate.wait_outcome("tenant_busy", 0).await;
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn beyond_a_tenants_max_waiting_from_its_table_it_is_refused() {
    // A's own table caps it at 1 in service and 1 waiting; B has no cap.
    let dir = unique_dir("tenant-cap");
    let config = dir.join("slotgate.toml");
    let table = format!(
        "[tenants.\"{}\"]\nmax-in-service = 1\nmax-waiting = 1\n",
        hash_key("key-a")
    );
    std::fs::write(&config, table).unwrap();
    let (up, gate) = Gate::new()
        .slots(2)
        .queue_depth(8)
        .config_file(&config)
        .start_instant()
        .await;
    let a1 = gate.hold_slot(&a("a1").delay(ms(HOLD_MS))).await;
    let a2 = gate.enqueue(&a("a2")).await;
    let (over, took) = spawn_post(&gate.client(), CHAT, &a("a3")).await.unwrap();
    assert_error(&over, 429, "tenant_busy");
    assert!(retry_after(&over) >= 1);
    let ms_header: u64 = over.header("retry-after-ms").unwrap().parse().unwrap();
    assert!(
        (1000..=2000).contains(&ms_header),
        "retry-after-ms {ms_header}"
    );
    assert!(
        took < Duration::from_millis(500),
        "the refusal took {took:?}"
    );
    let st = gate.status().await;
    assert_eq!(tenant_entry(&st, "key-a")["max_waiting"], 1, "{st}");
    assert_eq!(tenant_entry(&st, "key-a")["waiting"], 1, "{st}");

    // B, uncapped, is served on the free slot meanwhile.
    let (served, _) = spawn_post(&gate.client(), CHAT, &b("b1")).await.unwrap();
    assert_eq!(served.status, 200, "{}", served.body);

    for (resp, _) in join_all(vec![a1, a2]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.tags(), ["a1", "b1", "a2"]);
    gate.wait_outcome("tenant_busy", 1).await;
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policys_max_in_service_caps_the_tenant_below_the_setting() {
    // Every request is allowed with `max_in_service: 1`; the setting allows 3: the smaller wins.
    let dir = unique_dir("tenant-cap-policy");
    let policy = wat::fixed(&dir, "cap", r#"{"verdict":"allow","max_in_service":1}"#);
    let (up, gate) = Gate::new()
        .slots(2)
        .queue_depth(4)
        .opt("--tenant-max-in-service", 3)
        .policies(&[(&policy, None)])
        .start_instant()
        .await;
    let a1 = gate.hold_slot(&a("a1").delay(ms(HOLD_MS))).await;
    let a2 = gate.enqueue(&a("a2")).await;
    let (served, _) = spawn_post(&gate.client(), CHAT, &b("b1")).await.unwrap();
    assert_eq!(served.status, 200, "{}", served.body);
    assert!(!a2.is_finished(), "a2 is held by the policy's cap of 1");

    for (resp, _) in join_all(vec![a1, a2]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.tags(), ["a1", "b1", "a2"]);
    gate.assert_settled(&up, 2).await;
}
