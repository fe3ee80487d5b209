//! End to end: LiteLLM's proxy, the real one (`litellm[proxy]` from PyPI, pinned in
//! `tests/python/requirements.txt` and installed by `scripts/setup-python-clients.sh`), in front of two slotgate + llama-server pairs (`-np 1` each, the
//! tiny model), run from `examples/litellm/config.yaml` as an operator runs it: one model name, two
//! deployments (one slotgate each, on TCP), the master key, simple-shuffle with retries and
//! cooldowns.
//!
//! What LiteLLM 1.108.7 does, from its source: it cools a deployment down after a 429, 401, 402,
//! 404, 408 or 5xx and never after another 4xx (`_is_cooldown_required`,
//! router_utils/cooldown_handlers.py), for as long as the answer's Retry-After says unless the
//! deployment sets its own `cooldown_time` (router.py, `deployment_callback_on_failure`), and it
//! retries a 403 on another deployment (router.py, `should_retry_this_error`). Through the proxy
//! only the first failed attempt of a request is looked at: its retries share one logging object,
//! which reports one failure (litellm_logging.py, `should_run_logging`). So each scenario repeats a
//! request until the pair it is about refused that request's first attempt, then looks where the
//! next requests go, counted by each slotgate's `slotgate_requests_total`.
//!
//! One LiteLLM process, two llama-servers and two slotgates serve the scenarios in turn, in one
//! test: a LiteLLM start costs seconds, and its cooldowns are state each scenario hands on.
//!
//! 1. The keys and the model list are the example's.
//! 2. A burst of twice the slots (four chats of about a second, two pairs of one slot and one queue
//!    place each) is served in full: no client sees a 429.
//! 3. A saturated pair (its slot held and its one queue place taken, its llama-server stopped
//!    meanwhile) answers 429 `queue_full`: LiteLLM serves from the other pair until slotgate's
//!    Retry-After has passed, then uses both.
//! 4. A tenant over its budget at one pair (budgets per pair, as token-budget keeps them in
//!    memory): pair A runs with `--policy-denial-status 403`, and LiteLLM serves the tenant from B
//!    and keeps sending everybody else to A as well. Pair B answers the default 429, and LiteLLM
//!    cools B down for everybody, for as long as that one tenant's Retry-After.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use slotgate_tests::litellm::{LiteLlm, MASTER_KEY, MODEL};
use slotgate_tests::llama::{chat, PROMPT};
use slotgate_tests::pair::Pair;
use slotgate_tests::*;

/// Each pair's queue: one place, so a held slot and one waiter make it answer 429.
const QUEUE_DEPTH: usize = 1;
/// Requests sent while waiting for LiteLLM to try a given pair first: the shuffle picks it at
/// even odds, so missing it this often by chance is a 1 in 2^20 event.
const TRIES: usize = 20;
/// Requests within which a pair that is not (or no longer) cooled down must get one: 1 in 2^12.
const REACH_TRIES: usize = 12;
/// How far LiteLLM's cooldown may end before the Retry-After it was given (its clock against
/// ours, and whole seconds).
const EARLY: Duration = Duration::from_millis(500);
/// Retry-After of the tenant that carol's budget policy refuses at pair A (never reached: A's 403
/// cools nothing down; were it cooled, it would be for this long).
const CAROL_RETRY_AFTER: u64 = 30;
/// Retry-After of dave's refusal at pair B: how long LiteLLM cools B down for everybody.
const DAVE_RETRY_AFTER: u64 = 12;

/// A policy standing for a per-pair token budget that `tenant` has spent: its requests get
/// token-budget's refusal (429, "token budget exhausted", Retry-After `retry_after`), everybody
/// else's are allowed. The tenant is the `x-tenant` header, which LiteLLM forwards
/// (`forward_client_headers_to_llm_api`) and slotgate shows to policies: token-budget itself keys
/// on the API key, and every request through LiteLLM carries LiteLLM's one key.
fn spent_budget(dir: &Path, tenant: &str, retry_after: u64) -> PathBuf {
    let deny = format!(
        r#"{{"verdict":"deny","status":429,"message":"token budget exhausted","retry_after_seconds":{retry_after}}}"#
    );
    let refuse = wat::output(1024, deny.len() as u32);
    wat::on_markers(
        dir,
        tenant,
        &[(tenant, refuse.as_str())],
        &wat::data(1024, deny.as_bytes()),
    )
}

/// A pair of this file: its slotgate has the example's queue place and `policy`, with `opts`.
async fn start_pair(name: &'static str, policy: &Path, opts: &[(&str, &str)]) -> Pair {
    let mut gate = Gate::one_slot(QUEUE_DEPTH).policies(&[(policy, None)]);
    for (name, value) in opts {
        gate = gate.opt(name, value);
    }
    Pair::start(name, gate).await
}

/// What these scenarios ask of a pair beyond [`Pair`]'s counts.
trait Scenario {
    async fn refused(&self, refusal: Refusal) -> u64;
    async fn direct(&self, tenant: &str, max_tokens: u64) -> Response;
}

impl Scenario for Pair {
    async fn refused(&self, refusal: Refusal) -> u64 {
        match refusal {
            Refusal::Overload => self.overloaded().await,
            Refusal::Budget => self.outcome("policy_denied").await,
        }
    }

    /// A request straight to this slotgate, as `tenant`.
    async fn direct(&self, tenant: &str, max_tokens: u64) -> Response {
        self.gate
            .client()
            .post_json_with_headers(
                CHAT,
                &chat(PROMPT, max_tokens, false),
                &[("x-tenant", tenant)],
            )
            .await
    }
}

/// One request through LiteLLM and which pairs it reached, by their finished-request counts (the
/// test sends nothing else meanwhile).
struct Sent {
    sent: Instant,
    reached: [bool; 2],
}

/// When the request whose first attempt a pair refused was sent, and when LiteLLM answered it
/// (from the other pair): the refusal, and so the start of any cooldown, lies between the two.
struct Refused {
    sent: Instant,
    answered: Instant,
}

async fn send_counted(litellm: &LiteLlm, pairs: [&Pair; 2], tenant: &str) -> Sent {
    let before = [pairs[0].finished().await, pairs[1].finished().await];
    let sent = Instant::now();
    litellm.chat(tenant).await;
    let after = [pairs[0].finished().await, pairs[1].finished().await];
    Sent {
        sent,
        reached: [after[0] > before[0], after[1] > before[1]],
    }
}

/// What a pair answered when it refused a request.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// 429 `queue_full` (or `estimated_wait_too_long`): the pair is overloaded.
    Overload,
    /// `policy_denied`: the tenant's budget, in whatever status the pair sends it.
    Budget,
}

/// Sends `tenant`'s requests through LiteLLM until `pair` has counted one more `refusal`: a first
/// attempt that went to `pair` and was refused. Every request must still be answered (from the
/// other pair). Returns that request's times.
async fn until_refused_by(
    litellm: &LiteLlm,
    pair: &Pair,
    tenant: &str,
    refusal: Refusal,
) -> Refused {
    let before = pair.refused(refusal).await;
    for _ in 0..TRIES {
        let sent = Instant::now();
        litellm.chat(tenant).await;
        let answered = Instant::now();
        if pair.refused(refusal).await > before {
            return Refused { sent, answered };
        }
    }
    panic!(
        "LiteLLM sent none of {TRIES} requests of {tenant} to pair {} first",
        pair.name
    );
}

/// Sends `tenant`'s requests through LiteLLM until one reaches `pairs[which]` and returns when
/// that one was sent; `None` if none of the first `REACH_TRIES` sent from `from` on did.
async fn until_reached(
    litellm: &LiteLlm,
    pairs: [&Pair; 2],
    which: usize,
    tenant: &str,
    from: Instant,
) -> Option<Instant> {
    let mut tries = 0;
    while tries < REACH_TRIES {
        let s = send_counted(litellm, pairs, tenant).await;
        if s.reached[which] {
            return Some(s.sent);
        }
        if s.sent >= from {
            tries += 1;
        }
    }
    None
}

/// The seconds of the one Retry-After `pair` has handed out since `before` answers were counted.
async fn the_retry_after(pair: &Pair, before: (f64, f64)) -> u64 {
    let m = pair.gate.metrics().await;
    let count = m.sum("slotgate_retry_after_seconds_count", &[]) - before.0;
    let sum = m.sum("slotgate_retry_after_seconds_sum", &[]) - before.1;
    assert_eq!(
        count, 1.0,
        "LiteLLM's request went to pair {} once (its retry to the other pair); Retry-Afters: {}",
        pair.name, m.text
    );
    sum as u64
}

async fn retry_afters(pair: &Pair) -> (f64, f64) {
    let m = pair.gate.metrics().await;
    (
        m.sum("slotgate_retry_after_seconds_count", &[]),
        m.sum("slotgate_retry_after_seconds_sum", &[]),
    )
}

/// Sends requests as `tenant` until `pair` (`pairs[which]`), refused by `refused` with
/// `retry_after`, gets one again, and asserts that LiteLLM cooled it down for as long as that
/// Retry-After: it got none sent before `refused.sent + retry_after - EARLY`, and one of the first
/// `REACH_TRIES` sent after `refused.answered + retry_after`, so with an unloaded machine (a
/// request takes well under a second) well before LiteLLM's own `cooldown_time` of 10 s.
async fn cooled_for(
    litellm: &LiteLlm,
    pairs: [&Pair; 2],
    which: usize,
    refused: &Refused,
    retry_after: u64,
) {
    let pair = pairs[which];
    let ra = Duration::from_secs(retry_after);
    let reached = until_reached(litellm, pairs, which, "alice", refused.answered + ra).await;
    let reached = reached.unwrap_or_else(|| {
        panic!(
            "pair {} got none of {REACH_TRIES} requests sent after its Retry-After {retry_after} \
             ({:?} after it refused): cooled down longer",
            pair.name,
            refused.sent.elapsed()
        )
    });
    let after = reached.duration_since(refused.sent);
    eprintln!(
        "pair {}: Retry-After {retry_after}s; LiteLLM sent it a request again {after:?} after the refused one",
        pair.name
    );
    assert!(
        reached + EARLY >= refused.sent + ra,
        "pair {} got a request {after:?} after it answered Retry-After {retry_after}",
        pair.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn litellm_routes_around_overload_but_not_around_one_tenants_budget() {
    let _serial = slotgate_tests::llama::serial().await;
    let dir = unique_dir("litellm-policies");
    let a = start_pair(
        "A",
        &spent_budget(&dir, "tenant-carol", CAROL_RETRY_AFTER),
        &[("--policy-denial-status", "403")],
    )
    .await;
    let b = start_pair(
        "B",
        &spent_budget(&dir, "tenant-dave", DAVE_RETRY_AFTER),
        &[],
    )
    .await;
    // Warm both llama-servers up and give both slotgates a measured rate for their Retry-After.
    for pair in [&a, &b] {
        for _ in 0..2 {
            let resp = pair.direct("warm-up", 16).await;
            assert_eq!(resp.status, 200, "pair {}: {}", pair.name, resp.body);
        }
    }
    let litellm = LiteLlm::start(&a.api_base(), &b.api_base()).await;
    let pairs = [&a, &b];

    keys_and_models_are_the_examples(&litellm, pairs).await;
    a_burst_of_twice_the_slots_is_served(&litellm, pairs).await;
    a_saturated_pair_is_skipped_for_its_retry_after(&litellm, pairs).await;
    one_tenants_budget_cools_down_a_pair_only_as_a_429(&litellm, pairs).await;
}

/// Scale-out (issue 36): LiteLLM's `least-busy` routing in front of the two pairs spreads a burst
/// that is more than one pair can hold (its slot and its queue place) by the requests each has in
/// flight, and every client is served; each pair serves its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn litellm_least_busy_spreads_a_burst_over_both_pairs() {
    let _serial = slotgate_tests::llama::serial().await;
    let dir = unique_dir("litellm-least-busy");
    let allow_all = spent_budget(&dir, "tenant-nobody", 1);
    let a = start_pair("A", &allow_all, &[]).await;
    let b = start_pair("B", &allow_all, &[]).await;
    for pair in [&a, &b] {
        let resp = pair.direct("warm-up", 16).await;
        assert_eq!(resp.status, 200, "pair {}: {}", pair.name, resp.body);
    }
    let started = LiteLlm::start_routing("least-busy", &a.api_base(), &b.api_base()).await;
    let litellm = &started;
    let pairs = [&a, &b];
    let before = [a.outcome("ok").await, b.outcome("ok").await];
    let refused_before = a.refused(Refusal::Overload).await + b.refused(Refusal::Overload).await;
    let tokens = a
        .llama
        .tokens_for(Duration::from_millis(1000), (50, 1800))
        .await;
    const BURST: usize = 4;
    let one = |i: usize| async move {
        litellm
            .chat_of(Some(MASTER_KEY), &format!("spread-{i}"), tokens)
            .await
    };
    let (r0, r1, r2, r3) = tokio::join!(one(0), one(1), one(2), one(3));
    for resp in [&r0, &r1, &r2, &r3] {
        assert_eq!(
            resp.status,
            200,
            "a client of the burst: {}\n{}",
            resp.body,
            litellm.log_tail(30)
        );
        assert_eq!(resp.json()["usage"]["completion_tokens"], tokens);
    }
    let served = [
        a.outcome("ok").await - before[0],
        b.outcome("ok").await - before[1],
    ];
    let refused =
        a.refused(Refusal::Overload).await + b.refused(Refusal::Overload).await - refused_before;
    eprintln!("least-busy: a burst of {BURST} served {served:?} by pairs A and B, {refused} first attempts refused");
    assert_eq!(served[0] + served[1], BURST as u64);
    assert!(
        served.iter().all(|n| *n >= 1 && *n <= 3),
        "spread by the requests in flight: {served:?}"
    );
    for pair in pairs {
        pair.assert_idle().await;
    }
}

/// The master key lists the example's one model (from the config: neither slotgate is asked) and
/// is served; any other key is refused by LiteLLM before a slotgate sees it. Without a database
/// LiteLLM 1.108.7 refuses it with 400 `no_db_connection`, not 401: a key that is not the master
/// key can only be a virtual key, and those live in the database.
async fn keys_and_models_are_the_examples(litellm: &LiteLlm, pairs: [&Pair; 2]) {
    let seen = [pairs[0].finished().await, pairs[1].finished().await];
    let models = litellm.get("/v1/models", MASTER_KEY).await;
    assert_eq!(models.status, 200, "{}", models.body);
    let ids: Vec<Value> = models.json()["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data in {}", models.body))
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [MODEL], "{}", models.body);

    let wrong = "sk-not-the-master-key";
    for resp in [
        litellm.get("/v1/models", wrong).await,
        litellm.chat_with(Some(wrong), "mallory").await,
    ] {
        assert_eq!(resp.status, 400, "{}", resp.body);
        assert_eq!(
            resp.json()["error"]["type"],
            "no_db_connection",
            "{}",
            resp.body
        );
    }
    // Without a key: refused too (1.108.7 answers 500, its auth path failing without a database).
    let keyless = litellm.chat_with(None, "mallory").await;
    eprintln!("no key: {} {}", keyless.status, keyless.body);
    assert!(!keyless.status.is_success(), "{}", keyless.body);
    assert_eq!(
        [pairs[0].finished().await, pairs[1].finished().await],
        seen,
        "the model list and the refusals never reach a slotgate"
    );

    let s = send_counted(litellm, pairs, "alice").await;
    assert_eq!(
        s.reached.iter().filter(|r| **r).count(),
        1,
        "one request, one pair"
    );
    for pair in pairs {
        pair.assert_idle().await;
    }
}

/// A burst of twice the slots (four requests of about a second for two pairs of one slot), each
/// pair with the example's queue place: every client is served. A first attempt a pair refuses
/// (four landing on one pair) cools that pair down and is retried at once on the other, whose slot
/// and queue place take it; with no queue places the same burst reached clients as LiteLLM's 429
/// (issue 22), since the first refusal cools a pair down and the retries then find none.
async fn a_burst_of_twice_the_slots_is_served(litellm: &LiteLlm, pairs: [&Pair; 2]) {
    let refused_before =
        pairs[0].refused(Refusal::Overload).await + pairs[1].refused(Refusal::Overload).await;
    let told_before = [retry_afters(pairs[0]).await, retry_afters(pairs[1]).await];
    let tokens = pairs[0]
        .llama
        .tokens_for(Duration::from_millis(1000), (50, 1800))
        .await;
    let one = |i: usize| async move {
        litellm
            .chat_of(Some(MASTER_KEY), &format!("burst-{i}"), tokens)
            .await
    };
    let (r0, r1, r2, r3) = tokio::join!(one(0), one(1), one(2), one(3));
    for resp in [r0, r1, r2, r3] {
        assert_eq!(
            resp.status,
            200,
            "a client of the burst: {}\n{}",
            resp.body,
            litellm.log_tail(30)
        );
        assert_eq!(
            resp.json()["usage"]["completion_tokens"],
            tokens,
            "{}",
            resp.body
        );
    }
    let refused =
        pairs[0].refused(Refusal::Overload).await + pairs[1].refused(Refusal::Overload).await;
    eprintln!(
        "burst of 4: {} first attempts refused and retried on the other pair",
        refused - refused_before
    );
    for pair in pairs {
        pair.assert_idle().await;
    }
    // A pair cooled down by a refusal of this burst is used again once its Retry-After has passed:
    // the next scenario starts with both pairs in use.
    let mut longest = 0.0f64;
    for (pair, before) in pairs.iter().zip(told_before) {
        let (count, sum) = retry_afters(pair).await;
        if count > before.0 {
            // Their sum: at least the longest of them.
            longest = longest.max(sum - before.1);
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(longest.ceil() + 0.5)).await;
}

/// Pair A is saturated: its slot held and its one queue place taken by requests sent to slotgate A
/// directly, while its llama-server is stopped (SIGSTOP), so they last as long as the test needs.
/// A answers LiteLLM's request 429 `queue_full` with a Retry-After (its estimate of the work ahead).
/// LiteLLM serves that request from B at once, and sends nothing more to A (idle again meanwhile:
/// llama-server resumed and finished the two) until that Retry-After has passed; then A gets
/// requests again.
async fn a_saturated_pair_is_skipped_for_its_retry_after(litellm: &LiteLlm, pairs: [&Pair; 2]) {
    let [a, _] = pairs;
    let hold = Req::from_json(chat(PROMPT, 16, true));
    let before = retry_afters(a).await;
    let frozen = a.llama.freeze();
    let held = a.gate.hold_slot(&hold).await;
    let queued = a.gate.enqueue(&hold).await;
    let served_by_a = a.outcome("ok").await;

    let refused = until_refused_by(litellm, a, "alice", Refusal::Overload).await;
    let retry_after = the_retry_after(a, before).await;
    assert_eq!(
        a.outcome("ok").await,
        served_by_a,
        "the saturated pair served nothing"
    );

    // A works off what it holds and is idle again, but stays cooled down.
    frozen.thaw();
    for waiter in [held, queued] {
        let (resp, _) = waiter.await.expect("client task");
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    a.assert_idle().await;

    cooled_for(litellm, pairs, 0, &refused, retry_after).await;
    for pair in pairs {
        pair.assert_idle().await;
    }
}

/// carol's budget is spent at A, dave's at B (each pair has budgets of its own). A answers with
/// `--policy-denial-status 403`, B with the default 429.
///
/// - carol through LiteLLM: refused by A with 403, retried on B and served. A is not cooled down:
///   alice's requests keep reaching A.
/// - dave through LiteLLM: refused by B with 429, retried on A and served. B is cooled down for
///   everybody: alice's requests reach only A until dave's Retry-After has passed.
async fn one_tenants_budget_cools_down_a_pair_only_as_a_429(litellm: &LiteLlm, pairs: [&Pair; 2]) {
    let [a, b] = pairs;

    // What each pair answers the tenant directly: the same refusal, in two statuses.
    let carol = a.direct("tenant-carol", 2).await;
    assert_eq!(
        assert_error(&carol, 403, "policy_denied"),
        "permission_error"
    );
    assert_eq!(retry_after(&carol), CAROL_RETRY_AFTER);
    let dave = b.direct("tenant-dave", 2).await;
    assert_eq!(
        assert_error(&dave, 429, "policy_denied"),
        "rate_limit_error"
    );
    assert_eq!(retry_after(&dave), DAVE_RETRY_AFTER);

    // With the setting: A refused carol, and alice still reaches A well within carol's
    // Retry-After, which a cooldown would have lasted.
    let refused = until_refused_by(litellm, a, "tenant-carol", Refusal::Budget).await;
    let reached = until_reached(litellm, pairs, 0, "alice", refused.answered).await;
    match reached.map(|r| r.duration_since(refused.sent)) {
        Some(later) if later < Duration::from_secs(CAROL_RETRY_AFTER - 1) => {
            eprintln!("pair A refused carol; LiteLLM sent alice to A {later:?} later")
        }
        Some(later) => panic!(
            "LiteLLM cooled A down after it refused carol: alice reached A only {later:?} later"
        ),
        None => panic!(
            "LiteLLM cooled A down after it refused carol: none of alice's next {REACH_TRIES} \
             requests reached A"
        ),
    }

    // Without it: B refused dave, and alice reaches only A for dave's Retry-After.
    let refused = until_refused_by(litellm, b, "tenant-dave", Refusal::Budget).await;
    let cooled = refused.sent + Duration::from_secs(DAVE_RETRY_AFTER) - Duration::from_secs(2);
    let mut sent = 0;
    while Instant::now() < cooled {
        let s = send_counted(litellm, pairs, "alice").await;
        assert!(
            !s.reached[1],
            "LiteLLM sent alice to B {:?} after B refused dave with Retry-After {DAVE_RETRY_AFTER}",
            s.sent.duration_since(refused.sent)
        );
        sent += 1;
    }
    eprintln!("pair B refused dave; LiteLLM sent all {sent} of alice's requests to A meanwhile");
    assert!(
        sent >= 8,
        "only {sent} requests while B was cooled down: too few to tell"
    );
    cooled_for(litellm, pairs, 1, &refused, DAVE_RETRY_AFTER).await;
    for pair in pairs {
        pair.assert_idle().await;
    }
}
