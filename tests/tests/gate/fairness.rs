//! Fair queuing between tenants (README "Fairness"): within a priority level the slot goes to the
//! tenant served the fewest tokens, so a flood by one tenant delays another by about one request; equal
//! demand gets equal tokens whatever the request sizes; a weight-2 tenant gets twice the tokens; one
//! tenant may hold only its share of the queue; and aging lets a low priority through a busy stream.
//!
//! Tenants are API keys (`Authorization: Bearer ...`). The timed scenarios run one at a time: they
//! measure waits on a 2-core machine.

use std::time::{Duration, Instant};

use slotgate_tests::gate::hash_key;
use slotgate_tests::*;

/// Scheduling slack allowed on top of a bound: process hops, timers and a busy 2-core machine.
const MARGIN_MS: u64 = 150;

/// The nearest-rank 95th percentile.
fn p95(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = (0.95 * v.len() as f64).ceil() as usize;
    v[rank.max(1) - 1]
}

/// Jain's fairness index: 1 when every share is equal, 1/n when one takes everything.
fn jain(shares: &[f64]) -> f64 {
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|x| x * x).sum();
    sum * sum / (shares.len() as f64 * squares)
}

/// Tokens served by one answer, as the fake's `usage` reports them and slotgate settles them:
/// prompt + completion.
fn tokens(resp: &Response) -> u64 {
    let usage = &resp.json()["usage"];
    let count = |k: &str| {
        usage[k]
            .as_u64()
            .unwrap_or_else(|| panic!("no usage.{k} in {}", resp.body))
    };
    count("prompt_tokens") + count("completion_tokens")
}

/// Keeps `outstanding` copies of `req` in flight until `until`, each sent as soon as the previous one
/// of its lane has answered. Returns (tokens, when answered) of every response.
async fn keep_busy(
    client: &Client,
    req: Req,
    outstanding: usize,
    until: Instant,
) -> Vec<(u64, Instant)> {
    let lanes: Vec<_> = (0..outstanding)
        .enumerate()
        .map(|(lane, _)| {
            let (client, req) = (client.clone(), req.clone());
            tokio::spawn(async move {
                let mut served = Vec::new();
                let tag = req.json()["fake_tag"].as_str().unwrap_or("").to_owned();
                while Instant::now() < until {
                    // A tag of its own per request: the closing check finds anything forwarded twice.
                    let req = req
                        .clone()
                        .set("fake_tag", format!("{tag}-{lane}-{}", served.len()));
                    let (resp, _) = spawn_post(&client, CHAT, &req).await.unwrap();
                    assert_eq!(resp.status, 200, "{}", resp.body);
                    served.push((tokens(&resp), Instant::now()));
                }
                served
            })
        })
        .collect();
    join_all(lanes).await.into_iter().flatten().collect()
}

/// Tokens answered before `end`.
fn tokens_before(served: &[(u64, Instant)], end: Instant) -> f64 {
    served
        .iter()
        .filter(|(_, at)| *at <= end)
        .map(|(n, _)| *n as f64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flooding_tenant_delays_another_by_one_of_its_requests_at_most() {
    let _timing = slotgate_tests::wait::timing().await;
    const SERVICE_MS: u64 = 200;
    let (up, gate) = Gate::one_slot(32)
        // The share limit is a separate guard; this measures the scheduler alone.
        .opt("--tenant-queue-share", "1.0")
        .start_instant()
        .await;
    let client = gate.client();

    let flood: Vec<_> = (0..20)
        .map(|i| {
            let req = Req::chat(&format!("a{i}"))
                .api_key("key-a")
                .delay(ms(SERVICE_MS));
            spawn_post(&client, CHAT, &req)
        })
        .collect();
    let st = gate
        .wait_status(Duration::from_secs(3), "A's flood queued", |s| {
            s["queue"]["depth"].as_u64() >= Some(15)
        })
        .await;
    let (a_hash, b_hash) = (hash_key("key-a"), hash_key("key-b"));
    let listed = &st["fairness"]["tenants"];
    assert_eq!(listed[0]["tenant"], a_hash.as_str(), "{st}");
    assert_eq!(listed[0]["waiting"], st["queue"]["depth"], "{st}");
    assert_eq!(listed[0]["in_service"], 1, "{st}");

    // B sends one request a second while A's flood is queued.
    let start = Instant::now();
    let mut b_waits = Vec::new();
    for i in 0..4u32 {
        tokio::time::sleep_until((start + Duration::from_millis(100) + i * ms(1000)).into()).await;
        let req = Req::chat(&format!("b{i}")).api_key("key-b").delay(ms(20));
        let (resp, _) = spawn_post(&client, CHAT, &req).await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.body);
        b_waits.push(queue_wait_ms(&resp));
    }
    let mut a_waits = Vec::new();
    for (resp, _) in join_all(flood).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
        a_waits.push(queue_wait_ms(&resp));
    }
    let p95_b = p95(&b_waits);
    eprintln!(
        "flood: B's queue waits {b_waits:?} ms, p95 {p95_b} ms; A's service time {SERVICE_MS} ms; \
         A's waits p95 {} ms, max {} ms",
        p95(&a_waits),
        a_waits.iter().max().unwrap()
    );
    assert!(
        p95_b <= SERVICE_MS + MARGIN_MS,
        "B waited {b_waits:?} ms behind A's {SERVICE_MS} ms requests"
    );
    let tags = up.tags();
    let last_b = tags.iter().position(|t| t == "b3").unwrap();
    assert!(
        tags[last_b + 1..].iter().any(|t| t.starts_with('a')),
        "A's flood must still have been queued when B's last request came: {tags:?}"
    );
    gate.assert_settled(&up, 1).await;

    // Each tenant's settled tokens: the fake reports 10 prompt + 5 completion tokens per answer.
    gate.wait_metric(
        "slotgate_tenant_tokens_total",
        &[("tenant", a_hash.as_str())],
        20.0 * 15.0,
    )
    .await;
    gate.wait_metric(
        "slotgate_tenant_tokens_total",
        &[("tenant", b_hash.as_str())],
        4.0 * 15.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn equal_demand_gets_equal_tokens_whatever_the_request_size() {
    let _timing = slotgate_tests::wait::timing().await;
    let (up, gate) = Gate::one_slot(16).start_instant().await;
    let client = gate.client();

    // Three tenants, two requests outstanding each, answers of 10 prompt + 20, 50 and 100 completion
    // tokens, taking 2 ms a completion token. No max_tokens: each request is charged the default
    // estimate and settled to its real usage.
    let window = Duration::from_secs(4);
    let end = Instant::now() + window;
    let tenants = [("key-x", 20u64), ("key-y", 50), ("key-z", 100)];
    let runs: Vec<_> = tenants
        .iter()
        .map(|&(key, tokens)| {
            let req = Req::chat(key)
                .api_key(key)
                .completion_tokens(tokens)
                .delay(ms(2 * tokens));
            let client = client.clone();
            tokio::spawn(async move { keep_busy(&client, req, 2, end).await })
        })
        .collect();
    let served: Vec<f64> = join_all(runs)
        .await
        .iter()
        .map(|s| tokens_before(s, end))
        .collect();
    let index = jain(&served);
    eprintln!(
        "equal demand over {window:?}: tokens served per tenant (30/60/110-token answers) {served:?}, \
         Jain's index {index:.3}"
    );
    assert!(index >= 0.95, "Jain's index {index:.3} over {served:?}");
    gate.assert_settled(&up, 1).await;
}

/// (tenant, waiting) of every tenant /status lists.
fn waiting_by_tenant(st: &serde_json::Value) -> Vec<(String, u64)> {
    st["fairness"]["tenants"]
        .as_array()
        .expect("fairness.tenants")
        .iter()
        .map(|t| {
            let name = t["tenant"].as_str().unwrap().to_owned();
            (name, t["waiting"].as_u64().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_over_its_queue_share_is_refused_while_others_queue() {
    // Queue of 4, default share 0.5: beside another tenant, one tenant may hold 2 waiters.
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let a = |tag: &str| Req::chat(tag).api_key("key-a");
    let b = |tag: &str| Req::chat(tag).api_key("key-b");

    let hold = gate.hold_slot(&b("hold").delay(ms(600))).await;
    let a1 = gate.enqueue(&a("a1")).await;
    let a2 = gate.enqueue(&a("a2")).await;
    let (over, took) = spawn_post(&gate.client(), CHAT, &a("a3")).await.unwrap();
    assert_error(&over, 429, "tenant_queue_full");
    assert!(retry_after(&over) >= 1);
    assert!(took < Duration::from_secs(1), "the refusal took {took:?}");

    let b1 = gate.enqueue(&b("b1")).await;
    let st = gate.status().await;
    assert_eq!(st["queue"]["tenant_limit"], 2, "{st}");
    let waiting = waiting_by_tenant(&st);
    assert!(waiting.contains(&(hash_key("key-a"), 2)), "{st}");
    assert!(waiting.contains(&(hash_key("key-b"), 1)), "{st}");

    for (resp, _) in join_all(vec![hold, a1, a2, b1]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    // B has been served one request (15 tokens), A none: A's first goes first. Then both have been
    // served 15 tokens, and arrival order decides.
    assert_eq!(up.tags(), ["hold", "a1", "a2", "b1"]);
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("tenant_queue_full", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn alone_a_tenant_may_fill_the_queue_until_another_needs_a_place() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let a = |tag: &str| Req::chat(tag).api_key("key-a");

    let mut handles = vec![gate.hold_slot(&a("hold").delay(ms(600))).await];
    for i in 1..=4 {
        handles.push(gate.enqueue(&a(&format!("a{i}"))).await);
    }
    // B's arrival on the full queue takes A's newest place: A is beyond its share of 2.
    let b1 = spawn_post(&gate.client(), CHAT, &Req::chat("b1").api_key("key-b"));
    let (over, _) = tokio::time::timeout(Duration::from_secs(1), handles.pop().unwrap())
        .await
        .expect("A's newest waiter must be answered at once")
        .unwrap();
    assert_error(&over, 429, "tenant_queue_full");
    assert!(retry_after(&over) >= 1);
    gate.wait_queue_depth(4).await;
    let (again, _) = spawn_post(&gate.client(), CHAT, &a("a5")).await.unwrap();
    assert_error(&again, 429, "tenant_queue_full");

    handles.push(b1);
    for (resp, _) in join_all(handles).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.tags(), ["hold", "b1", "a1", "a2", "a3"]);
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("tenant_queue_full", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_weight_2_tenant_gets_twice_the_tokens() {
    let _timing = slotgate_tests::wait::timing().await;
    let dir = unique_dir("fair-weight");
    // Requests whose model is WEIGHT2 are given weight 2; everything else is allowed as it is.
    let decision = br#"{"verdict":"allow","weight":2}"#;
    let answer = wat::output(1024, decision.len() as u32);
    let policy = wat::on_markers(
        &dir,
        "weights",
        &[("WEIGHT2", answer.as_str())],
        &wat::data(1024, decision),
    );
    let (up, gate) = Gate::one_slot(16)
        .arg("--policy")
        .arg(&policy.display().to_string())
        .start_instant()
        .await;
    let client = gate.client();

    let end = Instant::now() + Duration::from_secs(3);
    let req = |key: &str| {
        Req::chat(key)
            .api_key(key)
            .completion_tokens(20)
            .delay(ms(40))
    };
    let heavy = tokio::spawn({
        let (client, req) = (client.clone(), req("key-heavy").set("model", "WEIGHT2"));
        async move { keep_busy(&client, req, 2, end).await }
    });
    let light = keep_busy(&client, req("key-light"), 2, end).await;
    let heavy = heavy.await.unwrap();
    let (h, l) = (tokens_before(&heavy, end), tokens_before(&light, end));
    let ratio = h / l;
    eprintln!("weights: weight 2 served {h} tokens, weight 1 served {l}: ratio {ratio:.2}");
    assert!((1.6..=2.5).contains(&ratio), "ratio {ratio:.2} ({h} / {l})");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aging_lets_a_low_priority_request_through_a_stream_of_urgent_ones() {
    let _timing = slotgate_tests::wait::timing().await;
    const AGING_MS: u64 = 500;
    const SERVICE_MS: u64 = 150;
    let (up, gate) = Gate::one_slot(8)
        .trust_client_priority()
        .opt("--priority-aging", format!("{AGING_MS}ms"))
        .start_instant()
        .await;
    let client = gate.client();

    // Three clients keep priority-0 requests coming for 3 s: one in service, two waiting.
    let end = Instant::now() + Duration::from_secs(3);
    let urgent = Req::chat("urgent")
        .api_key("key-urgent")
        .priority(0)
        .delay(ms(SERVICE_MS));
    let stream = tokio::spawn({
        let client = client.clone();
        async move { keep_busy(&client, urgent, 3, end).await }
    });
    tokio::time::sleep(ms(300)).await;
    let low = Req::chat("low")
        .api_key("key-low")
        .priority(2)
        .delay(ms(20));
    let (resp, _) = spawn_post(&client, CHAT, &low).await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    let waited = queue_wait_ms(&resp);
    stream.await.unwrap();

    // Priority 2 is never overtaken by a priority-0 request that arrives (2 - 0 + 1) agings after
    // it; before that, at most the requests already queued (two) and the one in service go first.
    let bound = 3 * AGING_MS + 3 * SERVICE_MS;
    eprintln!("aging: priority 2 behind a priority-0 stream waited {waited} ms (bound {bound} ms)");
    assert!(
        waited <= bound + MARGIN_MS,
        "waited {waited} ms; bound {bound} ms"
    );
    let tags = up.tags();
    let low_at = tags.iter().position(|t| t == "low").unwrap();
    assert!(
        tags[low_at + 1..].iter().any(|t| t.starts_with("urgent")),
        "the stream must have gone on after the low request: {tags:?}"
    );
    gate.assert_settled(&up, 1).await;
}
