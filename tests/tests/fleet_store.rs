//! The fleet bucket script (`sidecar/src/fleet/lease.lua`) against a real Redis 7: refill by the
//! store's clock, grants never beyond what the bucket holds (also with several sidecars leasing at
//! once), unused tokens and refunds handed back, debt carried until refilled.

use std::time::Duration;

use slotgate::fleet::FleetStore;
use slotgate_tests::redis::RunningRedis;

async fn store(redis: &RunningRedis) -> FleetStore {
    FleetStore::connect(&redis.url(), "test")
        .await
        .expect("connect to redis")
}

#[tokio::test]
async fn a_fresh_bucket_grants_up_to_its_capacity_and_refills_by_the_store_clock() {
    let redis = RunningRedis::start();
    let s = store(&redis).await;
    let key = s.bucket_key("token-budget", "tenant-a");
    assert_eq!(
        s.lease(&key, 1000.0, 100.0, 600.0, 0.0).await.unwrap(),
        (600.0, 400.0)
    );
    let (granted, level) = s.lease(&key, 1000.0, 100.0, 600.0, 0.0).await.unwrap();
    assert!(
        (399.0..=401.0).contains(&granted),
        "what was left: {granted}"
    );
    assert!(level.abs() < 1.0, "{level}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // 100 tokens a second for half a second, by the store's clock.
    let (granted, _) = s.lease(&key, 1000.0, 100.0, 1000.0, 0.0).await.unwrap();
    assert!((45.0..=70.0).contains(&granted), "refilled {granted}");
}

#[tokio::test]
async fn handing_back_and_debt_are_settled_against_the_bucket() {
    let redis = RunningRedis::start();
    let s = store(&redis).await;
    let key = s.bucket_key("p", "quota");
    // A fixed quota (no refill): everything leased out.
    assert_eq!(
        s.lease(&key, 1000.0, 0.0, 1000.0, 0.0).await.unwrap(),
        (1000.0, 0.0)
    );
    assert_eq!(
        s.lease(&key, 1000.0, 0.0, 10.0, 0.0).await.unwrap(),
        (0.0, 0.0)
    );
    // 300 unused or refunded tokens handed back.
    assert_eq!(
        s.lease(&key, 1000.0, 0.0, 0.0, 300.0).await.unwrap(),
        (0.0, 300.0)
    );
    // A request that used 500 more than it was charged: the bucket owes 200, grants nothing.
    assert_eq!(
        s.lease(&key, 1000.0, 0.0, 0.0, -500.0).await.unwrap(),
        (0.0, -200.0)
    );
    assert_eq!(
        s.lease(&key, 1000.0, 0.0, 50.0, 0.0).await.unwrap(),
        (0.0, -200.0)
    );
    // Handing back more than the capacity leaves it full, never fuller.
    assert_eq!(
        s.lease(&key, 1000.0, 0.0, 0.0, 5000.0).await.unwrap(),
        (0.0, 1000.0)
    );
    // Buckets are separate by key.
    let other = s.bucket_key("p", "other");
    assert_eq!(
        s.lease(&other, 10.0, 0.0, 20.0, 0.0).await.unwrap(),
        (10.0, 0.0)
    );
}

/// Three sidecars lease from one fixed quota at once, each on its own connection, in small random
/// amounts, until it is dry: together they get exactly the quota, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn sidecars_leasing_at_once_never_get_more_than_the_bucket_holds() {
    let redis = RunningRedis::start();
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
                let (granted, level) = s.lease(&key, quota, 0.0, want, 0.0).await.unwrap();
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
