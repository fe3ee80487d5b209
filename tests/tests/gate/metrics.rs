//! Metrics: outcome counters, token counters that match the upstream's `usage`, histograms, and every
//! documented metric family exposed with `# HELP` and the documented type.

use std::time::Duration;

use slotgate_tests::*;

/// The table in docs/reference.md.
const DOCUMENTED: &[(&str, &str)] = &[
    ("slotgate_requests_total", "counter"),
    ("slotgate_queue_depth", "gauge"),
    ("slotgate_inflight", "gauge"),
    ("slotgate_slots_busy", "gauge"),
    ("slotgate_queue_wait_seconds", "histogram"),
    ("slotgate_upstream_seconds", "histogram"),
    ("slotgate_time_to_first_byte_seconds", "histogram"),
    ("slotgate_tokens_total", "counter"),
    ("slotgate_tenant_tokens_total", "counter"),
    ("slotgate_upstream_ready", "gauge"),
    ("slotgate_upstream_retries_total", "counter"),
];

const HISTOGRAMS: &[&str] = &[
    "slotgate_queue_wait_seconds",
    "slotgate_upstream_seconds",
    "slotgate_time_to_first_byte_seconds",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counters_tokens_and_histograms_match_the_scenario() {
    let (up, gate) = Gate::one_slot(1).start_instant().await;
    let client = gate.client();

    // a holds the slot, b queues, c overflows.
    let a = gate
        .hold_slot(&Req::chat("a").delay(ms(600)).prompt_tokens(7))
        .await;
    let b = gate
        .enqueue(&Req::chat("b").prompt_tokens(11).completion_tokens(2))
        .await;
    let (c, _) = spawn_post(&client, CHAT, &Req::chat("c")).await.unwrap();
    assert_error(&c, 429, "queue_full");
    for (resp, _) in join_all(vec![a, b]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    // A malformed body, a stream (usage arrives in its last chunk) and an embedding.
    assert_error(&client.post_raw(CHAT, "{nope").await, 400, "invalid_json");
    let sse = client
        .stream_chat(&Req::chat("s").chunks(4, ms(20)).prompt_tokens(13))
        .await
        .read_sse(Duration::from_secs(5))
        .await;
    assert!(sse.complete(), "{sse:?}");
    let emb = client
        .post_json(
            "/v1/embeddings",
            &serde_json::json!({"input": "x", "fake_prompt_tokens": 3, "fake_tag": "e"}),
        )
        .await;
    assert_eq!(emb.status, 200, "{}", emb.body);

    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("ok", 4).await;
    gate.wait_outcome("queue_full", 1).await;
    gate.wait_outcome("bad_request", 1).await;

    let (prompt, completion) = up.usage_totals();
    assert_eq!(prompt, 7 + 11 + 13 + 3);
    assert_eq!(completion, 5 + 2 + 4);
    gate.wait_tokens("prompt", prompt as f64).await;
    gate.wait_tokens("completion", completion as f64).await;

    let m = gate.metrics().await;
    for h in HISTOGRAMS {
        assert!(
            m.value(&format!("{h}_bucket"), &[("le", "+Inf")]).is_some(),
            "{h} has no +Inf bucket:\n{}",
            m.text
        );
        assert!(
            m.value(&format!("{h}_sum"), &[]).is_some(),
            "{h}_sum missing"
        );
        let count = m.value(&format!("{h}_count"), &[]).unwrap_or(0.0);
        assert!(
            count >= 1.0,
            "{h}_count is {count} after four forwarded requests"
        );
    }
    assert_eq!(
        m.value("slotgate_queue_wait_seconds_count", &[]),
        Some(4.0),
        "one queue-wait observation per forwarded slot request"
    );
    for gauge in [
        "slotgate_queue_depth",
        "slotgate_inflight",
        "slotgate_slots_busy",
    ] {
        assert_eq!(m.value(gauge, &[]), Some(0.0), "{gauge} after the scenario");
    }
    assert_eq!(m.value("slotgate_upstream_ready", &[]), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_documented_metric_is_exposed_with_help_and_type() {
    let (up, gate) = Gate::new().start_instant().await;
    // One ordinary request first: the Prometheus exporter renders a histogram only once it has a sample.
    let resp = gate.client().post_chat(&Req::chat("one")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    gate.wait_outcome("ok", 1).await;
    let m = gate.metrics().await;
    let mut missing = Vec::new();
    for (name, ty) in DOCUMENTED {
        if !m.has_help(name) {
            missing.push(format!("{name}: no # HELP"));
        }
        match m.type_of(name) {
            Some(t) if t == *ty => {}
            other => missing.push(format!("{name}: # TYPE {other:?}, documented {ty}")),
        }
    }
    assert!(
        missing.is_empty(),
        "metric families not exposed as documented:\n  {}\n/metrics:\n{}",
        missing.join("\n  "),
        m.text
    );
    gate.assert_settled(&up, 1).await;
}
