//! End to end: the token-budget example policy (`wat::built("token-budget")`) in the real `slotgate`
//! binary, in front of a real llama-server (`-np 1`, the tiny random-weight model that
//! `scripts/setup-llama.sh` builds). Tenants are told apart by their API keys
//! (`Authorization: Bearer ...`, keyed `sha256:<hex>` in the settings).
//!
//! A tenant whose budget is spent is answered 429 `policy_denied` by slotgate itself, and llama-server
//! never sees the request; another tenant is served meanwhile. Budgets are settled from the `usage` that
//! llama-server reported: the test models each bucket from the real usage in the responses and checks
//! every admission and refusal, and the level the policy logs, against that model.
//!
//! Each test starts its own llama-server. They run one at a time: two CPU-bound servers sharing the
//! cores would skew each other's timing.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};
use slotgate_tests::llama::{chat, chat_usage, stream_usage, u64_at, LlamaServer, RunningLlama};
use slotgate_tests::*;

const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the policy's `on_complete` may take to settle a request once its response has ended.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);

/// A prompt llama-server counts as more tokens than slotgate estimates (the chat template adds ~30),
/// so each request using it is settled with a charge on top of its estimate.
const SHORT_PROMPT: &str = slotgate_tests::llama::PROMPT;

/// A prompt slotgate estimates at about twice the tokens llama-server counts (14 characters a word,
/// one token a word), so a request using it is settled with a refund.
fn long_word_prompt() -> String {
    format!(
        "Please summarise these words:{}",
        " international".repeat(40)
    )
}

/// slotgate's up-front estimate of a chat request with one message: the message's characters / 4,
/// rounded up (`prompt_tokens_estimate`), plus `max_tokens`. The token-budget policy charges this and
/// the policy's settlement log (`charged N`) is checked against it.
fn estimate(prompt: &str, max_tokens: u64) -> u64 {
    (prompt.chars().count() as u64).div_ceil(4) + max_tokens
}

/// A client identity: its API key and the `sha256:<hex>` form the policy (and its settings) see.
struct Tenant {
    name: &'static str,
    key: &'static str,
    hashed: String,
}

impl Tenant {
    /// The hash comes from `slotgate hash-key`, the form the README tells operators to configure.
    fn new(name: &'static str, key: &'static str) -> Self {
        let hashed = slotgate_tests::gate::hash_key(key);
        assert!(
            hashed.starts_with("sha256:") && hashed.len() == 7 + 64,
            "hash-key printed {hashed:?}"
        );
        Tenant { name, key, hashed }
    }

    fn request(&self, body: &Value) -> Request<Full<Bytes>> {
        Request::post(CHAT)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", self.key))
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("valid request")
    }

    /// Sends `body` with this tenant's key and reads the whole answer.
    async fn send(&self, client: &Client, body: &Value) -> Response {
        match tokio::time::timeout(ANSWER_TIMEOUT, client.try_send(self.request(body))).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => panic!("tenant {}: request failed: {e:#}", self.name),
            Err(_) => panic!("tenant {}: no answer within {ANSWER_TIMEOUT:?}", self.name),
        }
    }

    /// Sends `body` with this tenant's key and returns once the response head has arrived.
    async fn stream(&self, client: &Client, body: &Value) -> Streaming {
        let conn = client.connect().await.expect("connect to slotgate");
        tokio::time::timeout(ANSWER_TIMEOUT, conn.send_streaming(self.request(body)))
            .await
            .unwrap_or_else(|_| panic!("tenant {}: no response head in time", self.name))
            .unwrap_or_else(|e| panic!("tenant {}: streaming request failed: {e:#}", self.name))
    }
}

/// The token-budget refusal: 429 in the OpenAI error shape, code `policy_denied`, the policy's message.
fn assert_budget_refusal(resp: &Response) {
    assert_eq!(
        assert_error(resp, 429, "policy_denied"),
        "rate_limit_error",
        "{}",
        resp.body
    );
    assert_eq!(
        parse_message(&resp.body),
        "token budget exhausted",
        "{}",
        resp.body
    );
    assert!(
        resp.header("x-slotgate-queue-wait-ms").is_none(),
        "a refused request never waits for a slot: {:?}",
        resp.headers
    );
}

/// The refusal of a fixed quota (`refill_per_second` 0): retrying will not help, so, as the policy
/// README says, there is no Retry-After.
fn assert_quota_spent(resp: &Response) {
    assert_budget_refusal(resp);
    assert_eq!(
        resp.header("retry-after"),
        None,
        "a spent fixed quota has no Retry-After"
    );
}

fn parse_message(body: &str) -> String {
    let v: Value = serde_json::from_str(body).expect("error body is JSON");
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// One settlement as the token-budget policy logs it (debug, `slotgate::policy`):
/// `<tenant>: charged <estimate>, settled by <refund>, level <bucket level after>`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Settlement {
    charged: f64,
    refund: f64,
    level: f64,
}

/// Every settlement of `tenant` so far, from slotgate's JSON log lines.
fn settlements(gate: &RunningGate, tenant: &Tenant) -> Vec<Settlement> {
    let prefix = format!("{}: charged ", tenant.hashed);
    gate.stderr_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "slotgate::policy")
        .filter_map(|v| {
            let rest = v["message"].as_str()?.strip_prefix(&prefix)?.to_owned();
            let (charged, rest) = rest.split_once(", settled by ")?;
            let (refund, level) = rest.split_once(", level ")?;
            Some(Settlement {
                charged: charged.parse().ok()?,
                refund: refund.parse().ok()?,
                level: level.parse().ok()?,
            })
        })
        .collect()
}

/// Waits until the policy has settled `tenant`'s `n`th request and returns that settlement. The
/// settlement runs just after the response ended, so the next request must not be sent before it.
/// Only a settlement that moved the bucket is logged: every request here uses more or less than its
/// estimate.
async fn settled(gate: &RunningGate, tenant: &Tenant, n: usize) -> Settlement {
    let what = format!("settlement #{n} of tenant {}", tenant.name);
    let s = eventually(SETTLE_TIMEOUT, &what, || async {
        let all = settlements(gate, tenant);
        assert!(
            all.len() <= n,
            "tenant {} has {} settlements, expected {n}: {all:?}",
            tenant.name,
            all.len()
        );
        all.get(n - 1).copied()
    })
    .await;
    eprintln!("  tenant {} settlement #{n}: {s:?}", tenant.name);
    s
}

/// llama-server's own counters of the work it did.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LlamaWork {
    prompt_tokens: f64,
    prompt_tokens_cached: f64,
    tokens_predicted: f64,
    decodes: f64,
}

async fn llama_work(llama: &RunningLlama) -> LlamaWork {
    let m = llama.metrics().await;
    let counter = |name: &str| {
        m.value(name, &[])
            .unwrap_or_else(|| panic!("llama-server /metrics lacks {name}:\n{}", m.text))
    };
    LlamaWork {
        prompt_tokens: counter("llamacpp:prompt_tokens_total"),
        prompt_tokens_cached: counter("llamacpp:prompt_tokens_cached_total"),
        tokens_predicted: counter("llamacpp:tokens_predicted_total"),
        decodes: counter("llamacpp:n_decode_total"),
    }
}

/// slotgate with the token-budget policy and `settings`, on one slot in front of `llama`. The policy's
/// debug log (its settlements) goes to stderr as JSON lines. Prompts are charged at the characters/4
/// estimate (`--cost-tokenizer estimate`) on purpose: these tests are about settling a wrong up-front
/// charge from llama-server's real usage (exact counting is e2e_llama_cost.rs).
async fn budget_gate(llama: &RunningLlama, settings: &Value) -> RunningGate {
    let dir = unique_dir("budget");
    let settings_path = dir.join("token-budget.json");
    std::fs::write(&settings_path, settings.to_string()).expect("write settings");
    Gate::new()
        .slots(1)
        .queue_depth(2)
        .opt("--policy", wat::built("token-budget").display())
        .opt("--policy-settings", settings_path.display())
        .opt("--log-format", "json")
        .opt("--cost-tokenizer", "estimate")
        .env("SLOTGATE_LOG", "info,slotgate::policy=debug")
        .start_before(llama)
        .await
}

/// Tokens A's requests may generate.
const A_TOKENS: u64 = 16;
/// How long B's streamed answer should take: others are refused while it runs.
const B_STREAM_TIME: Duration = Duration::from_secs(2);
/// The fewest and the most tokens B's stream may have. Generation speed here swings from ~0.5 to
/// ~10 ms a token with the machine's load, so the calibration alone is not trusted: even at the
/// fastest, 1000 tokens leave ~0.5 s for the two refusals. Its prompt and answer must fit the
/// slot's context of `llama::CTX_PER_SLOT` tokens.
const B_STREAM_TOKENS: (u64, u64) = (1000, 1800);
const _: () = assert!(B_STREAM_TOKENS.1 as usize + 200 <= slotgate_tests::llama::CTX_PER_SLOT);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_budget_is_refused_before_llama_server_while_others_are_served_and_settled_from_real_usage(
) {
    let _serial = slotgate_tests::llama::serial().await;
    let t_start = Instant::now();
    let a = Tenant::new("A", "sk-e2e-tenant-a");
    let b = Tenant::new("B", "sk-e2e-tenant-b");
    let long = long_word_prompt();
    let llama = LlamaServer::start(1).await;
    let b_stream_tokens = llama.tokens_for(B_STREAM_TIME, B_STREAM_TOKENS).await;

    // Fixed quotas (no refill), so every admission is decided by usage alone. A's bucket holds four
    // estimates of its request; B's exactly one estimate of its long-prompt stream. Anyone else gets
    // a budget too small for any request.
    let est_a = estimate(SHORT_PROMPT, A_TOKENS);
    let cap_a = 4 * est_a;
    let cap_b = estimate(&long, b_stream_tokens);
    let settings = json!({
        "capacity": 1,
        "refill_per_second": 0,
        "tenants": {
            a.hashed.as_str(): {"capacity": cap_a, "refill_per_second": 0},
            b.hashed.as_str(): {"capacity": cap_b, "refill_per_second": 0},
        },
    });
    let gate = budget_gate(&llama, &settings).await;
    let client = gate.client();
    let baseline = llama_work(&llama).await;
    eprintln!(
        "started in {:?}; A: capacity {cap_a}, estimate {est_a}; B: capacity {cap_b}",
        t_start.elapsed()
    );
    let mut generated = 0; // completion tokens of every answer, to hold against llama-server's count
    let mut refusals = 0;

    // 1. A spends its budget. Each answer is settled from its real usage before the next request, so
    //    the bucket's level is always `capacity - sum(prompt_tokens + completion_tokens)`.
    let mut level_a = cap_a as i64;
    let mut served_a: usize = 0;
    // What the policy must log for each settlement, from the usage llama-server reported.
    let (mut expected_a, mut expected_b) = (Vec::new(), Vec::new());
    while level_a >= est_a as i64 {
        let u = chat_usage(
            &a.send(&client, &chat(SHORT_PROMPT, A_TOKENS, false)).await,
            A_TOKENS,
        );
        generated += u.completion;
        served_a += 1;
        assert!(
            u.total() > est_a,
            "precondition: llama-server counts the chat template, so A's request ({u:?}) uses more than \
             its estimate {est_a}"
        );
        level_a -= u.total() as i64;
        expected_a.push(Settlement {
            charged: est_a as f64,
            refund: est_a as f64 - u.total() as f64,
            level: level_a as f64,
        });
        settled(&gate, &a, served_a).await;
        assert!(served_a < 4, "A was served {served_a} times");
    }
    // Estimates alone would have admitted four; settling from real usage leaves A short after fewer.
    assert!(served_a >= 1);
    eprintln!("A served {served_a} times, {level_a} tokens left, {est_a} needed");

    // 2. A's next request is refused by slotgate, at once, and never reaches llama-server.
    llama.assert_idle().await;
    let before = llama_work(&llama).await;
    let t0 = Instant::now();
    let resp = a.send(&client, &chat(SHORT_PROMPT, A_TOKENS, false)).await;
    let took = t0.elapsed();
    assert_quota_spent(&resp);
    refusals += 1;
    assert!(took < Duration::from_secs(2), "the refusal took {took:?}");
    gate.wait_outcome("policy_denied", refusals).await;
    assert_eq!(
        llama_work(&llama).await,
        before,
        "llama-server did work for A's refused request"
    );

    // 3. B streams a long-prompt answer, charged its whole budget up front. While it generates, A is
    //    refused again, and so is B itself (nothing left until the stream is settled); neither waits
    //    for the busy slot.
    let mut b1 = b.stream(&client, &chat(&long, b_stream_tokens, true)).await;
    assert_eq!(b1.status, 200, "B's stream was not admitted");
    b1.first_event(ANSWER_TIMEOUT).await;
    let t0 = Instant::now();
    let resp = a.send(&client, &chat(SHORT_PROMPT, A_TOKENS, false)).await;
    assert_quota_spent(&resp);
    let resp = b.send(&client, &chat(SHORT_PROMPT, 1, false)).await;
    assert_quota_spent(&resp);
    refusals += 2;
    let refused_in = t0.elapsed();
    let st = gate.status().await;
    assert_eq!(
        (u64_at(&st, "/slots/busy"), u64_at(&st, "/queue/depth")),
        (1, 0),
        "B's stream must still hold the slot after both refusals ({refused_in:?}), and nothing queues: {st}"
    );
    assert_eq!(llama.busy_slots().await, 1, "llama-server runs B's stream");
    let u_b1 = stream_usage(&b1.read_sse(ANSWER_TIMEOUT).await, b_stream_tokens);
    generated += u_b1.completion;

    // 4. B's stream is settled from the usage in its last chunk: llama-server counted fewer prompt
    //    tokens than estimated, so part of the estimate comes back.
    let level_b = cap_b as i64 - u_b1.total() as i64;
    expected_b.push(Settlement {
        charged: cap_b as f64,
        refund: level_b as f64,
        level: level_b as f64,
    });
    settled(&gate, &b, 1).await;
    let prompt_estimate = estimate(SHORT_PROMPT, 0);
    assert!(
        level_b > prompt_estimate as i64,
        "precondition: B's long-word prompt ({u_b1:?}) must be estimated at more than {prompt_estimate} \
         tokens beyond what llama-server counted (refund {level_b})"
    );

    // 5. What is left is exactly the refund: one token more is refused, exactly that much is served.
    //    Without the refund of (estimate - actual) the bucket would be empty and both refused.
    let b2_tokens = level_b as u64 - prompt_estimate;
    assert_eq!(estimate(SHORT_PROMPT, b2_tokens), level_b as u64);
    let resp = b
        .send(&client, &chat(SHORT_PROMPT, b2_tokens + 1, false))
        .await;
    assert_quota_spent(&resp);
    refusals += 1;
    let u_b2 = chat_usage(
        &b.send(&client, &chat(SHORT_PROMPT, b2_tokens, false)).await,
        b2_tokens,
    );
    generated += u_b2.completion;
    expected_b.push(Settlement {
        charged: level_b as f64,
        refund: level_b as f64 - u_b2.total() as f64,
        level: (level_b - u_b2.total() as i64) as f64,
    });
    settled(&gate, &b, 2).await;

    // 6. A is still refused after B was served.
    let resp = a.send(&client, &chat(SHORT_PROMPT, A_TOKENS, false)).await;
    assert_quota_spent(&resp);
    refusals += 1;

    // Both sides idle; llama-server generated exactly the tokens of the answers slotgate served, and
    // nothing for the five refused requests.
    gate.assert_idle().await;
    llama.assert_idle().await;
    let served_total = served_a as u64 + 2;
    gate.wait_outcome("ok", served_total).await;
    gate.wait_outcome("policy_denied", refusals).await;
    gate.wait_metric(
        "slotgate_policy_decisions_total",
        &[("policy", "token-budget"), ("decision", "deny")],
        refusals as f64,
    )
    .await;
    let work = llama_work(&llama).await;
    assert_eq!(
        work.tokens_predicted - baseline.tokens_predicted,
        generated as f64,
        "llama-server generated other tokens than the {served_total} served answers: {work:?}"
    );
    // The policy's own account (its debug log) agrees: charged the estimate, settled from real usage.
    assert_eq!(
        settlements(&gate, &a),
        expected_a,
        "A's settlements, expected from llama-server's usage"
    );
    assert_eq!(
        settlements(&gate, &b),
        expected_b,
        "B's settlements, expected from llama-server's usage"
    );
    eprintln!("scenario took {:?}", t_start.elapsed());
}

/// Tokens of C's requests.
const C_TOKENS: u64 = 16;
/// C's refill, tokens per second: slow enough that Retry-After (~5 s here) tells a settlement from
/// real usage apart from one that is off by C's completion tokens.
const C_REFILL: f64 = 12.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refilling_budget_answers_retry_after_from_real_usage_and_admits_once_it_has_passed() {
    let _serial = slotgate_tests::llama::serial().await;
    let t_start = Instant::now();
    let c = Tenant::new("C", "sk-e2e-tenant-c");
    let est = estimate(SHORT_PROMPT, C_TOKENS);
    let settings = json!({
        "capacity": 1,
        "refill_per_second": 0,
        "tenants": {c.hashed.as_str(): {"capacity": est, "refill_per_second": C_REFILL}},
    });
    let llama = LlamaServer::start(1).await;
    let gate = budget_gate(&llama, &settings).await;
    let client = gate.client();
    let body = chat(SHORT_PROMPT, C_TOKENS, false);
    // Warm llama-server up straight, so C's first answer is quick and the Retry-After bounds tight.
    chat_usage(
        &Client::unix(llama.socket()).post_json(CHAT, &body).await,
        C_TOKENS,
    );
    let baseline = llama_work(&llama).await;

    // The first request takes the whole bucket; settled from real usage it leaves the bucket in debt.
    let t0 = Instant::now();
    let u1 = chat_usage(&c.send(&client, &body).await, C_TOKENS);
    let debt = u1.total() as f64 - est as f64;
    assert!(
        debt > 0.0,
        "precondition: C's request ({u1:?}) uses more than its estimate {est}"
    );
    let first = settled(&gate, &c, 1).await;

    // The next is refused with a Retry-After of the seconds until the bucket holds `est` again:
    // (est + debt) / refill from when the bucket was first drawn, less the time since.
    llama.assert_idle().await;
    let before = llama_work(&llama).await;
    let resp = c.send(&client, &body).await;
    let elapsed = t0.elapsed().as_secs_f64();
    assert_budget_refusal(&resp);
    let ra = retry_after(&resp);
    eprintln!("C refused with Retry-After {ra} s, {elapsed:.2} s after its first request");
    let full = (est as f64 + debt) / C_REFILL;
    let lowest = (full - elapsed).ceil().max(1.0) as u64;
    assert!(
        (lowest..=full.ceil() as u64).contains(&ra),
        "Retry-After {ra} s, expected {lowest}..={} s ({debt} tokens of debt, {elapsed:.2} s since the \
         bucket was drawn)",
        full.ceil()
    );
    assert_eq!(
        llama_work(&llama).await,
        before,
        "llama-server did work for C's refused request"
    );

    // Retrying after Retry-After is admitted.
    tokio::time::sleep(Duration::from_secs(ra)).await;
    chat_usage(&c.send(&client, &body).await, C_TOKENS);
    settled(&gate, &c, 2).await;

    gate.assert_idle().await;
    llama.assert_idle().await;
    gate.wait_outcome("ok", 2).await;
    gate.wait_outcome("policy_denied", 1).await;
    let work = llama_work(&llama).await;
    assert_eq!(
        work.tokens_predicted - baseline.tokens_predicted,
        (2 * C_TOKENS) as f64,
        "{work:?}"
    );
    assert_eq!(
        (first.charged, first.refund),
        (est as f64, -debt),
        "C's first request must be settled from llama-server's usage {u1:?}: {first:?}"
    );
    eprintln!("scenario took {:?}", t_start.elapsed());
}
