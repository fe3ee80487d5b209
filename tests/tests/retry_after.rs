//! How honest Retry-After is: clients turned away by a full queue retry exactly at the Retry-After
//! they were given. The test reports how many got in on that retry (the hit rate), and checks that by
//! then everything that was ahead of them had drained (not too short) and that no client was told
//! much more than the whole burst needs (not too long).

use std::time::{Duration, Instant};

use slotgate_tests::*;

const SERVICE: Duration = Duration::from_millis(300);
const BURST: usize = 8;
const ROUNDS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_retrying_at_retry_after_mostly_get_in_and_never_too_early() {
    let (up, gate) = Gate::new()
        .slots(1)
        .queue_depth(2)
        .start_with(FakeUpstream::instant())
        .await;
    let client = gate.client();
    // Teach the service-time average what a request costs.
    for i in 0..3 {
        let resp = client
            .post_json(CHAT, &Req::chat(&format!("warm{i}")).delay(SERVICE).json())
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    let (mut retried, mut hits) = (0, 0);
    let mut told = Vec::new();
    for round in 0..ROUNDS {
        let start = Instant::now();
        let tasks: Vec<_> = (0..BURST)
            .map(|i| {
                let client = client.clone();
                let req = Req::chat(&format!("b{round}-{i}")).delay(SERVICE);
                tokio::spawn(async move {
                    let first = client.post_json(CHAT, &req.json()).await;
                    if first.status == 200 {
                        return (first.status.as_u16(), None);
                    }
                    assert_error(&first, 429, "queue_full");
                    let wait = retry_after(&first);
                    let rejected_at = start.elapsed();
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                    let second = client.post_json(CHAT, &req.json()).await;
                    (second.status.as_u16(), Some((wait, rejected_at)))
                })
            })
            .collect();
        let results = join_all(tasks).await;
        // Three fit (one slot, two queued); the rest were told when to come back.
        let first_time = results.iter().filter(|(_, r)| r.is_none()).count();
        assert_eq!(first_time, 3, "{results:?}");
        for (status, retry) in &results {
            let Some((wait, rejected_at)) = retry else {
                continue;
            };
            retried += 1;
            hits += usize::from(*status == 200);
            told.push(*wait);
            // Not too short: the three ahead (at most 3 x SERVICE) were done by the retry.
            let drained = SERVICE * 3;
            assert!(
                *rejected_at + Duration::from_secs(*wait) >= drained,
                "Retry-After {wait}s sent a client back before the work ahead of it drained"
            );
        }
        gate.assert_settled(&up, 1).await;
    }
    let rate = hits as f64 / retried as f64;
    eprintln!(
        "Retry-After hit rate: {hits} of {retried} clients retrying exactly at Retry-After got in ({:.0}%); told {told:?} s",
        rate * 100.0
    );
    // The clients of one burst are told successive seconds (each counts as coming back), so nearly
    // all find room; were they all told the same second, at most 3 of each 5 could.
    assert!(rate >= 0.8, "{hits} of {retried} retries got in");
    // Not needlessly long either: the whole burst drains in BURST x SERVICE.
    let longest = told.iter().max().copied().unwrap_or(0);
    assert!(
        Duration::from_secs(longest) <= SERVICE * BURST as u32 + Duration::from_secs(2),
        "Retry-After up to {longest} s for a burst that drains in {:?}",
        SERVICE * BURST as u32
    );
    let m = gate.metrics().await;
    assert!(m.has_samples("slotgate_retry_after_seconds"), "{}", m.text);
}
