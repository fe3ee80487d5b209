//! A request llama-server runs as several tasks at once (`n` completions, a list of prompts or of
//! embedding inputs) holds that many slots, at most all of them, and waits until they are free:
//! llama-server would otherwise defer it in its own queue. More completions than slots is a 400.

use slotgate_tests::*;

async fn two_slots() -> (RunningUpstream, RunningGate) {
    Gate::new()
        .slots(2)
        .queue_depth(4)
        .start_with(FakeUpstream::instant().total_slots(2))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n_completions_wait_until_n_slots_are_free() {
    let (up, gate) = two_slots().await;
    let holder = gate.hold_slot(&Req::chat("holder").delay(ms(400))).await;
    let pair = spawn_post(
        &gate.client(),
        CHAT,
        &Req::chat("pair").set("n", 2).delay(ms(300)),
    );
    // One slot is free, but the pair needs two: it waits.
    let s = gate.wait_queue_depth(1).await;
    assert_eq!(s["slots"]["busy"], 1, "{s}");
    let (held, _) = holder.await.unwrap();
    assert_eq!(held.status, 200);
    // In service on both slots at once.
    let s = gate.wait_busy(2).await;
    assert_eq!(s["requests_in_service"], 1, "{s}");
    let (resp, _) = pair.await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    let seen = up.requests_seen();
    let (h, p) = (&seen[0], &seen[1]);
    assert_eq!(
        (h.tag.as_deref(), p.tag.as_deref()),
        (Some("holder"), Some("pair"))
    );
    assert!(
        p.arrived >= h.finished.unwrap(),
        "forwarded only once both slots were free"
    );
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn more_completions_than_slots_are_refused_with_the_reason() {
    let (up, gate) = two_slots().await;
    let resp = gate
        .client()
        .post_chat(&Req::chat("many").set("n", 3))
        .await;
    assert_error(&resp, 400, "too_many_completions");
    assert!(
        resp.body.contains("3 completions") && resp.body.contains("2 slots"),
        "{}",
        resp.body
    );
    assert_eq!(up.count(), 0, "never forwarded");
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_inputs_holds_a_slot_per_input_at_most_all_and_is_charged_for_all() {
    let (up, gate) = two_slots().await;
    let batch = Req::chat("batch")
        .set("input", serde_json::json!(["one", "two", "three"]))
        .delay(ms(300))
        .prompt_tokens(12)
        .completion_tokens(0);
    let call = spawn_post(&gate.client(), "/v1/embeddings", &batch);
    let s = gate.wait_busy(2).await;
    assert_eq!(
        s["requests_in_service"], 1,
        "three inputs on two slots: both, {s}"
    );
    let (resp, _) = call.await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    // Charged what the answer reports for all its inputs.
    let m = gate.metrics().await;
    let charged: f64 = m.sum("slotgate_tenant_tokens_total", &[]);
    assert_eq!(charged, 12.0, "{}", m.text);
    gate.assert_settled(&up, 2).await;
}
