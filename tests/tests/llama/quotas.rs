//! Calendar quotas end to end (docs/quotas.md): the `quota` example policy in front of a real
//! llama-server, with the real SDKs.
//!
//! - The OpenAI and Anthropic SDKs read the allowance from their raw-response accessors, each in
//!   its API's names, and raise a `quota_exceeded` refusal at once instead of retrying it.
//! - A day ends on a clock the test sets (slotgate under libfaketime, seconds before midnight in
//!   Tokyo): the quota is refused until exactly that midnight, as the refusal says, then whole.
//! - A SIGKILL while a burst is in llama-server's slots: after a restart no tenant has more left
//!   than it had before the kill.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use slotgate_tests::gate::{free_port, Gate};
use slotgate_tests::llama::{chat, LlamaServer, PROMPT};
use slotgate_tests::python::{arg, driver, python, Attempt};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::*;

#[derive(serde::Deserialize, Debug)]
struct Calls {
    calls: Vec<Value>,
    attempts: Vec<Attempt>,
}

/// Three requests a day per tenant.
const THREE_A_DAY: &str = "{ period = \"day\", requests = 3, tokens = 1000000 }";

/// The response headers `sdk` (`openai` or `anthropic`) reads the request allowance from: the limit
/// and what is left of it.
fn allowance_headers(sdk: &str) -> (&'static str, &'static str) {
    match sdk {
        "openai" => (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
        ),
        _ => (
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
        ),
    }
}

/// Five calls through `quota_calls.py` with `sdk` and `key`, the SDK's retries on, against the
/// [`THREE_A_DAY`] quota: three answers, each with the allowance in its headers (and whatever `more`
/// checks of them), then one refusal that the SDK sent once and raised as a `RateLimitError`, which
/// is returned.
async fn spend_three(
    base_url: String,
    key: &str,
    sdk: &str,
    more: impl Fn(&Value, &Value),
) -> Value {
    let run: Calls = driver(
        "quota_calls.py",
        &[
            arg("--base-url"),
            arg(base_url),
            arg("--api-key"),
            arg(key),
            arg(sdk),
            arg("--calls"),
            arg(5),
        ],
    )
    .await;
    let (limit, remaining) = allowance_headers(sdk);
    assert_eq!(run.calls.len(), 4, "{:#?}", run.calls);
    for (i, c) in run.calls[..3].iter().enumerate() {
        assert_eq!(c["status"], 200, "{c}");
        let h = &c["headers"];
        assert_eq!(h[limit], "3", "{c}");
        assert_eq!(h[remaining], (2 - i).to_string(), "{c}");
        more(h, c);
    }
    let refused = &run.calls[3];
    assert_eq!(refused["status"], 429, "{refused}");
    assert_eq!(refused["exception"], "RateLimitError", "{refused}");
    let refusals = run
        .attempts
        .iter()
        .filter(|a| a.status == Some(429))
        .count();
    assert_eq!(
        refusals, 1,
        "the SDK retried a spent quota: {:#?}",
        run.attempts
    );
    refused.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sdks_read_the_allowance_and_do_not_retry_a_spent_quota() {
    python();
    let _serial = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    let port = free_port();
    let gate = Gate::new()
        .listen(format!("tcp:127.0.0.1:{port}"))
        .upstream_path(llama.socket())
        .policies(&[(&wat::built("quota"), Some(THREE_A_DAY))])
        .start()
        .await;

    // The OpenAI SDK, its default two retries on: three answers, then a refusal sent once.
    let openai = format!("http://127.0.0.1:{port}/v1");
    let refused = spend_three(openai, "sk-openai-tenant", "openai", |h, c| {
        assert!(
            h["x-ratelimit-reset-requests"]
                .as_str()
                .unwrap()
                .ends_with('s'),
            "{c}"
        );
        assert!(h["x-ratelimit-remaining-tokens"].as_str().is_some(), "{c}");
    })
    .await;
    assert_eq!(refused["body"]["code"], "quota_exceeded", "{refused}");
    assert_eq!(refused["headers"]["x-should-retry"], "false", "{refused}");

    // The Anthropic SDK on the Messages API, another tenant (its own key): Anthropic's names.
    let anthropic = format!("http://127.0.0.1:{port}");
    let refused = spend_three(anthropic, "sk-ant-tenant", "anthropic", |h, c| {
        let reset = h["anthropic-ratelimit-requests-reset"].as_str().unwrap();
        let reset: jiff::Timestamp = reset.parse().unwrap_or_else(|e| panic!("{reset}: {e}"));
        assert_eq!(reset.as_second() % 86_400, 0, "a UTC midnight: {c}");
        assert!(h.get("x-ratelimit-limit-requests").is_none(), "{c}");
    })
    .await;
    assert_eq!(
        refused["body"]["error"]["type"], "rate_limit_error",
        "{refused}"
    );

    gate.wait_outcome("policy_denied", 2).await;
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// The LD_PRELOAD library of libfaketime, from its wheel in the Python clients' venv.
fn libfaketime() -> PathBuf {
    slotgate_tests::python::libfaketime(&python())
}

/// One request a day in Tokyo (UTC+9, no summer time: midnight there is 15:00 UTC).
const ONE_A_TOKYO_DAY: &str = "{ period = \"day@Asia/Tokyo\", requests = 1, tokens = 1000000 }";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quota_is_whole_again_exactly_at_midnight_in_its_zone() {
    let _serial = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    // slotgate's clock starts 20 s before midnight in Tokyo and runs from there; its monotonic
    // clock (timeouts, the queue) is left alone.
    let gate = Gate::new()
        .upstream_path(llama.socket())
        .env("LD_PRELOAD", libfaketime().to_str().unwrap())
        .env("FAKETIME", "@2026-12-04 14:59:40")
        .env("TZ", "UTC")
        .env("DONT_FAKE_MONOTONIC", "1")
        .policies(&[(&wat::built("quota"), Some(ONE_A_TOKYO_DAY))])
        .start()
        .await;
    let client = gate.client();
    let ask = || chat(PROMPT, 4, false);

    let resp = client.post_json(CHAT, &ask()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    let resp = client.post_json(CHAT, &ask()).await;
    assert_error(&resp, 429, "quota_exceeded");
    assert!(
        resp.body.contains("2026-12-04T15:00:00Z"),
        "the refusal names Tokyo's midnight in UTC: {}",
        resp.body
    );
    let retry: u64 = resp.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}");
    let reset = resp.header("x-ratelimit-reset-requests").unwrap();

    // Until that midnight it stays refused; from it on, whole again.
    let boundary = Instant::now() + Duration::from_secs(retry);
    while Instant::now() + Duration::from_millis(1500) < boundary {
        let resp = client.post_json(CHAT, &ask()).await;
        assert_eq!(resp.status, 429, "served before midnight ({reset} to go)");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep_until((boundary + Duration::from_millis(500)).into()).await;
    let resp = client.post_json(CHAT, &ask()).await;
    assert_eq!(resp.status, 200, "a new day in Tokyo: {}", resp.body);
    let s = gate.status().await;
    let q = &s["state"]["quotas"]["emptiest"][0];
    assert_eq!(q["period"], "day@Asia/Tokyo", "{s}");
    assert_eq!(q["window_start"], "2026-12-04T15:00:00Z", "{s}");
    assert_eq!(q["window_end"], "2026-12-05T15:00:00Z", "{s}");
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// A day of 50,000 tokens.
const TOKENS_A_DAY: &str = "{ period = \"day\", tokens = 50000 }";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkill_during_a_burst_leaves_no_tenant_more_than_it_had() {
    let _serial = slotgate_tests::llama::serial().await;
    // llama-server's own defaults: four slots over one shared pool.
    let llama = LlamaServer::start_default(8192, &[]).await;
    let dir = unique_dir("quota-burst").join("state");
    let dir = dir.to_str().unwrap().to_owned();
    let gate_on = || {
        Gate::new()
            .upstream_path(llama.socket())
            .opt("--state-dir", &dir)
            .policies(&[(&wat::built("quota"), Some(TOKENS_A_DAY))])
    };
    let mut gate = gate_on().start().await;
    // Settled answers first, so the level reflects real usage.
    for _ in 0..2 {
        let resp = gate.client().post_json(CHAT, &chat(PROMPT, 8, false)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    // A burst of long answers (1,800 tokens: over a second each at this model's ~1,300 tokens/s),
    // in llama-server's slots when slotgate dies: charged, not settled.
    let mut burst = Vec::new();
    for _ in 0..6 {
        let client = gate.client();
        let req = http::Request::post(CHAT)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                chat(PROMPT, 1800, false).to_string(),
            )))
            .unwrap();
        burst.push(tokio::spawn(async move { client.try_send(req).await }));
    }
    let t0 = Instant::now();
    while llama.busy_slots().await == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the burst never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Past a flush interval (100 ms) with nothing new admitted: what is left now is on disk.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = gate.quota_left("tokens").await;
    gate.signal("KILL");
    gate.wait_exit(Duration::from_secs(5)).await;
    for b in burst {
        if let Ok(resp) = b.await.unwrap() {
            panic!(
                "answered by a killed slotgate: {} {}",
                resp.status, resp.body
            );
        }
    }
    assert!(
        before < 50_000.0 - 6.0 * 1800.0,
        "the burst was charged: {before} left"
    );

    let gate = gate_on().start().await;
    let after = gate.quota_left("tokens").await;
    assert!(
        after <= before,
        "after the restart the tenant has {after} left, more than {before} before the kill"
    );
    assert_eq!(after, before, "nothing was lost either way");
    // The server finishes (or drops) the orphaned answers; then both ends are idle.
    let t0 = Instant::now();
    while llama.busy_slots().await > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "llama-server stayed busy"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gate.assert_idle().await;
    llama.assert_idle().await;
}
