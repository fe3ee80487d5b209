//! Readiness: `/readyz` and `slotgate_upstream_ready` follow the upstream's `/health`.

use std::time::Duration;

use slotgate_tests::*;

async fn ready_gauge(gate: &RunningGate) -> Option<f64> {
    gate.metric("slotgate_upstream_ready", &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_follows_upstream_health() {
    let (up, gate) = Gate::new()
        .no_wait_ready()
        .start_with(FakeUpstream::loading_then_ready(ms(2000)))
        .await;

    assert_eq!(
        gate.livez().await,
        200,
        "/livez is about slotgate itself, not the upstream"
    );
    // Give the health probe (every 100 ms) a chance to run while the fake still loads.
    tokio::time::sleep(ms(300)).await;
    if std::time::Instant::now() + ms(300) < up.ready_at() {
        assert_eq!(gate.readyz().await, 503, "upstream is loading");
        assert_eq!(
            ready_gauge(&gate).await,
            Some(0.0),
            "slotgate_upstream_ready while loading"
        );
        let st = gate.status().await;
        assert_eq!(st["upstream"]["ready"], false, "{st}");
        assert_eq!(st["upstream"]["target"], up.url().as_str(), "{st}");
    }

    eventually(
        Duration::from_secs(3),
        "/readyz 200 after the upstream loaded",
        || async { (gate.readyz().await == 200).then_some(()) },
    )
    .await;
    assert_eq!(
        ready_gauge(&gate).await,
        Some(1.0),
        "slotgate_upstream_ready once loaded"
    );
    assert_eq!(gate.status().await["upstream"]["ready"], true);

    // The upstream goes away: readiness must follow it down again.
    drop(up);
    eventually(
        Duration::from_secs(3),
        "/readyz 503 after the upstream went away",
        || async { (gate.readyz().await == 503).then_some(()) },
    )
    .await;
    assert_eq!(ready_gauge(&gate).await, Some(0.0));
    assert_eq!(gate.livez().await, 200);
    gate.assert_idle().await;
}
