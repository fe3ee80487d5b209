//! A queued client that disconnects leaves the queue at once and is never forwarded.

use std::time::{Duration, Instant};

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queued_client_that_leaves_is_dropped_from_the_queue() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let client = gate.client();

    let hold = gate.hold_slot(&Req::chat("hold").delay(ms(1500))).await;
    let gone = gate.enqueue(&Req::chat("gone")).await;

    // Aborting the task drops the connection: the client has gone away.
    gone.abort();
    let t0 = Instant::now();
    let st = gate.wait_queue_depth(0).await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "queue emptied only after {:?}",
        t0.elapsed()
    );
    assert_eq!(
        st["slots"]["busy"], 1,
        "the waiter left the queue while the slot was still busy: {st}"
    );

    let (held, _) = hold.await.unwrap();
    assert_eq!(held.status, 200);
    let after = client.post_chat(&Req::chat("after")).await;
    assert_eq!(after.status, 200, "{}", after.body);

    assert!(
        !up.saw_tag("gone"),
        "a departed waiter must never be forwarded"
    );
    assert_eq!(up.tags(), ["hold", "after"]);
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("client_gone", 1).await;
}
