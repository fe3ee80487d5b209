//! Admin `/status`: the documented JSON shape, live counts while busy, and the admin listener on a Unix socket.

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_has_the_documented_shape_and_tracks_load() {
    let (up, gate) = Gate::new()
        .slots(2)
        .queue_depth(5)
        .admin_unix()
        .start_instant()
        .await;

    let st = gate.status().await;
    assert_eq!(st["slots"]["total"], 2, "{st}");
    assert_eq!(st["slots"]["busy"], 0, "{st}");
    assert_eq!(st["queue"]["depth"], 0, "{st}");
    assert_eq!(st["queue"]["capacity"], 5, "{st}");
    assert_eq!(st["inflight"], 0, "{st}");
    assert_eq!(st["upstream"]["ready"], true, "{st}");
    assert_eq!(st["upstream"]["target"], up.url().as_str(), "{st}");
    assert!(st["service_time_seconds"].is_number(), "{st}");
    assert_eq!(st["draining"], false, "{st}");
    assert_eq!(gate.livez().await, 200);
    let live = gate.admin().get("/livez").await;
    assert_eq!(live.body.trim(), "ok");

    let client = gate.client();
    let handles = (0..3)
        .map(|i| spawn_post(&client, CHAT, &Req::chat(&format!("s{i}")).delay(ms(500))))
        .collect::<Vec<_>>();
    let st = gate
        // A slot is taken a moment before its request is forwarded: wait for both.
        .wait_status(
            std::time::Duration::from_secs(3),
            "2 busy and in flight, 1 queued",
            |s| s["slots"]["busy"] == 2 && s["inflight"] == 2 && s["queue"]["depth"] == 1,
        )
        .await;
    assert_eq!(st["inflight"], 2, "{st}");
    let m = gate.metrics().await;
    assert_eq!(m.value("slotgate_slots_busy", &[]), Some(2.0));
    assert_eq!(m.value("slotgate_queue_depth", &[]), Some(1.0));
    assert_eq!(m.value("slotgate_inflight", &[]), Some(2.0));

    for (resp, _) in join_all(handles).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.max_concurrency(), 2);
    gate.assert_settled(&up, 2).await;
    let st = gate.status().await;
    assert!(
        st["service_time_seconds"].as_f64().unwrap_or(0.0) > 0.0,
        "service time after three 500 ms requests: {st}"
    );
}
