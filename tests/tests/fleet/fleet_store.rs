//! The fleet bucket script (`sidecar/src/fleet/lease.lua`) against a real Redis 7 and Valkey 8: refill by the
//! store's clock, grants never beyond what the bucket holds (also with several sidecars leasing at
//! once), unused tokens and refunds handed back, debt carried until refilled.

use std::time::Duration;

use slotgate::fleet::{FleetStore, LeaseCall};
use slotgate_tests::redis::RunningRedis;

/// One sync as a new sidecar sync would send it: each call a sequence number of its own.
async fn lease(
    s: &FleetStore,
    key: &str,
    capacity: f64,
    refill: f64,
    want: f64,
    settle: f64,
) -> (f64, f64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(1);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    s.lease(&call(key, capacity, refill, want, settle, "sidecar", seq))
        .await
        .unwrap()
}

#[allow(
    clippy::too_many_arguments,
    reason = "one fixture step names every field"
)]
fn call<'a>(
    bucket: &'a str,
    capacity: f64,
    refill: f64,
    want: f64,
    settle: f64,
    sidecar: &'a str,
    seq: u64,
) -> LeaseCall<'a> {
    LeaseCall {
        bucket,
        capacity,
        refill,
        want,
        settle,
        sidecar,
        seq,
        limits: None,
        expires_ms: 0,
    }
}

async fn store(redis: &RunningRedis) -> FleetStore {
    FleetStore::connect(&redis.url(), "test")
        .await
        .expect("connect to redis")
}

slotgate_tests::on_each_store! {
async fn a_fresh_bucket_grants_up_to_its_capacity_and_refills_by_the_store_clock(server: Store) {
    let redis = RunningRedis::start_on(server);
    let s = store(&redis).await;
    let key = s.bucket_key("token-budget", "tenant-a");
    assert_eq!(
        lease(&s, &key, 1000.0, 100.0, 600.0, 0.0).await,
        (600.0, 400.0)
    );
    let (granted, level) = lease(&s, &key, 1000.0, 100.0, 600.0, 0.0).await;
    assert!(
        (399.0..=401.0).contains(&granted),
        "what was left: {granted}"
    );
    assert!(level.abs() < 1.0, "{level}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // 100 tokens a second for half a second, by the store's clock.
    let (granted, _) = lease(&s, &key, 1000.0, 100.0, 1000.0, 0.0).await;
    assert!((45.0..=70.0).contains(&granted), "refilled {granted}");
}
}

slotgate_tests::on_each_store! {
async fn handing_back_and_debt_are_settled_against_the_bucket(server: Store) {
    let redis = RunningRedis::start_on(server);
    let s = store(&redis).await;
    let key = s.bucket_key("p", "quota");
    // A fixed quota (no refill): everything leased out.
    assert_eq!(
        lease(&s, &key, 1000.0, 0.0, 1000.0, 0.0).await,
        (1000.0, 0.0)
    );
    assert_eq!(lease(&s, &key, 1000.0, 0.0, 10.0, 0.0).await, (0.0, 0.0));
    // 300 unused or refunded tokens handed back.
    assert_eq!(lease(&s, &key, 1000.0, 0.0, 0.0, 300.0).await, (0.0, 300.0));
    // A request that used 500 more than it was charged: the bucket owes 200, grants nothing.
    assert_eq!(
        lease(&s, &key, 1000.0, 0.0, 0.0, -500.0).await,
        (0.0, -200.0)
    );
    assert_eq!(lease(&s, &key, 1000.0, 0.0, 50.0, 0.0).await, (0.0, -200.0));
    // Handing back more than the capacity leaves it full, never fuller.
    assert_eq!(
        lease(&s, &key, 1000.0, 0.0, 0.0, 5000.0).await,
        (0.0, 1000.0)
    );
    // Buckets are separate by key.
    let other = s.bucket_key("p", "other");
    assert_eq!(lease(&s, &other, 10.0, 0.0, 20.0, 0.0).await, (10.0, 0.0));
}
}

slotgate_tests::on_each_store! {
/// Three sidecars lease from one fixed quota at once, each on its own connection, in small random
/// amounts, until it is dry: together they get exactly the quota, never more.
async fn sidecars_leasing_at_once_never_get_more_than_the_bucket_holds(server: Store) {
    let redis = RunningRedis::start_on(server);
    let quota = 10_000.0;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let s = store(&redis).await;
        tasks.push(tokio::spawn(async move {
            let key = s.bucket_key("p", "shared");
            let mut rng = fastrand::Rng::with_seed(i);
            let mut got = 0.0;
            let mut dry = 0;
            while dry < 3 {
                let want = rng.u32(1..200) as f64;
                let (granted, level) = lease(&s, &key, quota, 0.0, want, 0.0).await;
                assert!(
                    granted <= want && level >= 0.0,
                    "{granted} of {want}, level {level}"
                );
                got += granted;
                if granted == 0.0 {
                    dry += 1;
                }
            }
            got
        }));
    }
    let mut total = 0.0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, quota, "the three together");
}
}

slotgate_tests::on_each_store! {
/// A sync sent again with the same sequence number (its answer was lost) is not applied twice: the
/// store answers as the first time and the bucket is where the first left it.
async fn a_sync_sent_twice_is_applied_once(server: Store) {
    let redis = RunningRedis::start_on(server);
    let s = store(&redis).await;
    let key = s.bucket_key("p", "once");
    let first = s
        .lease(&call(&key, 1000.0, 0.0, 300.0, 0.0, "a", 7))
        .await
        .unwrap();
    assert_eq!(first, (300.0, 700.0));
    let again = s
        .lease(&call(&key, 1000.0, 0.0, 300.0, 0.0, "a", 7))
        .await
        .unwrap();
    assert_eq!(again, first, "the first answer, nothing granted twice");
    // Another sidecar's sync with the same number is its own.
    assert_eq!(
        s.lease(&call(&key, 1000.0, 0.0, 100.0, 0.0, "b", 7))
            .await
            .unwrap(),
        (100.0, 600.0)
    );
    // The next sync of the first one applies.
    assert_eq!(
        s.lease(&call(&key, 1000.0, 0.0, 0.0, 50.0, "a", 8))
            .await
            .unwrap(),
        (0.0, 650.0)
    );
}
}
