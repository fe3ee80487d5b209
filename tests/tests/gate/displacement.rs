//! Displacement: on a full queue, a more urgent arrival evicts the most recently queued least-urgent waiter
//! (429 `displaced`); an arrival that is not more urgent gets 429 `queue_full` instead.

use std::time::Duration;

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn urgent_arrival_displaces_the_newest_low_priority_waiter() {
    let (up, gate) = Gate::one_slot(2)
        .trust_client_priority()
        .start_instant()
        .await;
    let client = gate.client();

    let hold = gate.hold_slot(&Req::chat("hold").delay(ms(1000))).await;
    let q1 = gate.enqueue(&Req::chat("q1").priority(5)).await;
    let q2 = gate.enqueue(&Req::chat("q2").priority(5)).await;

    let urgent = spawn_post(&client, CHAT, &Req::chat("urgent").priority(0));
    let (displaced, _) = tokio::time::timeout(Duration::from_secs(1), q2)
        .await
        .expect("the newest priority-5 waiter must be answered at once")
        .unwrap();
    assert_error(&displaced, 429, "displaced");
    retry_after(&displaced);
    gate.wait_queue_depth(2).await;

    let (same, took) = spawn_post(&client, CHAT, &Req::chat("same").priority(5))
        .await
        .unwrap();
    assert_error(&same, 429, "queue_full");
    retry_after(&same);
    assert!(took < Duration::from_secs(1), "queue_full took {took:?}");

    for (resp, _) in join_all(vec![hold, q1, urgent]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.tags(), ["hold", "urgent", "q1"]);
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("displaced", 1).await;
    gate.wait_outcome("queue_full", 1).await;
}
