//! How honest Retry-After is: clients turned away by a full queue retry exactly at the wait they were
//! given, `Retry-After` (whole seconds) in one run and `retry-after-ms` (the estimate itself, which
//! the OpenAI SDKs read first) in another. Each run reports how many got in on that retry (the hit
//! rate), and checks that by then everything that was ahead of them had drained (not too short) and
//! that no client was told much more than the whole burst needs (not too long). Every refusal carries
//! both headers, and they agree: `Retry-After - 1 < retry-after-ms / 1000 <= Retry-After`.

use std::time::{Duration, Instant};

use slotgate_tests::*;

const SERVICE: Duration = Duration::from_millis(300);
const BURST: usize = 8;
const ROUNDS: usize = 3;

/// Which of the two headers the clients of a run obey.
#[derive(Clone, Copy, Debug)]
enum Obey {
    RetryAfter,
    RetryAfterMs,
}

/// Both waits a refusal carries, checked against each other: (`Retry-After`, `retry-after-ms`).
fn waits(resp: &Response) -> (Duration, Duration) {
    let secs = retry_after(resp);
    let raw = resp
        .header("retry-after-ms")
        .unwrap_or_else(|| panic!("{} has Retry-After but no retry-after-ms", resp.status));
    let ms: f64 = raw
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("retry-after-ms is not a number: {raw:?}"));
    assert!(
        ms > 0.0 && ms / 1000.0 <= secs as f64 && ms / 1000.0 > secs as f64 - 1.0,
        "retry-after-ms {ms} does not agree with Retry-After {secs}"
    );
    (
        Duration::from_secs(secs),
        Duration::from_secs_f64(ms / 1000.0),
    )
}

/// What one run measured.
struct Run {
    retried: usize,
    hits: usize,
    /// The wait each retrying client obeyed.
    told: Vec<Duration>,
}

/// `ROUNDS` bursts of `BURST` against one slot and two queue places; the clients turned away sleep
/// the wait `obey` names and try once more.
async fn run(obey: Obey) -> Run {
    let _timing = slotgate_tests::wait::timing().await;
    let (up, gate) = Gate::one_slot(2).start_instant().await;
    let client = gate.client();
    // Teach the service-time average what a request costs.
    gate.learn_service_time(SERVICE).await;
    let mut out = Run {
        retried: 0,
        hits: 0,
        told: Vec::new(),
    };
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
                    let (secs, ms) = waits(&first);
                    let wait = match obey {
                        Obey::RetryAfter => secs,
                        Obey::RetryAfterMs => ms,
                    };
                    let rejected_at = start.elapsed();
                    tokio::time::sleep(wait).await;
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
            out.retried += 1;
            out.hits += usize::from(*status == 200);
            out.told.push(*wait);
            // Not too short: the three ahead (at most 3 x SERVICE) were done by the retry.
            let drained = SERVICE * 3;
            assert!(
                *rejected_at + *wait >= drained,
                "{obey:?} {wait:?} sent a client back before the work ahead of it drained"
            );
        }
        gate.assert_settled(&up, 1).await;
    }
    let m = gate.metrics().await;
    assert!(m.has_samples("slotgate_retry_after_seconds"), "{}", m.text);
    let rate = out.hits as f64 / out.retried as f64;
    let told: Vec<String> = out
        .told
        .iter()
        .map(|d| format!("{:.2}", d.as_secs_f64()))
        .collect();
    eprintln!(
        "{obey:?} hit rate: {} of {} clients retrying exactly at it got in ({:.0}%); told [{}] s",
        out.hits,
        out.retried,
        rate * 100.0,
        told.join(", ")
    );
    out
}

/// The checks both runs share: nearly all retries get in, and none was told needlessly long.
fn assert_honest(obey: Obey, r: &Run) {
    // The clients of one burst are told successive times (each counts as coming back), so nearly
    // all find room; were they all told the same time, at most 3 of each 5 could.
    let rate = r.hits as f64 / r.retried as f64;
    assert!(
        rate >= 0.8,
        "{obey:?}: {} of {} retries got in",
        r.hits,
        r.retried
    );
    // Not needlessly long either: the whole burst drains in BURST x SERVICE.
    let longest = r.told.iter().max().copied().unwrap_or_default();
    assert!(
        longest <= SERVICE * BURST as u32 + Duration::from_secs(2),
        "{obey:?} up to {longest:?} for a burst that drains in {:?}",
        SERVICE * BURST as u32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_retrying_at_retry_after_mostly_get_in_and_never_too_early() {
    let r = run(Obey::RetryAfter).await;
    assert_honest(Obey::RetryAfter, &r);
}

/// `retry-after-ms` sends clients back sooner than the rounded-up seconds, and still at a time the
/// work ahead has drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_retrying_at_retry_after_ms_mostly_get_in_and_never_too_early() {
    let r = run(Obey::RetryAfterMs).await;
    assert_honest(Obey::RetryAfterMs, &r);
    // The estimate has sub-second precision: not every wait is whole seconds.
    assert!(
        r.told.iter().any(|d| d.subsec_millis() != 0),
        "every retry-after-ms was a whole second: {:?}",
        r.told
    );
}

/// Whole-second waits (here the drain timeout of a shutdown) go out in both headers alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shutdown_answers_the_drain_timeout_in_both_headers() {
    let (_up, mut gate) = Gate::one_slot(2).drain_timeout("3s").start_instant().await;
    let client = gate.client();
    let held = gate
        .hold_slot(&Req::chat("held").delay(Duration::from_millis(500)))
        .await;
    let queued = gate.enqueue(&Req::chat("queued")).await;
    gate.sigterm();
    let (resp, _) = queued.await.expect("queued request task");
    assert_error(&resp, 503, "shutting_down");
    assert_eq!(
        waits(&resp),
        (Duration::from_secs(3), Duration::from_secs(3))
    );
    let (resp, _) = held.await.expect("held request task");
    assert_eq!(resp.status, 200, "{}", resp.body);
    drop(client);
    let status = gate.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "exit status {status}");
}

/// Bursts that overlap (one every second, about 2.4x what the slot serves): every client sent back
/// finds the place kept for it when it returns at its Retry-After, though the next burst's
/// newcomers arrive just before it; the newcomers are the ones told to come back later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_sent_back_by_overlapping_bursts_find_their_places_kept() {
    let _timing = slotgate_tests::wait::timing().await;
    let (up, gate) = Gate::one_slot(2).start_instant().await;
    let client = gate.client();
    gate.learn_service_time(SERVICE).await;
    let mut tasks = Vec::new();
    for round in 0..6 {
        for i in 0..BURST {
            let client = client.clone();
            let req = Req::chat(&format!("o{round}-{i}")).delay(SERVICE);
            tasks.push(tokio::spawn(async move {
                let first = client.post_json(CHAT, &req.json()).await;
                if first.status == 200 {
                    return None;
                }
                let (secs, _) = waits(&first);
                tokio::time::sleep(secs).await;
                let second = client.post_json(CHAT, &req.json()).await;
                Some((second.status.as_u16(), secs))
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let retries: Vec<(u16, Duration)> = join_all(tasks).await.into_iter().flatten().collect();
    let hits = retries.iter().filter(|(s, _)| *s == 200).count();
    eprintln!(
        "overlapping bursts: {hits} of {} retries got in",
        retries.len()
    );
    assert!(
        hits * 100 >= retries.len() * 95,
        "{hits} of {} retries got in: {retries:?}",
        retries.len()
    );
    gate.assert_settled(&up, 1).await;
}
