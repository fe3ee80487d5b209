//! The decide phase: the policy chain judges the request. Allowed, its changes are applied to the
//! client's bytes and its priority replaces the client's hint; denied or failed, it is refused.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::FutureExt;
use slotgate_sdk::{Decision, QueueSnapshot, RequestSummary};

use crate::error::{DenialDetail, GateError, Outcome};
use crate::policy::complete::CompletionHook;
use crate::policy::fold::ChainOutcome;
use crate::policy::{Chain, EvalError, PolicySet};
use crate::state::App;

use super::access::Exchange;
use super::intake::Intake;
use super::Ctx;

/// What the chain decided for an allowed request.
pub(super) struct Decided {
    pub priority: i64,
    /// Its own deadline, from arrival: the client's header or a policy's, the shorter.
    pub deadline: Option<std::time::Duration>,
    /// The decision the chain came to, when there was a chain.
    pub decision: Option<Decision>,
    /// Headers the policies add to the response.
    pub response_headers: BTreeMap<String, String>,
}

pub(super) async fn decide(
    app: &App,
    intake: &mut Intake,
    chain: Arc<Chain>,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<Decided, GateError> {
    let hint = intake
        .summary
        .priority_hint
        .filter(|_| app.config.trust_client_priority);
    // A key's priority is its caller's; a trusted hint may only ask to wait longer.
    let own = ctx
        .named
        .as_ref()
        .and_then(|n| n.key.as_ref()?.record.priority);
    let decided = Decided {
        priority: match (own, hint) {
            (Some(p), Some(h)) => h.max(p),
            (Some(p), None) => p,
            (None, h) => h.unwrap_or(0),
        },
        deadline: intake
            .summary
            .deadline_ms
            .map(std::time::Duration::from_millis),
        decision: None,
        response_headers: BTreeMap::new(),
    };
    if chain.is_empty() || ctx.preflight {
        return Ok(decided);
    }
    let now = crate::budgets::wall_ms().max(0) as u64;
    let (outcome, own, summary) = evaluate(app, intake, chain.clone(), now).await;
    if let Some(entries) = monitored(&chain, &own) {
        ex.set_monitor(entries);
    }
    // Every policy that allowed hears how the request ended, even when a later one refused it:
    // what it took from a budget can be given back.
    if chain.wants_completion(&own) {
        ex.on_complete(CompletionHook {
            chain: chain.clone(),
            own,
            policies: app.policies.clone(),
            request: summary,
            decision: outcome.decision(),
            evaluated_unix_ms: now,
            cached_weight: Some(app.config.cached_token_weight).filter(|w| *w != 1.0),
        });
    }
    // A fast evaluation may have been over before this task was suspended, so it could not
    // notice its client leave meanwhile: one yield lets hyper see a closed connection (and drop
    // this request, which tells the policies) before it can be admitted and forwarded.
    tokio::task::yield_now().await;
    match outcome {
        ChainOutcome::Allow(decision) => allowed(intake, decided, decision, now),
        ChainOutcome::Deny { policy, decision } => Err(denied(app, intake, policy, decision, now)),
        ChainOutcome::Failed { policy, error } => Err(GateError::PolicyFailed {
            policy,
            kind: error.kind(),
        }),
    }
}

/// What each monitor-mode policy would have done, for the access line's `monitor` field: entries
/// in chain order, one space apart, each `NAME:allow`, `NAME:deny:STATUS:REASON:"MESSAGE"` (`-` for
/// a reason it did not give, the message as a JSON string, left out with its colon when none) or
/// `NAME:error` (its evaluation failed). `None` for a chain with no monitor-mode policy.
fn monitored(chain: &Chain, own: &[Option<Decision>]) -> Option<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (p, d) in chain.policies().zip(own) {
        if p.mode != crate::policy::fold::Mode::Monitor {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&p.name);
        match d {
            None => out.push_str(":error"),
            Some(d) if d.verdict == slotgate_sdk::Verdict::Allow => out.push_str(":allow"),
            Some(d) => {
                let reason = d.reason.as_deref().unwrap_or("-");
                let _ = write!(out, ":deny:{}:{reason}", d.status.unwrap_or(403));
                if let Some(m) = &d.message {
                    out.push(':');
                    out.push_str(&serde_json::Value::from(m.as_str()).to_string());
                }
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// An allowed request: its changes applied to the client's bytes, its priority and deadline the
/// chain's, and the headers its answer will carry.
fn allowed(
    intake: &mut Intake,
    mut decided: Decided,
    mut decision: Decision,
    now: u64,
) -> Result<Decided, GateError> {
    // A policy's priority replaces the client's hint (policies clamp hints themselves).
    decided.priority = decision.priority.unwrap_or(decided.priority);
    // 0 (no deadline) was left out by the chain.
    if let Some(ms) = decision.deadline_ms {
        let theirs = std::time::Duration::from_millis(ms);
        decided.deadline = Some(decided.deadline.map_or(theirs, |d| d.min(theirs)));
    }
    intake.apply(&decision.mutations)?;
    decided.response_headers = std::mem::take(&mut decision.mutations.response_headers);
    rate_limit_headers(intake, &decision, now, &mut decided.response_headers);
    decided.decision = Some(decision);
    Ok(decided)
}

/// A denied request's refusal, with the policy's status, message, reason and headers.
fn denied(
    app: &App,
    intake: &Intake,
    policy: String,
    mut decision: Decision,
    now: u64,
) -> GateError {
    // A policy's 429 is one tenant's budget, not this server's load: a router that cools a
    // deployment down on any 429 is given another status (`--policy-denial-status`).
    let status = match decision.status.unwrap_or(403) {
        429 => app.config.policy_denial_status,
        other => other,
    };
    let mut headers = std::mem::take(&mut decision.mutations.response_headers);
    rate_limit_headers(intake, &decision, now, &mut headers);
    if let Some(retry) = decision.should_retry {
        headers.insert("x-should-retry".into(), retry.to_string());
    }
    let reason = decision.reason.take().filter(|r| {
        let ok = slotgate_sdk::host::is_event_name(r);
        if !ok {
            tracing::warn!(policy = %policy, reason = %r, "a policy's denial reason is not [a-z0-9_], at most 64 bytes; policy_denied is sent");
        }
        ok
    });
    GateError::PolicyDenied {
        status,
        message: decision
            .message
            .unwrap_or_else(|| format!("denied by policy `{policy}`")),
        retry_after: decision.retry_after_seconds,
        policy,
        detail: Box::new(DenialDetail { reason, headers }),
    }
}

/// The allowance the chain reported, as headers in the names of the request's API.
fn rate_limit_headers(
    intake: &Intake,
    decision: &Decision,
    now: u64,
    out: &mut BTreeMap<String, String>,
) {
    if decision.rate_limits.is_empty() {
        return;
    }
    let now = now as i64;
    match intake.dialect {
        Some(d) => d.rate_limit_headers(&decision.rate_limits, now, out),
        None => crate::dialect::ratelimit::openai(&decision.rate_limits, now, out),
    }
}

/// The price of the model the request will be booked under (the router's model it is queued for,
/// else the one llama-server serves), for a money budget's estimate: a field in v1's input and the
/// host's header in contract 2.0.0's.
fn price(app: &App, summary: &mut RequestSummary, router_model: Option<&str>) {
    let model = app.ledger.served(router_model);
    let prices = &app.config.prices;
    let Some(p) = prices.of(&model) else { return };
    let price = slotgate_sdk::Price {
        currency: prices.currency.clone(),
        input: p.input,
        cached_input: p.cached_input.unwrap_or(p.input),
        output: p.output,
    };
    if let Ok(json) = serde_json::to_string(&price) {
        summary
            .headers
            .insert(slotgate_sdk::PRICE_HEADER.to_owned(), json);
    }
    summary.price = Some(price);
}

/// Runs the policy chain: on this async worker while the chain has always been fast
/// ([`Chain::runs_inline`]), else on the blocking pool. On the worker each evaluation runs on a
/// fiber and yields to the worker's other tasks at every epoch tick (1 ms), so even a runaway policy
/// holds up no other connection for longer than that, and a fast one costs only itself: no thread
/// hand-off (the blocking pool's cost ~35-50 us per request at p50 on 2 cores, and `block_in_place`,
/// which hands the worker's other tasks to another thread, about as much under load; measured by
/// `sidecar/benches/policy_eval.rs` and `scripts/bench.sh`). A chain moves to the blocking pool for
/// good once an evaluation used more than `INLINE_LIMIT` (3 ms) of CPU or ran out of fuel or time.
///
/// The evaluation is polled from this request's own task, not spawned: a fast chain is over within
/// its first poll, with no task, channel or copy of the summary. Should the client leave while it
/// is suspended (an epoch yield, or waiting for the blocking pool), [`Orphan`] hands the rest to a
/// task of its own, so a policy that has taken from a budget always finishes, and hears
/// (`on_complete`, outcome `client_gone`) that the request was never served. Returns the summary
/// the chain saw (with the queue's figures), for the completion.
async fn evaluate(
    app: &App,
    intake: &Intake,
    chain: Arc<Chain>,
    now: u64,
) -> (ChainOutcome, Vec<Option<Decision>>, RequestSummary) {
    let mut summary = intake.summary.clone();
    let pool = intake.model_pool(app);
    if app.config.prices.any() {
        price(app, &mut summary, pool.as_ref().map(|p| p.id.as_str()));
    }
    let q = pool
        .as_ref()
        .map_or(&app.admission, |p| &p.admission)
        .stats();
    summary.queue = QueueSnapshot {
        depth: q.depth,
        capacity: q.capacity,
        in_flight: q.busy,
        estimated_wait_seconds: q.drain_seconds(),
    };
    let turn = app.policies.turn().await;
    let job: Job = if chain.runs_inline() {
        let chain = chain.clone();
        Box::pin(async move {
            let evaluated = AssertUnwindSafe(chain.evaluate_each_async_at(&summary, now))
                .catch_unwind()
                .await
                .map_err(|_| ());
            drop(turn);
            (evaluated, summary)
        })
    } else {
        let chain = chain.clone();
        Box::pin(async move {
            let summary = Arc::new(summary);
            let seen = summary.clone();
            let evaluate = move || {
                let _turn = turn;
                chain.evaluate_each_at(&seen, now)
            };
            let evaluated = tokio::task::spawn_blocking(evaluate).await.map_err(|_| ());
            (evaluated, Arc::unwrap_or_clone(summary))
        })
    };
    let mut orphan = Orphan {
        job: Some(job),
        chain,
        policies: app.policies.clone(),
        now,
    };
    let (evaluated, summary) = std::future::poll_fn(|cx| {
        let job = orphan.job.as_mut().expect("polled until ready, then taken");
        let ready = std::task::ready!(job.as_mut().poll(cx));
        orphan.job = None;
        std::task::Poll::Ready(ready)
    })
    .await;
    let (outcome, own) = evaluated.unwrap_or_else(|()| {
        (
            ChainOutcome::Failed {
                policy: "-".into(),
                error: EvalError::Trap("the policy host panicked".into()),
            },
            Vec::new(),
        )
    });
    (outcome, own, summary)
}

/// An evaluation in progress, and the summary it judges (given back at the end).
type Job = Pin<
    Box<
        dyn Future<
                Output = (
                    Result<(ChainOutcome, Vec<Option<Decision>>), ()>,
                    RequestSummary,
                ),
            > + Send,
    >,
>;

/// An evaluation whose request may be dropped before it is over (its client left).
struct Orphan {
    /// `None` once it has been polled to the end.
    job: Option<Job>,
    chain: Arc<Chain>,
    policies: PolicySet,
    now: u64,
}

impl Drop for Orphan {
    /// Finishes an evaluation left mid-way in a task of its own, and tells every policy that
    /// allowed the request that it was never served.
    fn drop(&mut self) {
        let Some(job) = self.job.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (chain, policies, now) = (self.chain.clone(), self.policies.clone(), self.now);
        rt.spawn(async move {
            let (Ok((outcome, own)), request) = job.await else {
                return;
            };
            if chain.wants_completion(&own) {
                let hook = CompletionHook {
                    decision: outcome.decision(),
                    chain,
                    own,
                    policies,
                    request,
                    evaluated_unix_ms: now,
                    cached_weight: None,
                };
                hook.fire(0, Outcome::ClientGone, Default::default(), None, 0, 0);
            }
        });
    }
}
