//! Admission: `--slots` bounds upstream concurrency, the queue serves in arrival order, overflow gets a fast 429.

use std::time::Duration;

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_slot_serves_queue_in_arrival_order_and_rejects_overflow_fast() {
    let (up, gate) = Gate::one_slot(3).start_instant().await;
    let client = gate.client();

    let mut handles = Vec::new();
    // r0 takes the slot for long enough that everything else arrives while it is busy.
    handles.push(gate.hold_slot(&Req::chat("r0").delay(ms(1200))).await);
    for i in 1..=3u64 {
        handles.push(
            gate.enqueue(&Req::chat(&format!("r{i}")).delay(ms(50)))
                .await,
        );
        tokio::time::sleep(ms(30)).await;
    }
    for i in 4..8 {
        handles.push(spawn_post(
            &client,
            CHAT,
            &Req::chat(&format!("r{i}")).delay(ms(50)),
        ));
        tokio::time::sleep(ms(30)).await;
    }

    let results = join_all(handles).await;
    assert_eq!(results.len(), 8, "every client gets exactly one response");
    for (i, (resp, took)) in results.iter().enumerate() {
        if i < 4 {
            assert_eq!(resp.status, 200, "r{i} should be served: {}", resp.body);
            assert_eq!(
                resp.tag().as_deref(),
                Some(format!("r{i}").as_str()),
                "r{i} got another's answer"
            );
            let waited = queue_wait_ms(resp);
            if i > 0 {
                assert!(
                    waited >= 500,
                    "r{i} was queued behind a 1.2 s request but reports {waited} ms wait"
                );
            }
        } else {
            assert_error(resp, 429, "queue_full");
            retry_after(resp);
            assert!(
                *took < Duration::from_secs(1),
                "r{i}'s 429 took {took:?}; it must not wait"
            );
        }
    }
    assert_eq!(
        up.tags(),
        ["r0", "r1", "r2", "r3"],
        "queue must be served in arrival order"
    );
    assert_eq!(up.max_concurrency(), 1);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_slots_forward_exactly_two_at_once() {
    let (up, gate) = Gate::new().slots(2).queue_depth(8).start_instant().await;
    let client = gate.client();

    let handles = (0..6)
        .map(|i| spawn_post(&client, CHAT, &Req::chat(&format!("c{i}")).delay(ms(250))))
        .collect();
    let results = join_all(handles).await;
    for (resp, _) in &results {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.count(), 6);
    assert_eq!(
        up.max_concurrency(),
        2,
        "two slots must be used, and never more"
    );
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_depth_zero_rejects_while_the_slot_is_busy() {
    let (up, gate) = Gate::one_slot(0).start_instant().await;
    let client = gate.client();

    let hold = gate.hold_slot(&Req::chat("hold").delay(ms(600))).await;
    let (rejected, took) = spawn_post(&client, CHAT, &Req::chat("extra"))
        .await
        .unwrap();
    assert_error(&rejected, 429, "queue_full");
    retry_after(&rejected);
    assert!(took < Duration::from_secs(1), "429 took {took:?}");
    let (held, _) = hold.await.unwrap();
    assert_eq!(held.status, 200);
    assert_eq!(up.tags(), ["hold"]);
    gate.assert_settled(&up, 1).await;
}
