//! THE request path, top to bottom:
//!
//! ```text
//! route (routes: slot in a dialect | passthrough | health | admin | host)
//!       -> intake (bounded body, JSON in the dialect) -> policy chain
//!       -> demand (slots, KV pool tokens) -> claim (tenant, cost, weight, priority)
//!       -> admission (slots and pool free, or the fair priority queue)
//!       -> upstream (retry only while nothing was sent) -> GuardedBody (stream, then release)
//! ```
//!
//! The exact prompt count (llama-server's count endpoints and `/tokenize`, see `cost`) stays off the
//! path of a request that gets a slot at once: it is forwarded on the estimate and settled from the
//! usage llama-server reports. A request that has to wait is counted while it waits, and its place in
//! the queue is re-costed. Only a chain with a policy that asks for the count (`needs_prompt_tokens`)
//! has every request counted before the chain runs.
//!
//! Each stage either hands the request on or ends it with a `GateError`, which `respond::error`
//! turns into the client's one response. No stage calls back into an earlier one.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use std::collections::BTreeMap;

use http::{header, HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use slotgate_sdk::{Decision, Peer, QueueSnapshot};
use tokio::time::Instant;

use crate::access::{CompletionHook, Exchange};
use crate::admission::{Claim, Entry, SlotGuard};
use crate::body::{GuardedBody, HoldSlot, ABANDON_GRACE};
use crate::cost::{self, Demand, Want};
use crate::dialect::DialectRef;
use crate::error::{GateError, Outcome};
use crate::intake::{self, Intake};
use crate::metrics as m;
use crate::policy::chain::ChainOutcome;
use crate::policy::{Chain, EvalError};
use crate::respond::{self, Body};
use crate::routes::{self, Handling};
use crate::stall::WriteWatch;
use crate::state::App;
use crate::stream_usage::StripUsage;
use crate::upstream::{copy_end_to_end, SendError};

/// Response header with the time the request waited for a slot.
pub const QUEUE_WAIT_HEADER: &str = "x-slotgate-queue-wait-ms";
/// Response header with the exact prompt tokens slotgate counted before admission, when it could.
pub const PROMPT_TOKENS_HEADER: &str = "x-slotgate-prompt-tokens";

/// First and largest pause between upstream attempts while it is down or loading.
const RETRY_BASE: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Longest hold of a slot whose request llama-server may still run after an upstream timeout.
const QUARANTINE_CAP: Duration = Duration::from_secs(30);
/// Retry-After when the upstream stayed unavailable for a whole queue deadline.
const UNAVAILABLE_RETRY_AFTER: u64 = 5;

pub async fn handle(app: Arc<App>, req: Request<Incoming>, peer: Option<Peer>) -> Response<Body> {
    let arrived = Instant::now();
    let origin = req.headers().get(header::ORIGIN).cloned();
    let handling = routes::find(req.method(), req.uri().path());
    // `/health` is answered from slotgate's own readiness, unlogged as llama-server leaves it.
    if let Ok(Handling::Health) = handling {
        return health(&app, origin.as_ref());
    }
    let mut ex = Exchange::new(req.method().clone(), req.uri().path(), peer);
    let watch = req.extensions().get::<WriteWatch>().cloned();
    let preflight = req.method() == http::Method::OPTIONS;
    let mut reply = Reply {
        app: &app,
        dialect: None,
        origin,
    };
    // Answered before the body was read to its end: the connection closes lingering, so a client
    // still writing its body gets to read the answer.
    let early = |ex, e: &GateError, reply: &Reply<'_>| {
        if let Some(w) = &watch {
            w.mark_unread_body();
        }
        reply.refuse(ex, e)
    };
    let named = || (req.method().to_string(), req.uri().path().to_owned());
    let handling = match handling {
        Ok(Handling::Admin) => {
            let (method, path) = named();
            return early(ex, &GateError::AdminOnly { method, path }, &reply);
        }
        Ok(Handling::Host) if !app.config.forward_host_endpoints => {
            let (method, path) = named();
            return early(ex, &GateError::HostEndpoint { method, path }, &reply);
        }
        Ok(h) => h,
        Err(e) => return early(ex, &e, &reply),
    };
    let slot_route = matches!(handling, Handling::Slot(_));
    if let Handling::Slot(d) = handling {
        reply.dialect = Some(d);
    }
    let mut intake = match intake::read(req, &app.limits, peer, handling).await {
        Ok(i) => i,
        Err(e @ (GateError::InvalidJson(_) | GateError::BodyTimeout(_))) => {
            return reply.refuse(ex, &e)
        }
        Err(e) => return early(ex, &e, &reply),
    };
    // One chain version decides this request and hears how it ended, whatever reloads meanwhile.
    // A CORS preflight carries no credentials and does nothing: no policy judges it.
    let chain = app.policies.current();
    let counted_first = slot_route && (app.config.count_first || chain.needs_prompt_tokens());
    if counted_first {
        if let Err(e) = count_prompt(&app, &mut intake, Before::Chain).await {
            return reply.refuse(ex, &e);
        }
    }
    let mut priority = match app.config.trust_client_priority {
        true => intake.summary.priority_hint.unwrap_or(0),
        false => 0,
    };
    let mut response_headers = BTreeMap::new();
    let mut decided = None;
    if !chain.is_empty() && !preflight {
        let (outcome, own) = decide(&app, &intake, chain.clone()).await;
        // Every policy that allowed hears how the request ended, even when a later one refused it:
        // what it took from a budget can be given back.
        if chain.wants_completion(&own) {
            ex.on_complete(CompletionHook {
                chain: chain.clone(),
                own,
                policies: app.policies.clone(),
                request: intake.summary.clone(),
                decision: outcome.decision(),
            });
        }
        // A fast evaluation may have been over before this task was suspended, so it could not
        // notice its client leave meanwhile: one yield lets hyper see a closed connection (and drop
        // this request, which tells the policies) before it can be admitted and forwarded.
        tokio::task::yield_now().await;
        match outcome {
            ChainOutcome::Allow(mut decision) => {
                // A policy's priority replaces the client's hint (policies clamp hints themselves).
                priority = decision.priority.unwrap_or(priority);
                if let Err(e) = intake.apply(&decision.mutations) {
                    return reply.refuse(ex, &e);
                }
                response_headers = std::mem::take(&mut decision.mutations.response_headers);
                decided = Some(decision);
            }
            ChainOutcome::Deny { policy, decision } => {
                // A policy's 429 is one tenant's budget, not this server's load: a router that cools
                // a deployment down on any 429 is given another status (`--policy-denial-status`).
                let status = match decision.status.unwrap_or(403) {
                    429 => app.config.policy_denial_status,
                    other => other,
                };
                let e = GateError::PolicyDenied {
                    status,
                    message: decision
                        .message
                        .unwrap_or_else(|| format!("denied by policy `{policy}`")),
                    retry_after: decision.retry_after_seconds,
                    policy,
                };
                return reply.refuse(ex, &e);
            }
            ChainOutcome::Failed { policy, error } => {
                return reply.refuse(
                    ex,
                    &GateError::PolicyFailed {
                        policy,
                        kind: error.kind(),
                    },
                );
            }
        }
    }
    ex.set_priority(priority);

    // The deadline runs from arrival: time spent queued and time spent waiting for a down upstream
    // share the one budget the client was promised.
    // A preflight is answered at once: by llama-server, or for it when it cannot (no retries).
    let deadline = match preflight {
        true => Instant::now(),
        false => arrived + app.config.queue_timeout,
    };
    let (slot, queue_wait) = if slot_route {
        // Again, after any policy capped max_tokens: what the scheduler charges up front and
        // holds (slots, pool tokens), and what `slotgate_tokens_reserved_total` counts.
        let demand = match demand_of(&app, &mut intake) {
            Ok(d) => d,
            Err(e) => return reply.refuse(ex, &e),
        };
        let claim = Claim::new(&intake.summary, decided.as_ref(), priority, demand.charge)
            .holding(demand.slots, demand.kv);
        ex.set_tenant(claim.tenant.clone());
        let admitted = admit(&app, &mut intake, claim, decided.as_ref(), demand, deadline);
        match admitted.await {
            Ok((slot, wait, demand)) => {
                ex.set_reserved(demand.reserved.unwrap_or(demand.charge));
                ex.set_prompt_tokens(intake.summary.prompt_tokens_best());
                (Some(slot), wait)
            }
            Err(e) => return reply.refuse(ex, &e),
        }
    } else {
        let claim = Claim::new(&intake.summary, decided.as_ref(), priority, 0);
        ex.set_tenant(claim.tenant);
        (None, Duration::ZERO)
    };
    ex.set_queue_wait(queue_wait);

    // Every chat stream reports its usage; the client still gets the stream it asked for.
    let strip_usage = match intake.ask_for_stream_usage() {
        Ok(asked) => asked,
        Err(e) => return reply.refuse(ex, &e),
    };
    let inflight = app.upstream.inflight_guard();
    let forwarded_at = Instant::now();
    let held = CancelGrace(slot);
    // A generation request goes out on a connection of its own when it streams (llama-server closes
    // it after the stream), or when reuse is off; a whole answer may reuse an idle one.
    let own_connection =
        slot_route && (intake.ask.stream || !app.config.upstream_reuse_connections);
    let resp = forward(&app, &intake, deadline, own_connection).await;
    let slot = held.disarm();
    let resp = match resp {
        Ok(resp) => resp,
        Err(e) => {
            match (slot, &e) {
                (Some(mut slot), GateError::UpstreamUnavailable { .. }) => {
                    // Never reached the upstream: nothing was served.
                    slot.settle(0);
                }
                // llama-server may still hold it, unread, if it is stopped rather than slow.
                (Some(slot), GateError::UpstreamTimeout(_)) => hold_until_dropped(&app, slot),
                _ => {}
            }
            // llama-server answers every preflight; while it cannot, slotgate answers as it would.
            if preflight {
                ex.set_status(200);
                ex.finish(Outcome::Ok);
                return app.cors.preflight(reply.origin.as_ref());
            }
            return reply.refuse(ex, &e);
        }
    };

    let (upstream_parts, body) = resp.into_parts();
    ex.set_status(upstream_parts.status.as_u16());
    let content_type = upstream_parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut out = Response::new(());
    *out.status_mut() = upstream_parts.status;
    copy_end_to_end(&upstream_parts.headers, out.headers_mut());
    out.headers_mut().insert(
        QUEUE_WAIT_HEADER,
        HeaderValue::from(queue_wait.as_millis() as u64),
    );
    if let Some(n) = intake.summary.prompt_tokens.filter(|_| slot_route) {
        out.headers_mut()
            .insert(PROMPT_TOKENS_HEADER, HeaderValue::from(n));
    }
    for (name, value) in response_headers {
        match (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            (Ok(n), Ok(v)) => {
                out.headers_mut().insert(n, v);
            }
            _ => {
                tracing::warn!(header = %name, "a policy asked for an invalid response header; skipped")
            }
        }
    }
    let guarded = GuardedBody::new(
        body,
        slot,
        inflight,
        ex,
        forwarded_at,
        content_type.as_deref(),
        intake.dialect,
    )
    .answered(upstream_parts.status)
    .resumable(slot_route && intake.parts.headers.contains_key("x-conversation-id"))
    .guarded(watch, app.config.upstream_idle_timeout)
    .on_upstream_timeout(app.clone());
    if strip_usage {
        return out.map(|()| StripUsage::new(guarded.boxed_unsync()).boxed_unsync());
    }
    out.map(|()| guarded.boxed_unsync())
}

/// How slotgate's own answers to one request are written: in its API's shape, with the CORS
/// headers llama-server would send.
struct Reply<'a> {
    app: &'a App,
    dialect: Option<DialectRef>,
    origin: Option<HeaderValue>,
}

impl Reply<'_> {
    fn refuse(&self, mut ex: Exchange, e: &GateError) -> Response<Body> {
        ex.set_status(e.status());
        ex.finish(e.outcome());
        if e.outcome() == Outcome::UpstreamError {
            tracing::warn!(error = %e, "upstream failure");
        }
        let mut resp = respond::error(e, self.dialect);
        self.app
            .cors
            .apply(self.origin.as_ref(), resp.headers_mut());
        resp
    }
}

/// llama-server's `/health`, from slotgate's readiness: 200 `{"status":"ok"}` while llama-server
/// is ready and slotgate is not draining, else 503 as llama-server answers while it loads.
fn health(app: &App, origin: Option<&HeaderValue>) -> Response<Body> {
    let ready = app.upstream.is_ready() && !app.admission.is_closed();
    let body = match ready {
        true => serde_json::json!({"status": "ok"}),
        false => {
            serde_json::json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
        }
    };
    let mut resp = respond::json(if ready { 200 } else { 503 }, &body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    app.cors.apply(origin, resp.headers_mut());
    resp
}

/// What a slot request holds while it runs (see `cost::demand`), with the counts it has (exact or
/// estimated) and the server as slotgate knows it now; the reservation goes into the summary.
fn demand_of(app: &App, intake: &mut Intake) -> Result<Demand, GateError> {
    let estimates: Vec<u64>;
    let (prompts, exact) = match &intake.prompt_counts {
        Some(counts) => (counts.as_slice(), true),
        None => {
            estimates = intake.ask.prompts.iter().map(|c| c.div_ceil(4)).collect();
            (estimates.as_slice(), false)
        }
    };
    let want = Want {
        prompts,
        exact,
        completions: intake.ask.completions,
        max_tokens: intake.ask.max_tokens,
        all_slots: intake.ask.all_slots,
    };
    let (ctx, upstream_slots) = app.capacity.now();
    let slots_known =
        upstream_slots.is_some() || matches!(app.config.slots, crate::config::Slots::Fixed(_));
    let demand = cost::demand(&want, app.admission.slots(), slots_known, ctx)?;
    intake.summary.reserved_tokens = demand.reserved;
    Ok(demand)
}

/// Holds the slot while the request is with the upstream and no answer has begun. If the client leaves
/// then, this future is dropped mid-request and the pooled client closes that upstream connection on
/// its own task, a moment later; the slot is handed on only after `ABANDON_GRACE`, so the next request
/// does not reach llama-server while it still works on the abandoned one. Normal completion and errors
/// take the slot back with `disarm`.
struct CancelGrace(Option<SlotGuard>);

impl CancelGrace {
    fn disarm(mut self) -> Option<SlotGuard> {
        self.0.take()
    }
}

impl Drop for CancelGrace {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.release_after(ABANDON_GRACE);
        }
    }
}

/// After an upstream timeout: the slot is handed on only once llama-server has dropped the request
/// slotgate gave up on (see `Upstream::dropped_below`), at most `QUARANTINE_CAP` later.
fn hold_until_dropped(app: &Arc<App>, slot: SlotGuard) {
    let app = app.clone();
    // The task owns the slot: it is released by its guard's Drop, also if the task never finishes.
    tokio::spawn(async move {
        tokio::time::sleep(ABANDON_GRACE).await;
        let admission = app.admission.clone();
        app.upstream
            .dropped_below(move || admission.stats().busy, QUARANTINE_CAP)
            .await;
        drop(slot);
    });
}

impl HoldSlot for App {
    fn hold(self: Arc<Self>, slot: SlotGuard) {
        hold_until_dropped(&self, slot);
    }
}

/// A slot for the request. Free, with nobody waiting: at once, charged on the estimate (the slot
/// settles from llama-server's usage). Else the request queues, and its prompt is counted while it
/// waits (unless the chain had it counted already): its place is then re-costed, so the fair-share
/// charge at admission, what it holds of the pool and the wait estimates (Retry-After, doomed
/// waits) of those behind it are exact, and a prompt that cannot fit a slot leaves the queue with
/// 400 instead of reaching llama-server. A slot granted before the count is back is taken at once,
/// on the estimate.
async fn admit(
    app: &App,
    intake: &mut Intake,
    claim: Claim,
    decided: Option<&Decision>,
    demand: Demand,
    deadline: Instant,
) -> Result<(SlotGuard, Duration, Demand), GateError> {
    let counted = intake.prompt_counts.is_some();
    let forwarded = |s: &slotgate_sdk::RequestSummary| {
        if !counted {
            cost::record(cost::Source::Forwarded, s.prompt_tokens_estimate, None);
        }
    };
    let mut demand = demand;
    let mut ticket = match app.admission.enter(claim, deadline)? {
        Entry::Admitted(slot) => {
            forwarded(&intake.summary);
            return Ok((slot, Duration::ZERO, demand));
        }
        Entry::Queued(ticket) => ticket,
    };
    if !counted {
        tokio::select! {
            biased;
            granted = ticket.wait(deadline) => {
                if granted.is_ok() {
                    forwarded(&intake.summary);
                }
                return granted.map(|(slot, wait)| (slot, wait, demand));
            }
            done = count_prompt(app, intake, Before::Slot) => demand = done?,
        }
        if intake.prompt_counts.is_some() {
            ticket.recost(
                Claim::cost_of(decided, demand.charge),
                demand.slots,
                demand.kv,
            );
        }
    }
    ticket
        .wait(deadline)
        .await
        .map(|(slot, wait)| (slot, wait, demand))
}

/// When a prompt is counted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Before {
    /// Before the chain runs, because a policy asked for the count.
    Chain,
    /// While the request waits in the queue.
    Slot,
}

/// Counts the prompt with llama-server's own endpoints (the estimate stands when it cannot) and
/// works out what the request holds. A prompt that exactly counted cannot fit a slot is refused
/// here, before it could take a slot.
async fn count_prompt(app: &App, intake: &mut Intake, when: Before) -> Result<Demand, GateError> {
    // Before the chain, with every slot busy and the queue full, the request will most likely be
    // turned away: keep that 429 fast and do not ask llama-server (the estimate stands).
    let q = app.admission.stats();
    let full = when == Before::Chain && q.busy >= q.slots && q.depth >= q.capacity;
    let (exact, source) = match (&intake.json, intake.dialect) {
        (Some(json), Some(d)) if !full => app.cost.prompt_tokens(d, json, &intake.body).await,
        _ => (None, cost::Source::Estimate),
    };
    let total = exact.as_ref().map(|c| c.iter().sum());
    cost::record(source, intake.summary.prompt_tokens_estimate, total);
    intake.summary.prompt_tokens = total;
    intake.prompt_counts = exact;
    demand_of(app, intake)
}

/// Runs the policy chain: on this async worker while the chain has always been fast
/// ([`Chain::runs_inline`]), else on the blocking pool. On the worker each evaluation runs on a
/// fiber and yields to the worker's other tasks at every epoch tick (1 ms), so even a runaway policy
/// holds up no other connection for longer than that, and a fast one costs only itself: no thread
/// hand-off (the blocking pool's cost ~35-50 us per request at p50 on 2 cores, and `block_in_place`,
/// which hands the worker's other tasks to another thread, about as much under load; measured by
/// `sidecar/benches/policy_eval.rs` and `scripts/bench.sh`). A chain moves to the blocking pool for
/// good once an evaluation used more than `INLINE_LIMIT` (3 ms) of CPU or ran out of fuel or time.
async fn decide(
    app: &App,
    intake: &Intake,
    chain: Arc<Chain>,
) -> (ChainOutcome, Vec<Option<Decision>>) {
    let mut summary = intake.summary.clone();
    let q = app.admission.stats();
    summary.queue = QueueSnapshot {
        depth: q.depth,
        capacity: q.capacity,
        in_flight: q.busy,
        estimated_wait_seconds: q.drain_seconds(),
    };
    let turn = app.policies.turn().await;
    // In a task of its own, so that a client that leaves meanwhile (its request's future is dropped)
    // cancels nothing: a policy that has taken from a budget always finishes, and hears (`on_complete`,
    // outcome `client_gone`) that the request was never served, so what it took is given back.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let policies = app.policies.clone();
    let summary = Arc::new(summary);
    tokio::spawn(async move {
        let evaluated = if chain.runs_inline() {
            let evaluated = AssertUnwindSafe(chain.evaluate_each_async(&summary))
                .catch_unwind()
                .await
                .map_err(|_| ());
            drop(turn);
            evaluated
        } else {
            let (chain, summary) = (chain.clone(), summary.clone());
            let evaluate = move || {
                let _turn = turn;
                chain.evaluate_each(&summary)
            };
            tokio::task::spawn_blocking(evaluate).await.map_err(|_| ())
        };
        if let Err(Ok((outcome, own))) = tx.send(evaluated) {
            if chain.wants_completion(&own) {
                let hook = CompletionHook {
                    chain,
                    own,
                    policies,
                    request: Arc::unwrap_or_clone(summary),
                    decision: outcome.decision(),
                };
                hook.fire(0, Outcome::ClientGone, Default::default(), 0, 0);
            }
        }
    });
    let evaluated = rx.await.unwrap_or(Err(()));
    evaluated.unwrap_or_else(|()| {
        (
            ChainOutcome::Failed {
                policy: "-".into(),
                error: EvalError::Trap("the policy host panicked".into()),
            },
            Vec::new(),
        )
    })
}

/// Sends the request, retrying with exponential backoff and jitter only while the upstream is
/// unreachable or loading (nothing was processed), until the request's deadline. With
/// `own_connection` it goes out on a connection of its own (see `Upstream::send`).
async fn forward(
    app: &App,
    intake: &Intake,
    deadline: Instant,
    own_connection: bool,
) -> Result<Response<Body>, GateError> {
    let path_and_query = intake
        .parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str());
    let mut attempt: u32 = 0;
    loop {
        let send = app.upstream.send(
            &intake.parts.method,
            path_and_query,
            &intake.parts.headers,
            intake.body.clone(),
            own_connection,
        );
        // Dropping the attempt closes its connection: llama-server stops once it notices.
        let sent = match app.config.upstream_first_byte_timeout {
            Some(limit) => match tokio::time::timeout(limit, send).await {
                Ok(sent) => sent,
                Err(_) => return Err(GateError::UpstreamTimeout(limit)),
            },
            None => send.await,
        };
        let err = match sent {
            Ok(resp) => return Ok(resp),
            Err(e @ SendError::Failed(_)) => return Err(GateError::Upstream(e.to_string())),
            Err(e) => e,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(GateError::UpstreamUnavailable {
                reason: err.to_string(),
                retry_after: UNAVAILABLE_RETRY_AFTER,
            });
        }
        let pause = backoff(attempt).min(deadline - now);
        tracing::debug!(attempt, error = %err, pause_ms = pause.as_millis() as u64, "upstream unavailable; retrying");
        metrics::counter!(m::UPSTREAM_RETRIES_TOTAL).increment(1);
        tokio::time::sleep(pause).await;
        attempt = attempt.saturating_add(1);
    }
}

/// `min(50ms * 2^n, 2s)`, then "equal jitter": a uniform pick from the upper half.
fn backoff(attempt: u32) -> Duration {
    let exp = RETRY_BASE
        .saturating_mul(1u32 << attempt.min(16))
        .min(RETRY_MAX);
    exp / 2 + exp.mul_f64(fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped_with_jitter() {
        for _ in 0..100 {
            let first = backoff(0);
            assert!(
                first >= Duration::from_millis(25) && first <= Duration::from_millis(50),
                "{first:?}"
            );
            let late = backoff(30);
            assert!(
                late >= Duration::from_secs(1) && late <= RETRY_MAX,
                "{late:?}"
            );
        }
    }
}
