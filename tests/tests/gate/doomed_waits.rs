//! No doomed waits: once slotgate has measured what a request costs, a request whose estimated wait
//! is already beyond its queue timeout is refused at arrival (429 `estimated_wait_too_long`, with
//! Retry-After) instead of waiting the whole timeout for a 504. `--reject-doomed-waits false` keeps
//! the old behaviour.

use std::time::Duration;

use slotgate_tests::*;

const SERVICE: Duration = Duration::from_millis(1000);

/// A gate whose drain estimate has learned that a request takes `SERVICE`, with one request in
/// service and one waiting: about 2 s of work ahead of a newcomer, whose queue timeout is 1.5 s.
async fn busy_gate(
    extra: &[(&str, &str)],
) -> (
    RunningUpstream,
    RunningGate,
    Vec<tokio::task::JoinHandle<(Response, Duration)>>,
) {
    let mut g = Gate::one_slot(4).queue_timeout("1500ms");
    for (k, v) in extra {
        g = g.opt(k, v);
    }
    let (up, gate) = g.start_instant().await;
    gate.learn_service_time(SERVICE).await;
    let held = gate.hold_slot(&Req::chat("held").delay(SERVICE)).await;
    let queued = gate.enqueue(&Req::chat("queued").delay(SERVICE)).await;
    (up, gate, vec![held, queued])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_that_cannot_be_served_in_time_is_refused_at_arrival() {
    let (up, gate, ahead) = busy_gate(&[]).await;
    let (resp, took) = spawn_post(&gate.client(), CHAT, &Req::chat("doomed"))
        .await
        .unwrap();
    assert_error(&resp, 429, "estimated_wait_too_long");
    let told = retry_after(&resp);
    assert!(told >= 1, "Retry-After {told}");
    assert!(
        took < Duration::from_millis(500),
        "refused after {took:?}: not at arrival"
    );
    for (resp, _) in join_all(ahead).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert!(!up.saw_tag("doomed"));
    gate.wait_outcome("wait_too_long", 1).await;
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_flag_off_the_same_request_waits_for_its_504() {
    let (up, gate, ahead) = busy_gate(&[("--reject-doomed-waits", "false")]).await;
    let (resp, took) = spawn_post(&gate.client(), CHAT, &Req::chat("doomed"))
        .await
        .unwrap();
    assert_error(&resp, 504, "queue_timeout");
    assert!(took >= Duration::from_millis(1400), "504 after {took:?}");
    for (resp, _) in join_all(ahead).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.assert_settled(&up, 1).await;
}
