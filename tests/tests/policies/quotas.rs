//! Calendar quotas (docs/quotas.md): the `quota` example policy in the real host on the fake
//! upstream. Every answer carries the tenant's allowance as rate-limit headers in the API's own
//! names; a spent quota is a 429 `quota_exceeded` whose `Retry-After` and reset point at the end of
//! the UTC day, marked `x-should-retry: false`; `/status` shows what is left; the soft limit is
//! counted; a SIGKILL keeps what was spent. (The SDKs reading it all, and a day ending on a clock
//! the test sets, are in `llama/quotas.rs`.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use slotgate_tests::errors::assert_error;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

/// Two requests a day per tenant, and plenty of tokens.
const SETTINGS: &str = "{ period = \"day\", requests = 2, tokens = 100000 }";

fn gate(state_dir: &str) -> Gate {
    Gate::new()
        .opt("--state-dir", state_dir)
        .policies(&[(&wat::built("quota"), Some(SETTINGS))])
}

/// Seconds from now to the next UTC midnight, and that midnight in Unix seconds.
fn to_midnight() -> (u64, u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let midnight = (now / 86_400 + 1) * 86_400;
    (midnight - now, midnight)
}

/// OpenAI's reset duration (`20ms`, `12s`, `6m0s`, `1h0m0s`) in seconds.
fn duration_secs(text: &str) -> u64 {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<u64>().unwrap().div_ceil(1000);
    }
    let (mut total, mut n) = (0, String::new());
    for c in text.chars() {
        match c {
            '0'..='9' => n.push(c),
            'h' | 'm' | 's' => {
                let unit = match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                total += n.parse::<u64>().unwrap() * unit;
                n.clear();
            }
            other => panic!("`{other}` in the duration {text:?}"),
        }
    }
    total
}

/// `secs` is within two seconds of `want` (the clock moves between reading and answering).
fn near(secs: u64, want: u64, what: &str) {
    assert!(
        secs.abs_diff(want) <= 2,
        "{what}: {secs} s, expected about {want} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quota_speaks_in_rate_limit_headers_and_refuses_until_midnight_without_retries() {
    let up = FakeUpstream::instant().start().await;
    let dir = unique_dir("quota").join("state");
    let gate = gate(dir.to_str().unwrap()).upstream(&up).start().await;
    let client = gate.client();

    // Allowed: the allowance after this request, in OpenAI's names.
    let resp = client.post_json(CHAT, &Req::chat("q1").json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let h = |name: &str| {
        resp.header(name)
            .unwrap_or_else(|| panic!("no {name}: {:?}", resp.headers))
    };
    assert_eq!(h("x-ratelimit-limit-requests"), "2");
    assert_eq!(h("x-ratelimit-remaining-requests"), "1");
    assert_eq!(h("x-ratelimit-limit-tokens"), "100000");
    let left: u64 = h("x-ratelimit-remaining-tokens").parse().unwrap();
    assert!(left < 100_000 && left > 90_000, "{left}");
    let (secs, midnight) = to_midnight();
    near(
        duration_secs(&h("x-ratelimit-reset-requests")),
        secs,
        "reset",
    );
    assert_eq!(resp.header("x-should-retry"), None, "only on a refusal");

    let resp = client.post_json(CHAT, &Req::chat("q2").json()).await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );

    // Spent: 429 quota_exceeded until midnight, not to be retried before.
    let resp = client.post_json(CHAT, &Req::chat("q3").json()).await;
    assert_eq!(
        assert_error(&resp, 429, "quota_exceeded"),
        "rate_limit_error"
    );
    assert_eq!(resp.header("x-should-retry").as_deref(), Some("false"));
    let retry: u64 = resp.header("retry-after").unwrap().parse().unwrap();
    near(retry, to_midnight().0, "Retry-After");
    let midnight_text = jiff::Timestamp::from_second(midnight as i64)
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    assert!(
        resp.body.contains(&midnight_text),
        "the message says when: {}",
        resp.body
    );
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );

    // On the Messages API: Anthropic's names, the reset as an RFC 3339 time.
    let msg =
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let resp = client.post_json("/v1/messages", &msg).await;
    assert_eq!(resp.status, 429, "{}", resp.body);
    assert!(resp.body.contains("\"rate_limit_error\""), "{}", resp.body);
    assert_eq!(
        resp.header("anthropic-ratelimit-requests-limit").as_deref(),
        Some("2")
    );
    assert_eq!(
        resp.header("anthropic-ratelimit-requests-remaining")
            .as_deref(),
        Some("0")
    );
    assert_eq!(
        resp.header("anthropic-ratelimit-requests-reset"),
        Some(midnight_text.clone())
    );
    assert_eq!(resp.header("x-ratelimit-limit-requests"), None);

    // /status shows what is left, without taking it.
    let s = gate.status().await;
    let quotas = s["state"]["quotas"]["emptiest"].as_array().unwrap().clone();
    let requests = quotas
        .iter()
        .find(|q| q["key"].as_str().unwrap().starts_with("requests:"))
        .unwrap_or_else(|| panic!("no request quota in {s}"));
    assert_eq!(requests["policy"], "quota");
    assert_eq!(requests["period"], "day");
    assert_eq!(requests["left"], 0.0);
    assert_eq!(requests["limit"], 2.0);
    assert_eq!(requests["window_end"], midnight_text.as_str());
    assert_eq!(
        s["state"]["buckets"]["count"], 0,
        "quota windows are not listed as buckets"
    );
    // The second request took the quota past its soft limit (0.8 of 2).
    assert_eq!(
        gate.metric(
            "slotgate_policy_events_total",
            &[("policy", "quota"), ("event", "soft_limit")]
        )
        .await,
        Some(1.0)
    );
    gate.assert_settled(&up, 1).await;
}

/// The request quota's `left` in `/status`.
async fn requests_left(gate: &RunningGate) -> f64 {
    let s = gate.status().await;
    s["state"]["quotas"]["emptiest"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["key"].as_str().unwrap().starts_with("requests:"))
        .unwrap_or_else(|| panic!("no request quota in {s}"))["left"]
        .as_f64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_quota_stays_spent_across_a_sigkill() {
    let up = FakeUpstream::instant().start().await;
    let dir = unique_dir("quota-kill").join("state");
    let dir = dir.to_str().unwrap();
    let mut first = gate(dir).upstream(&up).start().await;
    let client = first.client();
    for tag in ["k1", "k2"] {
        assert_eq!(
            client.post_json(CHAT, &Req::chat(tag).json()).await.status,
            200
        );
    }
    assert_eq!(requests_left(&first).await, 0.0);
    // Past a flush interval (100 ms), SIGKILL: nothing runs on the way out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;

    let gate = gate(dir).upstream(&up).start().await;
    assert_eq!(requests_left(&gate).await, 0.0, "the same after the kill");
    let resp = gate.client().post_json(CHAT, &Req::chat("k3").json()).await;
    assert_error(&resp, 429, "quota_exceeded");
    gate.assert_settled(&up, 1).await;
}
