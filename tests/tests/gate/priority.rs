//! Priority: with `--trust-client-priority` the queue is ordered by the body's `priority` (lower first);
//! without it, the field is ignored and arrival order holds.

use slotgate_tests::*;

/// Holds the only slot, queues priorities 5, 1, 3, and returns the order the queued ones were served in.
async fn served_order(trust: bool) -> Vec<String> {
    let mut gate = Gate::one_slot(8);
    if trust {
        gate = gate.trust_client_priority();
    }
    let (up, gate) = gate.start_instant().await;

    let mut handles = vec![gate.hold_slot(&Req::chat("hold").delay(ms(600))).await];
    for p in [5, 1, 3] {
        handles.push(gate.enqueue(&Req::chat(&format!("p{p}")).priority(p)).await);
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
async fn trusted_priority_orders_the_queue() {
    assert_eq!(served_order(true).await, ["p1", "p3", "p5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn untrusted_priority_keeps_arrival_order() {
    assert_eq!(served_order(false).await, ["p5", "p1", "p3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn equal_priorities_keep_arrival_order() {
    let (up, gate) = Gate::one_slot(8)
        .trust_client_priority()
        .start_instant()
        .await;

    let mut handles = vec![gate.hold_slot(&Req::chat("hold").delay(ms(500))).await];
    for (tag, p) in [("a", 3), ("b", 3), ("c", 1), ("d", 3), ("e", 1)] {
        handles.push(gate.enqueue(&Req::chat(tag).priority(p)).await);
    }
    for (resp, _) in join_all(handles).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(
        up.tags(),
        ["hold", "c", "e", "a", "b", "d"],
        "priority first, then arrival order"
    );
    gate.assert_settled(&up, 1).await;
}
