//! Fleet budgets end to end: several slotgate processes with `--state-backend redis` share one real
//! Redis, and token-budget's buckets are the fleet's, held as leases.

use std::time::{Duration, Instant};

use slotgate_tests::fake_upstream::RunningUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::redis::{connected, wait_connected, RunningRedis};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::eventually;
use slotgate_tests::{assert_error, wat};
use slotgate_tests::{Client, Response};

/// token-budget with a fixed quota: `capacity` tokens for the whole fleet, never refilled.
fn budget(capacity: u64) -> String {
    format!("{{ capacity = {capacity}, refill_per_second = 0 }}")
}

async fn sidecar(redis: &RunningRedis, settings: &str) -> (RunningUpstream, RunningGate) {
    let gate = Gate::new()
        .slots(4)
        .policies(&[(&wat::built("token-budget"), Some(settings))])
        .opt("--state-fleet", "model-a");
    let (up, gate) = redis.backend_for(gate).start_instant().await;
    wait_connected(&gate).await;
    (up, gate)
}

/// A request charged 100 tokens plus its prompt estimate, and reported as having used exactly that
/// (no prompt count from the fake: token-budget settles the prompt at its estimate), so nothing is
/// refunded and each admitted request spends its charge for good.
fn spending(tag: &str) -> Req {
    Req::chat(tag)
        .set("max_tokens", 100)
        .prompt_tokens(0)
        .completion_tokens(100)
}

/// [`spending`] as `tenant` (its API key), tagged `tag`.
async fn spend_as(client: &Client, tenant: &str, tag: &str) -> Response {
    client
        .post_json_with_headers(
            CHAT,
            &spending(tag).json(),
            &[("authorization", format!("Bearer {tenant}"))],
        )
        .await
}

/// Sends to the sidecars in turn until all of them have refused for longer than an idle lease is
/// kept (its tokens then go back to the fleet bucket for the others); returns the requests served.
async fn spend_all(gates: &[&RunningGate], tenant: &str) -> usize {
    let mut served = 0;
    let mut refused_since: Option<Instant> = None;
    let mut i = 0;
    loop {
        let gate = gates[i % gates.len()];
        i += 1;
        let resp = spend_as(&gate.client(), tenant, &format!("{tenant}-{i}")).await;
        match resp.status.as_u16() {
            200 => {
                served += 1;
                refused_since = None;
            }
            429 => {
                assert_error(&resp, 429, "policy_denied");
                let since = *refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(7) {
                    return served;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("unexpected {other}: {}", resp.body),
        }
        assert!(i < 10_000, "never ran dry");
    }
}

slotgate_tests::on_each_store! {
/// Three sidecars, one tenant, a fleet budget of 3000 tokens (each request spends about 101): the
/// fleet admits no more than the budget, where three in-memory budgets would admit three times as
/// much, and refuses nothing while the budget remains (all but what is left in the last leases, less
/// than one request's worth per sidecar).
async fn three_sidecars_share_one_budget(store: Store) {
    let redis = RunningRedis::start_on(store);
    let settings = budget(3000);
    let (up1, g1) = sidecar(&redis, &settings).await;
    let (up2, g2) = sidecar(&redis, &settings).await;
    let (up3, g3) = sidecar(&redis, &settings).await;
    let served = spend_all(&[&g1, &g2, &g3], "tenant-a").await;
    assert!(
        served <= 30,
        "the fleet admitted {served} requests of ~101 tokens on a 3000 budget"
    );
    assert!(
        served >= 27,
        "only {served} admitted: refused while the budget remained"
    );
    // Each request reached its own sidecar's upstream once.
    let forwarded = up1.tags().len() + up2.tags().len() + up3.tags().len();
    assert_eq!(forwarded, served);
    for (gate, up) in [(&g1, &up1), (&g2, &up2), (&g3, &up3)] {
        gate.assert_settled(up, 4).await;
    }
}
}

/// Two tenants on two sidecars: one spends its fleet budget dry, the other is still served on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenant_running_dry_leaves_the_other_served() {
    let redis = RunningRedis::start();
    let settings = budget(1000);
    let (up1, g1) = sidecar(&redis, &settings).await;
    let (up2, g2) = sidecar(&redis, &settings).await;
    let served = spend_all(&[&g1, &g2], "greedy").await;
    assert!((8..=10).contains(&served), "{served}");
    for gate in [&g1, &g2] {
        let resp = spend_as(&gate.client(), "modest", "other").await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    for (gate, up) in [(&g1, &up1), (&g2, &up2)] {
        gate.assert_settled(up, 4).await;
    }
}

/// Sends `n` spending requests from `tenant` to the sidecars in turn; every one must be served
/// (the budget is ample): returns the slowest.
async fn all_served(gates: &[&RunningGate], tenant: &str, n: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let gate = gates[i % gates.len()];
        let t0 = Instant::now();
        let resp = spend_as(&gate.client(), tenant, &format!("{tenant}-{i}")).await;
        slowest = slowest.max(t0.elapsed());
        assert_eq!(resp.status, 200, "request {i}: {}", resp.body);
    }
    slowest
}

slotgate_tests::on_each_store! {
/// The store is SIGKILLed under load: every request is still served (the default failure mode,
/// `local-share`, with an ample budget), none gets a 5xx, `/readyz` stays ready, and the outage is
/// reported. A fresh store on the same socket: both sidecars reconnect within 2 seconds and enforce
/// fleet budgets again (a small tenant's 1000 tokens are spent once between them).
async fn a_killed_store_costs_no_request_and_is_reconnected(store: Store) {
    let mut redis = RunningRedis::start_on(store);
    // Ample for everyone, except the tenant "small": 1000 tokens for the fleet.
    let settings = format!(
        "{{ capacity = 10000000, refill_per_second = 0, tenants = {{ \"{}\" = {{ capacity = 1000, refill_per_second = 0 }} }} }}",
        slotgate_tests::gate::hash_key("small")
    );
    let (up1, g1) = sidecar(&redis, &settings).await;
    let (up2, g2) = sidecar(&redis, &settings).await;
    all_served(&[&g1, &g2], "before", 20).await;
    // Killed under load: four clients keep sending to both sidecars meanwhile.
    let load: Vec<_> = (0..4)
        .map(|c| {
            let clients = [g1.client(), g2.client()];
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for i in 0..30 {
                    let resp = spend_as(&clients[i % 2], "steady", &format!("load-{c}-{i}")).await;
                    statuses.push((resp.status.as_u16(), resp.body));
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.kill9();
    for task in load {
        for (status, body) in task.await.unwrap() {
            assert_eq!(status, 200, "under load while the store died: {body}");
        }
    }
    all_served(&[&g1, &g2], "during", 40).await;
    for gate in [&g1, &g2] {
        eventually(Duration::from_secs(5), "the outage reported", || async {
            let m = gate.metrics().await;
            (!connected(gate).await && m.value_or_zero("slotgate_state_up", &[]) == 0.0)
                .then_some(())
        })
        .await;
        assert_eq!(
            gate.readyz().await,
            200,
            "a store outage is not a model outage"
        );
    }
    all_served(&[&g1, &g2], "still", 20).await;
    redis.restart();
    let back = Instant::now();
    for gate in [&g1, &g2] {
        eventually(Duration::from_secs(5), "reconnected", || async {
            connected(gate).await.then_some(())
        })
        .await;
    }
    assert!(
        back.elapsed() < Duration::from_secs(2) + Duration::from_millis(500),
        "reconnected after {:?}",
        back.elapsed()
    );
    // Enforced again, fleet-wide, by the same two sidecars.
    let served = spend_all(&[&g1, &g2], "small").await;
    assert!((8..=10).contains(&served), "{served}");
    for (gate, up) in [(&g1, &up1), (&g2, &up2)] {
        gate.assert_settled(up, 4).await;
    }
}
}

/// The store is paused (SIGSTOP: connections stay open and nothing answers). Requests are served
/// as if it were gone, none waiting for it beyond the fetch timeout (a request that waited for the
/// store would take a second or more here); when it resumes, the sidecars find it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_store_holds_up_no_request() {
    let redis = RunningRedis::start();
    let settings = budget(10_000_000);
    let (up1, g1) = sidecar(&redis, &settings).await;
    let (up2, g2) = sidecar(&redis, &settings).await;
    all_served(&[&g1, &g2], "steady", 10).await;
    redis.pause();
    // New tenants too: their first take has no lease and must try the store.
    let mut slowest = Duration::ZERO;
    for t in 0..10 {
        slowest = slowest.max(all_served(&[&g1, &g2], &format!("new-{t}"), 4).await);
    }
    assert!(
        slowest < Duration::from_millis(800),
        "a request waited {slowest:?} with the store paused"
    );
    redis.resume();
    for gate in [&g1, &g2] {
        eventually(Duration::from_secs(5), "the store found again", || async {
            connected(gate).await.then_some(())
        })
        .await;
    }
    all_served(&[&g1, &g2], "resumed", 10).await;
    for (gate, up) in [(&g1, &up1), (&g2, &up2)] {
        gate.assert_settled(up, 4).await;
    }
}

slotgate_tests::on_each_store! {
/// Refunds from real usage reach the fleet bucket. One sidecar serves a request charged ~600 of a
/// 1000-token fleet budget; while it is in flight the other sidecar must refuse another 600 (the
/// budget is one: on its own it would have 1000). The first used only 15 tokens; token-budget's
/// `on_complete` gives the rest back, to the fleet, and the other sidecar's 600 then gets in.
async fn refunds_from_real_usage_reach_the_fleet_bucket(store: Store) {
    let redis = RunningRedis::start_on(store);
    let settings = budget(1000);
    let (up1, g1) = sidecar(&redis, &settings).await;
    let (up2, g2) = sidecar(&redis, &settings).await;
    let big = |tag: &str| {
        Req::chat(tag)
            .set("max_tokens", 600)
            .prompt_tokens(10)
            .completion_tokens(5)
    };
    let first = slotgate_tests::spawn_post(
        &g1.client(),
        CHAT,
        &big("first").delay(Duration::from_secs(1)),
    );
    eventually(
        Duration::from_secs(5),
        "the first request in flight",
        || async { (up1.tags() == ["first"]).then_some(()) },
    )
    .await;
    let resp = g2.client().post_json(CHAT, &big("second").json()).await;
    assert_error(&resp, 429, "policy_denied");
    let (resp, _) = first.await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    let resp = slotgate_tests::budget::send_until_refunded(
        &g2.client(),
        &big("second").json(),
        "the refund never reached the other sidecar",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(up1.tags(), ["first"]);
    assert_eq!(up2.tags(), ["second"]);
    for (gate, up) in [(&g1, &up1), (&g2, &up2)] {
        gate.assert_settled(up, 4).await;
    }
}
}

/// A policy that counts every request in a one-minute window (`window_add`) and refuses once the
/// count is over 5.
fn window_policy(dir: &std::path::Path) -> std::path::PathBuf {
    let deny = r#"{"verdict":"deny","status":429,"message":"window full"}"#;
    let allow = r#"{"verdict":"allow"}"#;
    let evaluate = format!(
        "(if (i64.gt_s (call $add (i32.const 64) (i32.const 5) (i64.const 60000) (i64.const 1)) (i64.const 5))
      (then (return (i64.or (i64.shl (i64.const 128) (i64.const 32)) (i64.const {})))))",
        deny.len()
    );
    let data = format!(
        r#"(data (i32.const 64) "calls")
  (data (i32.const 128) "{}")"#,
        deny.replace('"', "\\\"")
    );
    wat::policy_with(dir, "window", 1, wat::WINDOW_ADD, allow, &evaluate, &data)
}

slotgate_tests::on_each_store! {
/// Sliding windows are the fleet's too: two sidecars count into one window, and together they allow
/// 5 requests a minute, not 5 each. Adds are pushed every 100 ms, so requests 250 ms apart see each
/// other's.
async fn two_sidecars_count_into_one_window(store: Store) {
    let redis = RunningRedis::start_on(store);
    let dir = slotgate_tests::unique_dir("fleet-window");
    let policy = window_policy(&dir);
    let mut gates = Vec::new();
    for _ in 0..2 {
        let (up, gate) = redis
            .backend_for(Gate::new().slots(4).policies(&[(&policy, None)]))
            .start_instant()
            .await;
        wait_connected(&gate).await;
        gates.push((up, gate));
    }
    // The canary evaluation at load counts in scratch state, not in the fleet window.
    let mut allowed = 0;
    for i in 0..10 {
        let (_, gate) = &gates[i % 2];
        let resp = gate
            .client()
            .post_chat(&Req::chat(&format!("w{i}")))
            .await;
        match resp.status.as_u16() {
            200 => allowed += 1,
            429 => {
                assert_error(&resp, 429, "policy_denied");
            }
            other => panic!("unexpected {other}: {}", resp.body),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(allowed, 5, "the two sidecars share one window of 5");
    for (up, gate) in &gates {
        gate.assert_settled(up, 4).await;
    }
}
}

/// The operator's lease settings hold: with `--state-lease-max-share 0.02` a busy tenant's lease
/// never holds more than 2 % of the capacity (the default tenth would be 1000 tokens at this rate),
/// and with `--state-lease-idle 300ms` it goes back well before the default 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lease_settings_bound_what_a_sidecar_holds_and_for_how_long() {
    let redis = RunningRedis::start();
    let gate = Gate::new()
        .slots(4)
        .policies(&[(&wat::built("token-budget"), Some(&budget(10_000)))])
        .opt("--state-fleet", "model-a")
        .opt("--state-lease-max-share", "0.02")
        .opt("--state-lease-idle", "300ms")
        .opt("--state-fetch-timeout", "20ms");
    let (up, gate) = redis.backend_for(gate).start_instant().await;
    wait_connected(&gate).await;
    let status = gate.status().await;
    assert_eq!(status["state"]["fetch_timeout_ms"], 20.0, "{status}");
    assert_eq!(status["state"]["lease"]["max_share"], 0.02, "{status}");
    assert_eq!(status["state"]["lease"]["idle_ms"], 300, "{status}");

    let client = gate.client();
    let mut most_held = 0.0f64;
    for i in 0..40 {
        let resp = spend_as(&client, "tenant-a", &format!("busy-{i}")).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        let held = gate.status().await["state"]["tokens_held"]
            .as_f64()
            .expect("tokens_held");
        most_held = most_held.max(held);
    }
    // 2 % of 10,000, or one request's charge when that is more (a take is never split).
    assert!(
        most_held > 0.0 && most_held <= 200.0,
        "the lease held up to {most_held} tokens"
    );
    let gone = Instant::now();
    eventually(
        Duration::from_secs(3),
        "the idle lease went back to the fleet bucket",
        || async {
            let s = gate.status().await;
            (s["state"]["tokens_held"] == 0.0 && s["state"]["leases"] == 0).then_some(())
        },
    )
    .await;
    assert!(gone.elapsed() < Duration::from_secs(3));
    gate.assert_settled(&up, 4).await;
}

/// `rediss://`: two sidecars that trust the store's CA share one budget over TLS; one that does not
/// trust it never connects (the certificate is checked) and follows its failure mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_over_tls_is_verified_and_shared() {
    let redis = RunningRedis::start_tls();
    let over_tls = |ca: &std::path::Path| {
        Gate::new()
            .slots(4)
            .policies(&[(&wat::built("token-budget"), Some(&budget(1000)))])
            .opt("--state-fleet", "model-a")
            .opt("--state-backend", "redis")
            .opt("--state-redis-url", redis.tls_url())
            .opt("--state-on-unavailable", "deny")
            .env("SSL_CERT_FILE", ca.to_str().unwrap())
    };
    let (up1, g1) = over_tls(&redis.ca_file()).start_instant().await;
    let (up2, g2) = over_tls(&redis.ca_file()).start_instant().await;
    wait_connected(&g1).await;
    wait_connected(&g2).await;
    let served = spend_all(&[&g1, &g2], "tenant-a").await;
    assert!(
        (8..=10).contains(&served),
        "{served} of ~101 tokens on 1000"
    );

    // A CA of its own, not the store's: the handshake fails and budgets follow `deny`.
    let other = slotgate_tests::wait::unique_dir("other-ca");
    let other_ca = slotgate_tests::redis::make_certificates(&other);
    let (up3, g3) = over_tls(&other_ca).start_instant().await;
    eventually(
        Duration::from_secs(5),
        "a failed TLS connect is counted",
        || async {
            let n = g3
                .metric("slotgate_state_errors_total", &[("kind", "connect")])
                .await
                .unwrap_or(0.0);
            (n >= 1.0).then_some(())
        },
    )
    .await;
    assert!(
        !connected(&g3).await,
        "connected to a store it cannot verify"
    );
    let resp = spend_as(&g3.client(), "tenant-b", "untrusted").await;
    assert_error(&resp, 429, "policy_denied");
    for (gate, up) in [(&g1, &up1), (&g2, &up2), (&g3, &up3)] {
        gate.assert_settled(up, 4).await;
    }
}
