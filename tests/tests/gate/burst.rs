//! A bounded burst of concurrent clients: every client gets exactly one answer, only 200 or 429, and the
//! counts add up across the client, the upstream and `/metrics`.

use std::time::Duration;

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn burst_accounting_adds_up() {
    const CLIENTS: usize = 40;
    let (up, gate) = Gate::new().slots(2).queue_depth(5).start_instant().await;
    let client = gate.client();

    let handles = (0..CLIENTS)
        .map(|i| {
            let req = Req::chat(&format!("b{i}")).delay(ms(20 + (i as u64 * 7) % 60));
            let req = if i % 3 == 0 {
                req.stream().set("fake_chunk_delay_ms", 5)
            } else {
                req
            };
            spawn_post(&client, CHAT, &req)
        })
        .collect();
    let results = tokio::time::timeout(Duration::from_secs(10), join_all(handles))
        .await
        .expect("every client answered within 10 s");

    let mut ok = 0;
    let mut full = 0;
    for (resp, _) in &results {
        match resp.status.as_u16() {
            200 => ok += 1,
            429 => {
                assert_error(resp, 429, "queue_full");
                full += 1;
            }
            other => panic!("unexpected {other}: {}", resp.body),
        }
    }
    assert_eq!(ok + full, CLIENTS);
    assert!(
        ok >= 7,
        "at least the slots plus the queue are served, got {ok}"
    );
    assert_eq!(up.count(), ok, "every 200 was forwarded exactly once");
    assert!(up.max_concurrency() <= 2);
    gate.assert_settled(&up, 2).await;
    gate.wait_outcome("ok", ok as u64).await;
    gate.wait_outcome("queue_full", full as u64).await;
}
