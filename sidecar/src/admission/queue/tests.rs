//! The queue: order, fairness, displacement, the pool, and the Retry-After model.

use super::*;

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// One tenant's claim at `priority`.
fn c(priority: i64) -> Claim {
    Claim::test("t", priority)
}

/// The one slot and both queue places of `Admission::new(1, 2)` taken by `make`'s claims, kept
/// while the guards live.
async fn one_held_two_waiting(
    adm: &Admission,
    make: impl Fn() -> Claim,
) -> (SlotGuard, Entry, Entry) {
    let (held, _) = adm.acquire(make(), far()).await.unwrap();
    (
        held,
        adm.enter(make(), far()).unwrap(),
        adm.enter(make(), far()).unwrap(),
    )
}

/// The Retry-After each of `n` clients turned away in a row is told.
fn refusals(adm: &Admission, n: usize, make: impl Fn() -> Claim) -> Vec<u64> {
    (0..n)
        .map(|_| {
            adm.enter(make(), far())
                .err()
                .and_then(|e| e.retry_after())
                .expect("turned away with a Retry-After")
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn serves_by_priority_then_arrival_and_hands_slots_on() {
    let adm = Admission::new(1, 8);
    let (first, _) = adm.acquire(c(0), far()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, prio) in [("a5", 5), ("b1", 1), ("c5", 5), ("d1", 1)] {
        let (adm, order) = (adm.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let (slot, _) = adm.acquire(c(prio), far()).await.unwrap();
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(slot);
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(adm.stats().depth, 4);
    drop(first);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["b1", "d1", "a5", "c5"]);
    let s = adm.stats();
    assert_eq!((s.busy, s.depth), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn more_slots_go_to_waiters_at_once_and_fewer_hold_new_ones_back() {
    let adm = Admission::new(1, 8);
    let (first, _) = adm.acquire(c(0), far()).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let adm = adm.clone();
            tokio::spawn(async move { adm.acquire(c(0), far()).await.map(|(s, _)| s) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!((adm.stats().busy, adm.stats().depth), (1, 3));
    adm.set_slots(3);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        (adm.stats().slots, adm.stats().busy, adm.stats().depth),
        (3, 3, 1),
        "two new slots, two waiters served"
    );
    // Down to one: nobody is cut off, and the last waiter goes only once busy < 1.
    adm.set_slots(1);
    let mut held = vec![first];
    let mut done = Vec::new();
    for w in waiters {
        if w.is_finished() {
            held.push(w.await.unwrap().unwrap());
        } else {
            done.push(w);
        }
    }
    assert_eq!(held.len(), 3);
    held.pop();
    held.pop();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(adm.stats().depth, 1, "busy 1 of 1: the waiter still waits");
    held.pop();
    let last = done.pop().unwrap().await.unwrap().unwrap();
    assert_eq!(adm.stats().busy, 1);
    drop(last);
    assert_eq!((adm.stats().busy, adm.stats().depth), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn full_queue_rejects_or_displaces_the_least_urgent_newest() {
    let adm = Admission::new(1, 2);
    let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
    let a = tokio::spawn({
        let adm = adm.clone();
        async move { adm.acquire(c(5), far()).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let b = tokio::spawn({
        let adm = adm.clone();
        async move { adm.acquire(c(5), far()).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = adm.acquire(c(5), far()).await.err().unwrap();
    assert!(
        matches!(err, GateError::QueueFull { depth: 2, .. }),
        "{err:?}"
    );
    assert!(err.retry_after().unwrap() >= 1);

    let urgent = tokio::spawn({
        let adm = adm.clone();
        async move { adm.acquire(c(0), far()).await.map(|_| ()) }
    });
    let displaced = b.await.unwrap().err().unwrap();
    assert!(
        matches!(displaced, GateError::Displaced { .. }),
        "{displaced:?}"
    );
    assert_eq!(adm.stats().depth, 2);
    adm.close(1);
    assert!(matches!(
        a.await.unwrap(),
        Err(GateError::ShuttingDown { .. })
    ));
    assert!(matches!(
        urgent.await.unwrap(),
        Err(GateError::ShuttingDown { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn deadline_and_cancellation_leave_the_queue() {
    let adm = Admission::new(1, 4);
    let (held, _) = adm.acquire(c(0), far()).await.unwrap();
    let err = adm
        .acquire(c(0), Instant::now() + Duration::from_millis(50))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, GateError::QueueTimeout(_)), "{err:?}");

    let waiting = tokio::spawn({
        let adm = adm.clone();
        async move { adm.acquire(c(0), far()).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(adm.stats().depth, 1);
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(adm.stats().depth, 0);
    drop(held);
    assert_eq!(adm.stats().busy, 0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_racing_a_cancellation_is_handed_on() {
    let adm = Admission::new(1, 4);
    let (held, _) = adm.acquire(c(0), far()).await.unwrap();
    let Entry::Queued(ticket) = adm.enter(c(0), far()).unwrap() else {
        panic!("expected to queue")
    };
    drop(held); // grants the slot to `ticket`, which never looks at it
    assert_eq!(adm.stats().busy, 1);
    drop(ticket);
    let s = adm.stats();
    assert_eq!((s.busy, s.depth), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn retry_after_follows_measured_service_time() {
    let adm = Admission::new(1, 1);
    for _ in 0..20 {
        let (mut slot, _) = adm.acquire(c(0), far()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        slot.complete();
    }
    assert!((adm.stats().service_seconds - 3.0).abs() < 0.01);
    let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
    let _waiting = tokio::spawn({
        let adm = adm.clone();
        async move { adm.acquire(c(0), far()).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = adm.acquire(c(0), far()).await.err().unwrap();
    // One busy slot and one waiter ahead, 3 s each.
    assert_eq!(err.retry_after(), Some(6));
}

/// Clients turned away are never told to come back in a second that already has as many clients
/// due as there are queue places: coming back at the same instant to a busy slot, the later ones
/// would find it full again.
#[tokio::test(start_paused = true)]
async fn no_second_gets_more_returning_clients_than_places() {
    let adm = Admission::new(1, 2);
    // Cheap requests: 10 tokens in 10 ms, so the work ahead is far under a second.
    learn(&adm, 10, Duration::from_millis(10), 10).await;
    let _full = one_held_two_waiting(&adm, || claim("a", 0, 10)).await;
    let told = refusals(&adm, 6, || claim("a", 0, 10));
    assert_eq!(told, [1, 1, 2, 2, 3, 3]);
}

/// A slotgate just started has measured nothing: every client of its first burst gets the same
/// estimate. The calendar spreads them all the same, no more a second than there are queue places,
/// or they would all come back at once to a queue with room for two.
#[tokio::test(start_paused = true)]
async fn before_anything_is_measured_a_burst_is_still_spread_over_the_seconds() {
    let adm = Admission::new(1, 2);
    let _full = one_held_two_waiting(&adm, || c(0)).await;
    let told = refusals(&adm, 5, || c(0));
    // Three requests ahead at the 1 s guess on one slot: 3 s, two a second from there.
    assert_eq!(told, [3, 3, 4, 4, 5]);
}

/// A flood of clients that never come back does not fill an hour of seconds: the calendar keeps a
/// bounded number of bookings (the oldest dropped first), so a refusal stays cheap and a client
/// turned away after the flood is told about the wait, not about the flood.
#[tokio::test(start_paused = true)]
async fn a_flood_of_refusals_does_not_fill_the_calendar() {
    let adm = Admission::new(1, 2);
    let _full = one_held_two_waiting(&adm, || c(0)).await;
    let told = refusals(&adm, 10_000, || c(0));
    // 4 * (1 slot + 2 places) + 64 = 76 bookings kept, two a second: never more than 38 s on.
    let latest = *told.iter().max().unwrap();
    assert!(
        (3..=3 + 38).contains(&latest),
        "latest Retry-After {latest}"
    );
    assert_eq!(told[..5], [3, 3, 4, 4, 5]);
}

/// A throughput that varies from request to request makes Retry-After leave room for it.
#[tokio::test(start_paused = true)]
async fn retry_after_leaves_room_for_a_varying_throughput() {
    let told = |steady: bool| async move {
        let adm = Admission::new(1, 1);
        for i in 0..20u64 {
            let (mut slot, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
            // 400 tokens in 2 s on average; unsteady: 1 s and 3 s in turn.
            let secs = if steady { 2 } else { 1 + 2 * (i % 2) };
            tokio::time::sleep(Duration::from_secs(secs)).await;
            slot.settle(400);
            slot.complete();
        }
        let (_held, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
        let _waiting = adm.enter(claim("a", 0, 400), far()).unwrap();
        adm.enter(claim("a", 0, 400), far())
            .err()
            .and_then(|e| e.retry_after())
            .unwrap()
    };
    let (steady, unsteady) = (told(true).await, told(false).await);
    assert_eq!(steady, 4, "two requests of 2 s ahead");
    assert!(unsteady > steady, "steady {steady}, unsteady {unsteady}");
}

/// A request whose estimated wait already passes its deadline is refused at arrival (429 with
/// Retry-After), not queued to time out; one that can make it, or any request before a service
/// time has been measured, queues as before.
#[tokio::test(start_paused = true)]
async fn a_doomed_wait_is_refused_at_arrival() {
    let fairness = Fairness {
        reject_doomed: true,
        ..Fairness::default()
    };
    let adm = Admission::with_fairness(1, 8, fairness);
    let deadline = |secs| Instant::now() + Duration::from_secs(secs);
    // Nothing measured yet: no ground to refuse.
    let (held, _) = adm.acquire(c(0), far()).await.unwrap();
    let early = adm.enter(c(0), deadline(1)).unwrap();
    drop(early);
    drop(held);
    // 3 s a request.
    for _ in 0..5 {
        let (mut slot, _) = adm.acquire(c(0), far()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        slot.complete();
    }
    let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
    let first = adm.enter(c(0), deadline(10)).unwrap();
    // One in service and one waiting ahead: ~6 s. A 5 s deadline is doomed, 10 s is not.
    let err = adm.enter(c(0), deadline(5)).err().unwrap();
    assert!(
        matches!(err, GateError::WaitTooLong { estimate: 6, .. }),
        "{err:?}"
    );
    assert_eq!(err.status(), 429);
    assert!(err.retry_after().unwrap() >= 6, "{err:?}");
    let ok = adm.enter(c(0), deadline(10));
    assert!(ok.is_ok());
    // A more urgent request waits only for the one in service.
    let urgent = adm.enter(c(-1), deadline(5));
    assert!(urgent.is_ok());
    // Off: it queues (and would time out).
    let off = Admission::new(1, 8);
    let (_h, _) = off.acquire(c(0), far()).await.unwrap();
    drop(first);
    assert!(off.enter(c(0), deadline(1)).is_ok());
}

/// Once requests have reported their usage, Retry-After is the tokens ahead over the measured
/// token throughput, scaled by how much of a charge is really used; and each client turned away
/// counts as coming back, so the next one is told a later second.
#[tokio::test(start_paused = true)]
async fn retry_after_counts_tokens_ahead_and_spreads_a_burst() {
    let adm = Admission::new(1, 1);
    // Charged 400 tokens each, used 200 in 2 s: 100 tokens/s, half of each charge used.
    learn(&adm, 400, Duration::from_secs(2), 200).await;
    let (_held, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
    let _waiting = tokio::spawn({
        let adm = adm.clone();
        async move { adm.acquire(claim("a", 0, 1000), far()).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Ahead: 400 in service + 1000 waiting, half used: 700 tokens at 100/s = 7 s.
    assert!(
        (adm.stats().wait_seconds - 7.0).abs() < 0.01,
        "{:?}",
        adm.stats()
    );
    let told = refusals(&adm, 3, || claim("b", 0, 200));
    // Each turned-away client's 200 (100 used) comes back: one second more for the next.
    assert_eq!(told, [7, 8, 9]);
}

/// `retry-after-ms` is the estimate itself; `Retry-After` rounds it up. A second already full of
/// returning clients moves both on by whole seconds.
#[tokio::test(start_paused = true)]
async fn retry_after_ms_is_the_unrounded_estimate() {
    let adm = Admission::new(1, 1);
    // 100 tokens/s, half of each charge used (as above).
    learn(&adm, 400, Duration::from_secs(2), 200).await;
    let (_held, _) = adm.acquire(claim("a", 0, 400), far()).await.unwrap();
    let _waiting = adm.enter(claim("a", 0, 500), far()).unwrap();
    let told = |adm: &Admission, cost| {
        let e = adm.enter(claim("b", 0, cost), far()).err().unwrap();
        (e.retry_after().unwrap(), e.retry_after_ms().unwrap())
    };
    // Ahead: (400 + 500) / 2 tokens at 100/s = 4.5 s; then 100 more tokens coming back.
    assert_eq!(told(&adm, 200), (5, 4_500));
    assert_eq!(told(&adm, 200), (6, 5_500));

    // Cheap requests, far under a second: two queue places, so two clients per second.
    let adm = Admission::new(1, 2);
    learn(&adm, 10, Duration::from_millis(10), 10).await;
    let (_held, _) = adm.acquire(claim("a", 0, 10), far()).await.unwrap();
    let _waiting = adm.enter(claim("a", 0, 10), far()).unwrap();
    let _waiting2 = adm.enter(claim("a", 0, 10), far()).unwrap();
    let all: Vec<(u64, u64)> = (0..4).map(|_| told(&adm, 10)).collect();
    assert_eq!(all, [(1, 30), (1, 40), (2, 1_050), (2, 1_060)]);
}

/// Serves ten requests of tenant `a`, each charged `charge`, taking `took` and using `used`: the
/// drain rate (and how much of a charge is used) the estimates then go by.
async fn learn(adm: &Admission, charge: u64, took: Duration, used: u64) {
    for _ in 0..10 {
        let (mut slot, _) = adm.acquire(claim("a", 0, charge), far()).await.unwrap();
        tokio::time::sleep(took).await;
        slot.settle(used);
        slot.complete();
    }
}

/// One slow request as the only measure (a grammar's, say) refuses no wait by the queue's own
/// timeout: it takes a few before a wait is doomed. A request's own deadline is held to at once.
#[tokio::test(start_paused = true)]
async fn one_measured_request_is_no_ground_to_refuse_a_wait() {
    let fairness = Fairness {
        reject_doomed: true,
        ..Fairness::default()
    };
    let adm = Admission::with_fairness(1, 8, fairness);
    let serve = |took: u64| {
        let adm = &adm;
        async move {
            let (mut slot, _) = adm.acquire(claim("a", 0, 1000), far()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(took)).await;
            slot.settle(1000);
            slot.complete();
        }
    };
    // 10 tokens a second, from one request: 10,000 tokens in service read as 1,000 s.
    serve(100).await;
    let (_held, _) = adm.acquire(claim("a", 0, 10_000), far()).await.unwrap();
    let in_a_minute = Instant::now() + Duration::from_secs(60);
    let queued = adm.enter(claim("b", 0, 100), in_a_minute);
    assert!(
        matches!(queued, Ok(Entry::Queued(_))),
        "refused on one sample"
    );
    // Its own deadline, though, is held to from the first measure.
    let mut own = claim("c", 0, 100);
    own.deadline = Some(Instant::now() + Duration::from_secs(30));
    assert!(matches!(
        adm.enter(own, in_a_minute),
        Err(GateError::DeadlineUnreachable { .. })
    ));
    drop(queued);
    drop(_held);
    // Three measured: the same wait is doomed.
    serve(100).await;
    serve(100).await;
    let (_held, _) = adm.acquire(claim("a", 0, 10_000), far()).await.unwrap();
    let doomed = adm.enter(claim("b", 0, 100), Instant::now() + Duration::from_secs(60));
    assert!(
        matches!(doomed, Err(GateError::WaitTooLong { .. })),
        "{:?}",
        doomed.err()
    );
}

type Log = Arc<Mutex<Vec<(&'static str, Instant)>>>;

fn claim(tenant: &str, priority: i64, cost: u64) -> Claim {
    Claim {
        cost,
        ..Claim::test(tenant, priority)
    }
}

/// A request for `claim` that logs `tag` when it gets its slot, holds it for `hold`, then settles
/// `actual` tokens (the charge itself when `None`).
fn request(
    adm: &Admission,
    log: &Log,
    tag: &'static str,
    claim: Claim,
    hold: Duration,
    actual: Option<u64>,
) -> tokio::task::JoinHandle<Result<(), GateError>> {
    let (adm, log) = (adm.clone(), log.clone());
    let actual = actual.unwrap_or(claim.cost);
    tokio::spawn(async move {
        let (mut slot, _) = adm.acquire(claim, far()).await?;
        log.lock().unwrap().push((tag, Instant::now()));
        tokio::time::sleep(hold).await;
        slot.settle(actual);
        Ok(())
    })
}

fn tags(log: &Log) -> Vec<&'static str> {
    log.lock().unwrap().iter().map(|(t, _)| *t).collect()
}

/// Holds the only slot, queues `queued` (tag, claim, actual tokens) one by one, frees the slot and
/// returns the order they were served in.
async fn served_order(
    adm: &Admission,
    queued: Vec<(&'static str, Claim, Option<u64>)>,
) -> Vec<&'static str> {
    let log = Log::default();
    let (held, _) = adm.acquire(claim("holder", 0, 1), far()).await.unwrap();
    let mut tasks = Vec::new();
    for (tag, claim, actual) in queued {
        tasks.push(request(
            adm,
            &log,
            tag,
            claim,
            Duration::from_millis(10),
            actual,
        ));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(held);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let s = adm.stats();
    assert_eq!((s.busy, s.depth), (0, 0));
    tags(&log)
}

#[tokio::test(start_paused = true)]
async fn tenants_take_turns_within_a_priority_each_in_its_own_order() {
    let adm = Admission::new(1, 16);
    let queued = ["a1", "a2", "a3", "b1", "b2"]
        .into_iter()
        .map(|tag| (tag, claim(&tag[..1], 0, 10), None))
        .collect();
    assert_eq!(
        served_order(&adm, queued).await,
        ["a1", "b1", "a2", "b2", "a3"]
    );
    // Priority still comes first: fairness only orders requests of the same urgency.
    let queued = vec![
        ("a5", claim("a", 5, 10), None),
        ("b5", claim("b", 5, 10), None),
        ("a0", claim("a", 0, 10), None),
        ("a0'", claim("a", 0, 10), None),
    ];
    assert_eq!(served_order(&adm, queued).await, ["a0", "a0'", "b5", "a5"]);
}

#[tokio::test(start_paused = true)]
async fn the_real_token_count_replaces_the_estimate() {
    // a1 is charged 100 up front. Settled at 1 token, a is the less served tenant again after b1;
    // left at its estimate, b is served until it has caught up.
    let queued = |actual| {
        vec![
            ("a1", claim("a", 0, 100), Some(actual)),
            ("b1", claim("b", 0, 10), None),
            ("a2", claim("a", 0, 100), None),
            ("b2", claim("b", 0, 10), None),
            ("b3", claim("b", 0, 10), None),
        ]
    };
    let adm = Admission::new(1, 16);
    assert_eq!(
        served_order(&adm, queued(1)).await,
        ["a1", "b1", "a2", "b2", "b3"]
    );
    let adm = Admission::new(1, 16);
    assert_eq!(
        served_order(&adm, queued(100)).await,
        ["a1", "b1", "b2", "b3", "a2"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_tenant_waits_for_one_request_at_most_and_banks_no_idle_time() {
    let adm = Admission::new(1, 64);
    let log = Log::default();
    let hold = Duration::from_millis(100);
    let flood: Vec<_> = (0..20)
        .map(|_| request(&adm, &log, "a", claim("a", 0, 10), hold, None))
        .collect();
    tokio::time::sleep(Duration::from_millis(250)).await;
    // b has been idle while a was served: it goes next, but only once before a's next turn.
    let arrived = Instant::now();
    let b: Vec<_> = (0..3)
        .map(|_| request(&adm, &log, "b", claim("b", 0, 10), hold, None))
        .collect();
    for t in flood.into_iter().chain(b) {
        t.await.unwrap().unwrap();
    }
    let log = log.lock().unwrap().clone();
    let first_b = log.iter().find(|(t, _)| *t == "b").unwrap().1;
    assert!(first_b - arrived <= hold, "{:?}", first_b - arrived);
    let order: String = log.iter().map(|(t, _)| *t).collect();
    assert!(order.contains("abababa"), "{order}");
    assert!(!order.contains("bb"), "{order}");
}

#[tokio::test(start_paused = true)]
async fn weights_divide_the_charge() {
    let adm = Admission::new(1, 64);
    let heavy = |tag| {
        let c = Claim {
            weight: 2.0,
            ..claim("h", 0, 10)
        };
        (tag, c, None)
    };
    let light = |tag| (tag, claim("l", 0, 10), None);
    let queued = vec![
        heavy("h1"),
        heavy("h2"),
        heavy("h3"),
        heavy("h4"),
        light("l1"),
        light("l2"),
    ];
    assert_eq!(
        served_order(&adm, queued).await,
        ["h1", "l1", "h2", "h3", "l2", "h4"]
    );
}

/// A priority-3 request of tenant `l` behind three clients of tenant `h` that keep sending
/// priority-0 requests (each holding the slot 400 ms) for 10 s: returns how long it waited.
async fn low_priority_wait(aging: Option<Duration>) -> Duration {
    let fairness = Fairness {
        aging,
        tenant_limit: None,
        ..Fairness::default()
    };
    let adm = Admission::with_fairness(1, 64, fairness);
    let log = Log::default();
    let hold = Duration::from_millis(400);
    let stop = Instant::now() + Duration::from_secs(10);
    let mut tasks: Vec<_> = (0..3)
        .map(|_| {
            let (adm, log) = (adm.clone(), log.clone());
            tokio::spawn(async move {
                while Instant::now() < stop {
                    request(&adm, &log, "h", claim("h", 0, 10), hold, None)
                        .await
                        .unwrap()?;
                }
                Ok(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let arrived = Instant::now();
    tasks.push(request(&adm, &log, "low", claim("l", 3, 10), hold, None));
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let log = log.lock().unwrap().clone();
    log.iter().find(|(t, _)| *t == "low").unwrap().1 - arrived
}

#[tokio::test(start_paused = true)]
async fn aging_lets_a_low_priority_request_through_a_stream_of_urgent_ones() {
    // The stream's requests wait under 1 s, so they stay at level 0; priority 3 reaches it after
    // 3 s, and its tenant is the less served one: it gets the next slot.
    let waited = low_priority_wait(Some(Duration::from_secs(1))).await;
    assert!(
        waited >= Duration::from_secs(3) && waited <= Duration::from_millis(3400),
        "{waited:?}"
    );
    let starved = low_priority_wait(None).await;
    assert!(starved >= Duration::from_secs(9), "{starved:?}");
}

fn with_share(capacity: usize, limit: usize) -> Admission {
    let fairness = Fairness {
        aging: None,
        tenant_limit: Some(limit),
        ..Fairness::default()
    };
    Admission::with_fairness(1, capacity, fairness)
}

#[tokio::test(start_paused = true)]
async fn beside_others_a_tenant_may_hold_only_its_share_of_the_queue() {
    let adm = with_share(4, 2);
    let log = Log::default();
    let (held, _) = adm.acquire(claim("b", 0, 1), far()).await.unwrap();
    let hold = Duration::from_millis(10);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        tasks.push(request(&adm, &log, "a", claim("a", 0, 1), hold, None));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // b is active (in service): a may not take a third place although the queue has room.
    let err = adm.acquire(claim("a", 0, 1), far()).await.err().unwrap();
    assert!(
        matches!(err, GateError::TenantQueueFull { waiting: 2, .. }),
        "{err:?}"
    );
    assert!(err.retry_after().unwrap() >= 1);
    tasks.push(request(&adm, &log, "c", claim("c", 0, 1), hold, None));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(adm.stats().depth, 3);
    let listed = adm.tenants(10);
    let a = listed.iter().find(|t| t.tenant == "a").unwrap();
    assert_eq!((a.waiting, a.in_service), (2, 0));
    drop(held);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(tags(&log), ["a", "c", "a"]);
}

#[tokio::test(start_paused = true)]
async fn alone_a_tenant_may_fill_the_queue_until_another_needs_a_place() {
    let adm = with_share(4, 2);
    let log = Log::default();
    let (held, _) = adm.acquire(claim("a", 0, 1), far()).await.unwrap();
    let hold = Duration::from_millis(10);
    let mut tasks = Vec::new();
    for tag in ["a1", "a2", "a3", "a4"] {
        tasks.push(request(&adm, &log, tag, claim("a", 0, 1), hold, None));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(adm.stats().depth, 4);
    // b's arrival takes a's newest place; a is now held to its share.
    tasks.push(request(&adm, &log, "b", claim("b", 0, 1), hold, None));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let over = tasks.swap_remove(3).await.unwrap().unwrap_err();
    assert!(
        matches!(over, GateError::TenantQueueFull { waiting: 4, .. }),
        "{over:?}"
    );
    let err = adm.acquire(claim("a", 0, 1), far()).await.err().unwrap();
    assert!(matches!(err, GateError::TenantQueueFull { .. }), "{err:?}");
    // A less urgent arrival does not take the place of a more urgent waiter.
    let err = adm.acquire(claim("c", 5, 1), far()).await.err().unwrap();
    assert!(matches!(err, GateError::QueueFull { .. }), "{err:?}");
    drop(held);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(tags(&log), ["b", "a1", "a2", "a3"]);
}

#[tokio::test(start_paused = true)]
async fn displacement_weighs_aged_priority() {
    let fairness = Fairness {
        aging: Some(Duration::from_secs(1)),
        tenant_limit: None,
        ..Fairness::default()
    };
    let adm = Admission::with_fairness(1, 2, fairness);
    let (_held, _) = adm.acquire(claim("x", 0, 1), far()).await.unwrap();
    let spawn = |prio| {
        let adm = adm.clone();
        tokio::spawn(async move { adm.acquire(claim("y", prio, 1), far()).await.map(|_| ()) })
    };
    let old = spawn(5);
    tokio::time::sleep(Duration::from_secs(3)).await; // old is at level 2 now
    let young = spawn(5);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let urgent = spawn(3);
    let displaced = young.await.unwrap().unwrap_err();
    assert!(
        matches!(displaced, GateError::Displaced { .. }),
        "{displaced:?}"
    );
    // Left: old (level 2) and urgent (level 3). Another 3 is not more urgent than either.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = adm.acquire(claim("y", 3, 1), far()).await.err().unwrap();
    assert!(matches!(err, GateError::QueueFull { .. }), "{err:?}");
    adm.close(1);
    for t in [old, urgent] {
        assert!(matches!(
            t.await.unwrap(),
            Err(GateError::ShuttingDown { .. })
        ));
    }
    assert_eq!(adm.tenants(10).iter().map(|t| t.waiting).sum::<usize>(), 0);
}

/// The live view lists the waiters in the order they are then served, each expected to start after
/// the work ahead of it.
#[tokio::test(start_paused = true)]
async fn the_waiters_view_is_the_order_of_service() {
    let adm = Admission::new(1, 16);
    learn(&adm, 10, Duration::from_millis(100), 10).await;
    let log = Log::default();
    let (held, _) = adm.acquire(claim("holder", 0, 10), far()).await.unwrap();
    let queued = [
        ("a1", claim("a", 0, 10)),
        ("a2", claim("a", 0, 10)),
        ("b1", claim("b", 0, 10)),
        ("c9", claim("c", 9, 10)),
        ("b0", claim("b", -1, 10)),
    ];
    let mut tasks = Vec::new();
    for (i, (tag, c)) in queued.into_iter().enumerate() {
        let c = c.tagged(i as u64 + 1);
        tasks.push(request(&adm, &log, tag, c, Duration::from_millis(10), None));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let view = adm.waiters(10);
    let names: Vec<&str> = view.iter().map(|w| queued_name(w.tag)).collect();
    // b0 first (more urgent), charged to b; then a (served less) once, then the earlier arrival of
    // the two now level.
    assert_eq!(names, ["b0", "a1", "a2", "b1", "c9"]);
    let starts: Vec<f64> = view.iter().map(|w| w.expected_start_seconds).collect();
    assert!(starts.windows(2).all(|p| p[0] < p[1]), "{starts:?}");
    // 10 tokens in 100 ms a slot: the one in service, then one more before each.
    assert!((starts[0] - 0.1).abs() < 0.01, "{starts:?}");
    assert!((starts[4] - 0.5).abs() < 0.01, "{starts:?}");
    assert!(view[0].age_seconds > 0.0 && view[0].age_seconds < 0.01);
    assert_eq!(adm.waiters(2).len(), 2);
    drop(held);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(tags(&log), names);
    assert!(adm.waiters(10).is_empty());
}

fn queued_name(tag: u64) -> &'static str {
    ["", "a1", "a2", "b1", "c9", "b0"][tag as usize]
}

#[tokio::test(start_paused = true)]
async fn a_model_being_loaded_queues_its_requests_and_refuses_a_wait_that_cannot_fit() {
    let fairness = Fairness {
        reject_doomed: true,
        ..Default::default()
    };
    let p = Admission::for_model(2, 8, fairness, "m");
    assert!(p.is_paused(), "a model's pool starts paused");
    p.set_ready_in(Some(Duration::from_secs(100)));
    // Its load alone outlasts a 60 s deadline: refused at once, naming the estimate.
    let soon = Instant::now() + Duration::from_secs(60);
    match p.enter(c(0), soon) {
        Err(GateError::WaitTooLong { estimate, .. }) => assert!(estimate >= 100, "{estimate}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("admitted or queued past its deadline"),
    }
    // One that can wait queues, and is served once the model is loaded.
    let waiter = {
        let p = p.clone();
        tokio::spawn(async move { p.acquire(c(0), far()).await.map(|(s, _)| s) })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!((p.stats().busy, p.stats().depth), (0, 1));
    assert!(!p.pause_if_idle(), "someone waits: it may not be unloaded");
    p.resume();
    let slot = waiter.await.unwrap().unwrap();
    assert!(!p.pause_if_idle(), "one in service: it may not be unloaded");
    drop(slot);
    assert!(
        p.pause_if_idle() && p.is_paused(),
        "idle: paused for its unload"
    );
    // A failed load turns its waiters away with 503 naming the model.
    let waiter = {
        let p = p.clone();
        tokio::spawn(async move { p.acquire(c(0), far()).await.map(|(s, _)| s) })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    p.fail_waiters("m", "it exited", Duration::from_secs(2));
    match waiter.await.unwrap() {
        Err(GateError::ModelUnavailable {
            model, retry_after, ..
        }) => assert_eq!((model.as_str(), retry_after), ("m", Duration::from_secs(2))),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("served by a model that failed to load"),
    }
    assert!(p.is_idle());
}

/// A claim of `tenant` due `secs` from now (at priority 0, cost 1).
fn due(tenant: &str, secs: Option<u64>) -> Claim {
    Claim::test(tenant, 0).due(secs.map(|s| Instant::now() + Duration::from_secs(s)))
}

#[tokio::test(start_paused = true)]
async fn within_a_priority_the_earliest_deadline_goes_first() {
    let adm = Admission::new(1, 8);
    let order = served_order(
        &adm,
        vec![
            ("none", due("a", None), None),
            ("late", due("b", Some(50)), None),
            ("soon", due("c", Some(20)), None),
            ("urgent-none", Claim::test("d", -1), None),
        ],
    )
    .await;
    // A more urgent priority still goes first; then deadlines by the earliest; then the rest.
    assert_eq!(order, ["urgent-none", "soon", "late", "none"]);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_gives_no_precedence_to_a_tenant_beyond_its_share() {
    let adm = Admission::new(1, 8);
    // `busy` is served 100 tokens while `quiet` waits for 1.
    let (busy, _) = adm.acquire(claim("busy", 0, 100), far()).await.unwrap();
    let quiet = {
        let adm = adm.clone();
        tokio::spawn(async move { adm.acquire(claim("quiet", 0, 1), far()).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(busy);
    let (quiet, _) = quiet.await.unwrap().unwrap();
    // Now `busy` is 99 tokens ahead: its deadline does not put it before `quiet`'s next request.
    let log = Log::default();
    let due_one = request(
        &adm,
        &log,
        "busy-due",
        due("busy", Some(20)),
        Duration::from_millis(10),
        None,
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    let plain = request(
        &adm,
        &log,
        "quiet",
        claim("quiet", 0, 1),
        Duration::from_millis(10),
        None,
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(quiet);
    due_one.await.unwrap().unwrap();
    plain.await.unwrap().unwrap();
    assert_eq!(tags(&log), ["quiet", "busy-due"], "fair share first");
    // Within its share a deadline does go first: `quiet` again, against a plain `busy` request.
    let order = served_order(
        &adm,
        vec![
            ("busy", claim("busy", 0, 1), None),
            ("quiet-due", due("quiet", Some(20)), None),
        ],
    )
    .await;
    assert_eq!(order, ["quiet-due", "busy"]);
}

#[tokio::test(start_paused = true)]
async fn a_request_reaching_its_own_deadline_leaves_the_queue_with_its_reason() {
    // Doomed waits are not refused here: the wait itself must end at the deadline.
    let adm = Admission::new(1, 8);
    let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
    let claim = due("a", Some(2));
    let by = claim.deadline.unwrap();
    let err = adm.acquire(claim, by).await.err().unwrap();
    assert!(matches!(err, GateError::DeadlineExceeded(_)), "{err:?}");
    assert_eq!((err.status(), err.code()), (504, "deadline_exceeded"));
    assert_eq!(err.outcome().label(), "deadline_exceeded");
    // Without a deadline of its own, the queue timeout is what it reaches.
    let err = adm
        .acquire(c(0), Instant::now() + Duration::from_secs(1))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, GateError::QueueTimeout(_)), "{err:?}");
    assert_eq!(adm.stats().depth, 0);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_cannot_be_made_is_refused_at_arrival_even_without_doomed_wait_refusal() {
    let adm = Admission::new(1, 8);
    // 3 s a request, measured.
    for _ in 0..3 {
        let (mut slot, _) = adm.acquire(c(0), far()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        slot.complete();
    }
    let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
    let claim = due("a", Some(1));
    let by = claim.deadline.unwrap();
    let err = adm.enter(claim, by).err().unwrap();
    assert!(
        matches!(err, GateError::DeadlineUnreachable { .. }),
        "{err:?}"
    );
    assert_eq!((err.status(), err.code()), (429, "deadline_unreachable"));
    assert!(err.retry_after().unwrap() >= 3, "{err:?}");
    assert!(err.to_string().contains("deadline"), "{err}");
    // One that can make it queues; a plain one queues too (doomed-wait refusal is off).
    let claim = due("b", Some(10));
    let by = claim.deadline.unwrap();
    assert!(adm.enter(claim, by).is_ok());
    assert!(adm
        .enter(c(0), Instant::now() + Duration::from_secs(1))
        .is_ok());
}

/// A pool of `slots` and `capacity` places with one band, `background` (priorities 10 and up).
fn banded(
    slots: usize,
    capacity: usize,
    slot_share: Option<f64>,
    queue_share: Option<f64>,
) -> Admission {
    let adm = Admission::new(slots, capacity);
    adm.set_bands(crate::admission::Bands::new(vec![crate::admission::Band {
        name: "background".into(),
        priorities: (10, i64::MAX),
        slots: slot_share,
        queue: queue_share,
    }]));
    adm
}

#[tokio::test(start_paused = true)]
async fn a_band_holding_its_share_of_the_queue_is_refused_while_others_still_queue() {
    let adm = banded(1, 8, None, Some(0.25));
    let (_held, _) = adm.acquire(c(0), far()).await.unwrap();
    let _bg: Vec<Ticket> = (0..2)
        .map(|_| match adm.enter(c(10), far()).unwrap() {
            Entry::Queued(t) => t,
            Entry::Admitted(_) => panic!("admitted past a busy slot"),
        })
        .collect();
    let err = adm.enter(c(20), far()).err().unwrap();
    assert!(
        matches!(&err, GateError::BandQueueFull { band, waiting: 2, .. } if band == "background"),
        "{err:?}"
    );
    assert_eq!((err.status(), err.code()), (429, "band_queue_full"));
    assert!(err.retry_after().is_some());
    // Interactive work still finds places.
    let _interactive: Vec<Entry> = (0..4).map(|_| adm.enter(c(0), far()).unwrap()).collect();
    let s = adm.band_stats();
    assert_eq!(
        (s[0].waiting, s[0].queue_limit, s[0].refused),
        (2, Some(2), 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_band_at_its_share_of_the_slots_waits_without_holding_back_the_others() {
    let adm = banded(4, 8, Some(0.5), None);
    let (b1, _) = adm.acquire(c(10), far()).await.unwrap();
    let (b2, _) = adm.acquire(c(10), far()).await.unwrap();
    // The band's two slots are taken: a third background request waits, two slots free.
    let b3 = {
        let adm = adm.clone();
        tokio::spawn(async move { adm.acquire(c(10), far()).await.map(|(s, _)| s) })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!((adm.stats().busy, adm.stats().depth), (2, 1));
    // Interactive requests behind it go straight to the free slots.
    let (i1, w1) = adm.acquire(c(0), far()).await.unwrap();
    let (i2, w2) = adm.acquire(c(0), far()).await.unwrap();
    assert_eq!((w1, w2), (Duration::ZERO, Duration::ZERO));
    assert_eq!(adm.band_stats()[0].slots_busy, 2);
    // An interactive request ending does not let the band past its share.
    drop(i1);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(adm.stats().depth, 1, "the band still holds its two slots");
    // One of the band's own ending does.
    drop(b1);
    let b3 = b3.await.unwrap().unwrap();
    assert_eq!(adm.band_stats()[0].slots_busy, 2);
    drop((b2, b3, i2));
    let s = adm.stats();
    assert_eq!((s.busy, s.depth, adm.band_stats()[0].slots_busy), (0, 0, 0));
}

fn shedding(slots: usize, capacity: usize) -> Admission {
    let fairness = Fairness {
        shed_from: Some(10),
        ..Fairness::default()
    };
    Admission::with_fairness(slots, capacity, fairness)
}

/// An urgent arrival on a full server tells the sheddable request to yield; it goes back to its
/// place in the queue (before later work of its level), and the urgent one gets the slot once the
/// sheddable guard has gone.
#[tokio::test(start_paused = true)]
async fn an_urgent_arrival_sheds_background_work_which_queues_again_first() {
    let adm = shedding(1, 4);
    let (mut batch, _) = adm.acquire(c(10), far()).await.unwrap();
    assert_eq!(adm.stats().sheddable, 1);
    assert!(batch.try_shed().is_none());
    // A later background request waits; it sheds nobody (never for another sheddable one).
    let Entry::Queued(later) = adm.enter(c(10), far()).unwrap() else {
        panic!("the slot is busy")
    };
    assert!(batch.try_shed().is_none(), "not shed for its own kind");
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("the slot is busy")
    };
    let told = batch.try_shed().expect("told to yield");
    assert_eq!(
        told.retry_after,
        Duration::ZERO,
        "not answered: it queues again"
    );
    assert_eq!((adm.stats().sheddable, adm.stats().yielding), (0, 1));
    // A second urgent arrival sheds nothing more: the slot is being freed already.
    let mut back = batch.requeue(Duration::from_millis(20)).ok().unwrap();
    assert_eq!(adm.stats().depth, 3);
    tokio::time::sleep(Duration::from_millis(25)).await;
    let (slot, _) = urgent.wait(far()).await.unwrap();
    assert_eq!(adm.stats().yielding, 0);
    drop(slot);
    // Back in the queue before the later request of its level (its place by arrival).
    let (again, _) = back.wait(far()).await.unwrap();
    assert_eq!(adm.stats().depth, 1);
    assert_eq!(adm.stats().shed_requeued, 1);
    drop(again);
    drop(later);
    let s = adm.stats();
    assert_eq!(
        (s.busy, s.serving, s.depth, s.sheddable, s.yielding),
        (0, 0, 0, 0, 0)
    );
}

/// Shed again within the guard time: no. After it: yes. After the most requeues: never.
#[tokio::test(start_paused = true)]
async fn a_request_is_not_shed_twice_within_the_guard_time_nor_beyond_the_bound() {
    let adm = shedding(1, 8);
    let (mut batch, _) = adm.acquire(c(10), far()).await.unwrap();
    let mut rounds = 0;
    loop {
        let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
            panic!("busy")
        };
        let Some(_) = batch.try_shed() else { break };
        rounds += 1;
        let mut back = batch.requeue(Duration::ZERO).ok().unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let (slot, _) = urgent.wait(far()).await.unwrap();
        drop(slot);
        (batch, _) = back.wait(far()).await.unwrap();
        // Within the guard time, an urgent arrival waits.
        let Entry::Queued(mut waits) = adm.enter(c(0), far()).unwrap() else {
            panic!("busy")
        };
        assert!(batch.try_shed().is_none(), "shed again within the guard");
        drop(batch);
        let (slot, _) = waits.wait(far()).await.unwrap();
        drop(slot);
        // Next round: the same request again, past its guard time.
        tokio::time::sleep(SHED_GUARD).await;
        let mut c10 = c(10);
        c10.shed = rounds;
        c10.shed_at = Some(Instant::now() - SHED_GUARD);
        (batch, _) = adm.acquire(c10, far()).await.unwrap();
        drop(urgent);
    }
    assert_eq!(rounds, MAX_REQUEUES, "shed until the bound, then never");
    drop(batch);
    let s = adm.stats();
    assert_eq!((s.busy, s.depth, s.sheddable, s.yielding), (0, 0, 0, 0));
}

/// A request that has begun its answer is told when to retry; the least harmful victim goes
/// first (not answered before answered), and only as many as the urgent one needs.
#[tokio::test(start_paused = true)]
async fn the_shed_victim_is_the_least_harmed_and_only_as_many_as_needed() {
    let adm = shedding(2, 8);
    let (mut answering, _) = adm.acquire(c(10), far()).await.unwrap();
    assert!(answering.answering(true));
    let (mut fresh, _) = adm.acquire(c(20), far()).await.unwrap();
    // Teach it a service time so the retry estimate is not the default.
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    assert!(
        fresh.try_shed().is_some(),
        "the one not answering yet goes first"
    );
    assert!(answering.try_shed().is_none(), "one slot is enough");
    drop(fresh);
    let (u1, _) = urgent.wait(far()).await.unwrap();
    let Entry::Queued(mut urgent2) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    let told = answering.try_shed().expect("shed while answering");
    assert!(told.retry_after > Duration::ZERO, "told when to retry");
    answering.ended_by_shed();
    drop(answering);
    let (u2, _) = urgent2.wait(far()).await.unwrap();
    assert_eq!(adm.stats().shed_ended, 1);
    drop((u1, u2));
    let s = adm.stats();
    assert_eq!((s.busy, s.depth, s.sheddable, s.yielding), (0, 0, 0, 0));
}

/// A whole answer whose head has come is finished at llama-server: it is sheddable no more. One
/// told to yield in the same instant its head came learns it from `answering` and goes back to the
/// queue instead of being answered.
#[tokio::test(start_paused = true)]
async fn a_whole_answer_is_not_shed_once_it_has_come_and_one_told_first_queues_again() {
    let adm = shedding(1, 8);
    let (mut whole, _) = adm.acquire(c(10), far()).await.unwrap();
    assert!(whole.answering(false), "not told: it is answered");
    assert_eq!(adm.stats().sheddable, 0, "finished work frees nothing");
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    assert!(whole.try_shed().is_none(), "its answer is not lost");
    drop(whole);
    let (u, _) = urgent.wait(far()).await.unwrap();
    drop(u);

    let (mut racing, _) = adm.acquire(c(10), far()).await.unwrap();
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    // Told before its head was seen: `answering` says so, for streams and whole answers alike.
    assert!(!racing.answering(false));
    assert!(!racing.answering(true));
    assert!(racing.try_shed().is_some());
    let mut back = racing.requeue(Duration::ZERO).ok().unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (u, _) = urgent.wait(far()).await.unwrap();
    drop(u);
    let (again, _) = back.wait(far()).await.unwrap();
    drop(again);
    let s = adm.stats();
    assert_eq!((s.busy, s.depth, s.sheddable, s.yielding), (0, 0, 0, 0));
}

/// Shed before its first byte while the queue closes (shutting down): it is answered as the
/// waiters were, not left waiting in a closed queue.
#[tokio::test(start_paused = true)]
async fn a_request_shed_as_the_queue_closes_is_told_shutting_down() {
    let adm = shedding(1, 8);
    let (mut batch, _) = adm.acquire(c(10), far()).await.unwrap();
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    assert!(batch.try_shed().is_some());
    adm.close(30);
    assert!(matches!(
        urgent.wait(far()).await,
        Err(GateError::ShuttingDown { retry_after: 30 })
    ));
    let mut back = batch.requeue(Duration::ZERO).ok().unwrap();
    assert_eq!(adm.stats().depth, 0, "nothing waits in a closed queue");
    assert!(matches!(
        back.wait(far()).await,
        Err(GateError::ShuttingDown { retry_after: 30 })
    ));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let s = adm.stats();
    assert_eq!((s.busy, s.depth, s.sheddable, s.yielding), (0, 0, 0, 0));
}

/// Without `--sheddable-priority` nothing is sheddable.
#[tokio::test(start_paused = true)]
async fn nothing_is_shed_unless_configured() {
    let adm = Admission::new(1, 8);
    let (mut batch, _) = adm.acquire(c(100), far()).await.unwrap();
    let Entry::Queued(_urgent) = adm.enter(c(-100), far()).unwrap() else {
        panic!("busy")
    };
    assert!(batch.try_shed().is_none());
    assert_eq!(adm.stats().sheddable, 0);
}

/// A client turned away for a full queue finds a place kept for it when it comes back as told:
/// a newcomer arriving just before it is refused, though a place has freed meanwhile.
#[tokio::test(start_paused = true)]
async fn a_client_told_to_come_back_finds_its_place_kept() {
    let adm = Admission::new(1, 2);
    let body = |s: &str| c(0).with_body(bytes::Bytes::from(s.to_owned()));
    let (slot, _) = adm.acquire(body("a"), far()).await.unwrap();
    let Entry::Queued(mut b) = adm.enter(body("b"), far()).unwrap() else {
        panic!("busy")
    };
    let Entry::Queued(_c) = adm.enter(body("c"), far()).unwrap() else {
        panic!("busy")
    };
    let Err(GateError::QueueFull { retry_after, .. }) = adm.enter(body("d"), far()) else {
        panic!("the queue is full")
    };
    // A place frees: `b` gets the slot.
    drop(slot);
    let (b_slot, _) = b.wait(far()).await.unwrap();
    assert_eq!(adm.stats().depth, 1);
    // Just before `d` is due, a newcomer finds the free place kept.
    tokio::time::sleep(retry_after.saturating_sub(Duration::from_millis(200))).await;
    assert!(
        matches!(
            adm.enter(body("e"), far()),
            Err(GateError::QueueFull { .. })
        ),
        "a newcomer takes the place kept for d"
    );
    // `d` comes back with the same request: in.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let Ok(Entry::Queued(d)) = adm.enter(body("d"), far()) else {
        panic!("d finds no place")
    };
    drop((d, b_slot));
    // A booking not taken lapses: after it, newcomers get the places again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let s = adm.stats();
    assert_eq!((s.busy, s.depth), (1, 0), "{s:?}");
}

/// In a shared KV pool, what an urgent request lacks may be pool tokens rather than slots: the
/// sheddable request holding them yields, and only as many as it needs.
#[tokio::test(start_paused = true)]
async fn shedding_frees_pool_tokens_where_the_slots_are_not_what_is_short() {
    let adm = shedding(4, 8);
    adm.set_pool(Some(1_000));
    let big = |p| c(p).holding(1, 600);
    let small = |p| c(p).holding(1, 300);
    let (mut batch, _) = adm.acquire(big(10), far()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (mut other, _) = adm.acquire(small(10), far()).await.unwrap();
    // Two slots of four are free, but 600 + 300 of the pool's 1,000 tokens are held.
    let Entry::Queued(mut urgent) = adm.enter(big(0), far()).unwrap() else {
        panic!("the pool is short")
    };
    // The most recently started (the small one) is picked first but is not enough (600 + 600 >
    // 1,000); the big one is, alone: only it yields.
    assert!(
        batch.try_shed().is_some(),
        "the request holding the tokens yields"
    );
    assert!(other.try_shed().is_none(), "no more than it takes");
    drop(batch);
    let (u, _) = urgent.wait(far()).await.unwrap();
    assert_eq!(adm.stats().kv_reserved, 900);
    drop((u, other));
    let s = adm.stats();
    assert_eq!(
        (s.busy, s.kv_reserved, s.sheddable, s.yielding),
        (0, 0, 0, 0)
    );
}

/// An urgent request is not refused at arrival for the sheddable work that would yield to it: the
/// wait estimate leaves that work out (a sheddable arrival's does not).
#[tokio::test(start_paused = true)]
async fn a_doomed_wait_leaves_out_the_work_that_would_yield() {
    for shed in [false, true] {
        let fairness = Fairness {
            reject_doomed: true,
            shed_from: shed.then_some(10),
            ..Fairness::default()
        };
        let adm = Admission::with_fairness(1, 8, fairness);
        // 100 tokens a second.
        learn(&adm, 100, Duration::from_secs(1), 100).await;
        // A background request charged 10,000 tokens: 100 s of work.
        let (_batch, _) = adm.acquire(claim("bg", 10, 10_000), far()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let urgent = adm.enter(claim("ui", 0, 100), deadline);
        match shed {
            false => assert!(
                matches!(urgent, Err(GateError::WaitTooLong { .. })),
                "without shedding the 100 s ahead are a doomed wait"
            ),
            true => assert!(
                matches!(urgent, Ok(Entry::Queued(_))),
                "the background work yields to it"
            ),
        }
        // Another background request: behind the 100 s, refused; with the first yielding (told
        // to, for the urgent one), behind the urgent one only.
        let other = adm.enter(claim("bg", 10, 100), deadline);
        match shed {
            false => assert!(matches!(other, Err(GateError::WaitTooLong { .. }))),
            true => {
                assert_eq!(adm.stats().yielding, 1);
                assert!(matches!(other, Ok(Entry::Queued(_))));
            }
        }
    }
}

/// A newcomer that would be served before the waiter at the head (which does not fit yet) and
/// fits now starts now, instead of waiting for the next request to end.
#[tokio::test(start_paused = true)]
async fn a_newcomer_served_before_a_head_that_does_not_fit_starts_at_once() {
    let adm = Admission::new(2, 8);
    let (_x, _) = adm.acquire(claim("a", 0, 1), far()).await.unwrap();
    let Entry::Queued(_big) = adm
        .enter(
            Claim {
                slots: 2,
                ..claim("a", 5, 1)
            },
            far(),
        )
        .unwrap()
    else {
        panic!("two slots do not fit beside one")
    };
    let Entry::Admitted(_urgent) = adm.enter(claim("b", 0, 1), far()).unwrap() else {
        panic!("more urgent, and one slot is free: at once")
    };
    let s = adm.stats();
    assert_eq!((s.busy, s.depth), (2, 1));
}

/// The waiter at the head leaves (its client went, or its deadline): the one behind it, which
/// fits, is let in at once.
#[tokio::test(start_paused = true)]
async fn the_head_leaving_lets_the_next_waiter_in() {
    let adm = Admission::new(2, 8);
    let (_x, _) = adm.acquire(claim("a", 0, 1), far()).await.unwrap();
    let Entry::Queued(big) = adm
        .enter(
            Claim {
                slots: 2,
                ..claim("a", 0, 1)
            },
            far(),
        )
        .unwrap()
    else {
        panic!()
    };
    let Entry::Queued(mut next) = adm.enter(claim("a", 0, 1), far()).unwrap() else {
        panic!("behind the head")
    };
    drop(big);
    let granted = tokio::time::timeout(Duration::from_secs(5), next.wait(far())).await;
    assert!(granted.is_ok(), "stranded beside a free slot");
}

/// Waiters held back only by their band's share of the slots do not keep a newcomer of another
/// band from a free slot: it starts at once, is not refused as doomed for their sake and takes no
/// queue place.
#[tokio::test(start_paused = true)]
async fn waiters_held_back_by_their_band_do_not_keep_others_from_a_free_slot() {
    let adm = banded(2, 1, Some(0.5), None);
    learn(&adm, 100, Duration::from_secs(1), 100).await;
    let (_b1, _) = adm.acquire(claim("bg", 10, 1000), far()).await.unwrap();
    let Entry::Queued(_b2) = adm.enter(claim("bg", 10, 1000), far()).unwrap() else {
        panic!("the band holds its one slot")
    };
    assert_eq!((adm.stats().busy, adm.stats().depth), (1, 1));
    let due = Instant::now() + Duration::from_secs(2);
    let Ok(Entry::Admitted(_i)) = adm.enter(claim("i", 0, 10).due(Some(due)), far()) else {
        panic!("a slot is free and nobody who could take it waits")
    };
    assert_eq!((adm.stats().busy, adm.stats().depth), (2, 1));
}

/// A request whose own deadline went by while it was read and judged is not started, even with
/// a slot free.
#[tokio::test(start_paused = true)]
async fn a_request_past_its_own_deadline_is_not_started() {
    let adm = Admission::new(1, 8);
    let due = Instant::now();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(matches!(
        adm.enter(c(0).due(Some(due)), far()),
        Err(GateError::DeadlineExceeded(_))
    ));
    assert_eq!((adm.stats().busy, adm.stats().depth), (0, 0));
}

/// Back in the queue, a shed request ages by the time it waited, not by its time in service: it
/// does not take its slot back from the urgent request it yielded to. And a request that has
/// waited long enough to be served before an urgent one is not shed for it.
#[tokio::test(start_paused = true)]
async fn a_shed_request_does_not_take_its_slot_back_by_aging_in_service() {
    let fairness = Fairness {
        shed_from: Some(10),
        aging: Some(Duration::from_secs(10)),
        ..Fairness::default()
    };
    let adm = Admission::with_fairness(1, 8, fairness);
    let (mut batch, _) = adm.acquire(c(10), far()).await.unwrap();
    // A minute in service: six levels, were they counted.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let Entry::Queued(mut urgent) = adm.enter(c(5), far()).unwrap() else {
        panic!("busy")
    };
    assert!(batch.try_shed().is_some(), "shed for the urgent one");
    let mut back = batch.requeue(Duration::from_millis(20)).ok().unwrap();
    tokio::time::sleep(Duration::from_millis(25)).await;
    let (u, _) = tokio::time::timeout(Duration::from_millis(5), urgent.wait(far()))
        .await
        .expect("the urgent request has the slot")
        .unwrap();
    drop(u);
    let (b, _) = back.wait(far()).await.unwrap();
    drop(b);

    // One that waited 60 s before its slot ranks at 4 once back: not shed for a 5.
    let (_hold, _) = adm.acquire(c(0), far()).await.unwrap();
    let Entry::Queued(mut patient) = adm.enter(c(10), far()).unwrap() else {
        panic!("busy")
    };
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(_hold);
    let (mut patient, _) = patient.wait(far()).await.unwrap();
    let Entry::Queued(_five) = adm.enter(c(5), far()).unwrap() else {
        panic!("busy")
    };
    assert!(patient.try_shed().is_none(), "it would be served first");
    assert_eq!(adm.stats().sheddable, 1);
}

/// An urgent request that arrives while the only victim is within its guard time is looked at
/// again once the guard time is over, and the victim yields then.
#[tokio::test(start_paused = true)]
async fn a_victim_within_its_guard_time_yields_once_it_is_over() {
    let adm = shedding(1, 8);
    let (mut batch, _) = adm.acquire(c(10), far()).await.unwrap();
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    assert!(batch.try_shed().is_some());
    let mut back = batch.requeue(Duration::ZERO).ok().unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (u, _) = urgent.wait(far()).await.unwrap();
    drop(u);
    let (mut batch, _) = back.wait(far()).await.unwrap();
    let Entry::Queued(mut urgent2) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    assert!(batch.try_shed().is_none(), "within the guard time");
    tokio::time::sleep(SHED_GUARD).await;
    assert!(
        batch.try_shed().is_some(),
        "told once the guard time was over"
    );
    let _back = batch.requeue(Duration::ZERO).ok().unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let granted = tokio::time::timeout(Duration::from_millis(5), urgent2.wait(far())).await;
    assert!(granted.is_ok(), "the urgent request has the slot");
}

/// A request whose answer outlives its connection (a conversation) is never sheddable.
#[tokio::test(start_paused = true)]
async fn a_request_that_keeps_its_slot_is_never_shed() {
    let adm = shedding(1, 8);
    let (mut talk, _) = adm.acquire(c(10).keeping_slot(true), far()).await.unwrap();
    assert_eq!(adm.stats().sheddable, 0);
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    assert!(talk.try_shed().is_none());
    drop(talk);
    assert!(urgent.wait(far()).await.is_ok());
}

/// Handed to the quarantine (llama-server timed out), a request keeps its slots until llama-server
/// lets go: it is sheddable no more.
#[tokio::test(start_paused = true)]
async fn a_request_no_longer_sheddable_is_not_told_to_yield() {
    let adm = shedding(1, 8);
    let (mut stuck, _) = adm.acquire(c(10), far()).await.unwrap();
    assert_eq!(adm.stats().sheddable, 1);
    stuck.no_longer_sheddable();
    assert_eq!(adm.stats().sheddable, 0);
    let Entry::Queued(mut urgent) = adm.enter(c(0), far()).unwrap() else {
        panic!("busy")
    };
    assert!(stuck.try_shed().is_none());
    assert_eq!(adm.stats().yielding, 0);
    drop(stuck);
    assert!(urgent.wait(far()).await.is_ok());
}

#[tokio::test]
async fn cached_prompt_tokens_count_at_the_configured_weight_in_the_tenants_shares() {
    use crate::dialect::usage::Usage;
    // An agent's turn: 9000 prompt tokens, 8000 of them from llama-server's cache, 100 out.
    let turn = Usage {
        prompt_tokens: 9000,
        completion_tokens: 100,
        cached_tokens: 8000,
    };
    for (weight, counted) in [(1.0, 9100.0), (0.1, 1900.0), (0.0, 1100.0)] {
        let fairness = Fairness {
            cached_weight: CachedWeight::new(weight),
            ..Default::default()
        };
        let adm = Admission::with_fairness(1, 4, fairness);
        let (mut slot, _) = adm.acquire(claim("agent", 0, 500), far()).await.unwrap();
        slot.settle_usage(&turn);
        let agent = adm.tenants(4).into_iter().find(|t| t.tenant == "agent");
        assert_eq!(agent.map(|t| t.counter), Some(counted), "weight {weight}");
    }
    assert_eq!(CachedWeight::default().get(), 1.0, "in full unless set");
}
