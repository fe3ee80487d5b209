//! Queue timeout: a request that waits longer than `--queue-timeout` gets 504 and is never forwarded.

use std::time::Duration;

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiter_past_the_deadline_gets_504_and_is_never_forwarded() {
    let (up, gate) = Gate::one_slot(4)
        .queue_timeout("300ms")
        .start_instant()
        .await;
    let client = gate.client();

    let slow = gate.hold_slot(&Req::chat("slow").delay(ms(1500))).await;
    let (late, took) = spawn_post(&client, CHAT, &Req::chat("late")).await.unwrap();
    assert_error(&late, 504, "queue_timeout");
    assert!(
        took >= ms(250) && took < Duration::from_secs(1),
        "504 after {took:?}; expected about the 300 ms queue timeout"
    );

    let (slow, _) = slow.await.unwrap();
    assert_eq!(slow.status, 200, "{}", slow.body);
    assert!(
        !up.saw_tag("late"),
        "a timed-out waiter must never be forwarded"
    );
    assert_eq!(up.tags(), ["slow"]);
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("queue_timeout", 1).await;
}
