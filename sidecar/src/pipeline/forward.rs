//! The forward phase: the request goes to llama-server, retried with backoff only while nothing
//! was sent (unreachable or loading), until its deadline. The slot is this phase's until an answer
//! has begun; then the body phase holds it.

use std::time::Duration;

use tokio::time::Instant;

use crate::admission::SlotGuard;
use crate::error::GateError;
use crate::metrics as m;
use crate::respond::Body;
use crate::state::App;
use crate::upstream::quarantine::ABANDON_GRACE;
use crate::upstream::{InflightGuard, SendError};

use super::access::Exchange;
use super::admit::Admitted;
use super::intake::Intake;
use super::{Ctx, Shed};

/// First and largest pause between upstream attempts while it is down or loading.
const RETRY_BASE: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Retry-After when the upstream stayed unavailable for a whole queue deadline.
const UNAVAILABLE_RETRY_AFTER: u64 = 5;

/// An answer has begun: what the body phase holds while it streams.
pub(super) struct Sent {
    pub response: http::Response<Body>,
    pub slot: Option<SlotGuard>,
    pub inflight: InflightGuard,
    pub queue_wait: Duration,
    pub forwarded_at: Instant,
    /// slotgate asked for the stream's usage; the client did not, so it is taken out again.
    pub strip_usage: bool,
    /// The trace's client span of the request to llama-server, ended with the answer.
    pub span: tracing::Span,
}

/// What every attempt to forward the request shares: begun once, after admission.
pub(super) struct Forwarding {
    inflight: InflightGuard,
    strip_usage: bool,
    own_connection: bool,
    span: tracing::Span,
}

/// How one attempt ended (an upstream that stays unavailable or fails is an error).
pub(super) enum Attempt {
    /// An answer has begun.
    Answered(Sent),
    /// Told to yield its slot before its answer began: for `admit::again`.
    Shed(Forwarding, Shed),
}

/// Gets the request ready to go: every chat stream reports its usage (the client still gets the
/// stream it asked for), and traced, llama-server gets this span's context as its `traceparent`
/// (else the caller's, as it came).
pub(super) fn begin(
    app: &App,
    intake: &mut Intake,
    ctx: &Ctx,
    ex: &Exchange,
) -> Result<Forwarding, GateError> {
    let strip_usage = intake.ask_for_stream_usage()?;
    let inflight = app.upstream.inflight_guard();
    // A generation request goes out on a connection of its own when it streams (llama-server closes
    // it after the stream), or when reuse is off; a whole answer may reuse an idle one.
    let own_connection =
        ctx.slot_route && (intake.ask.stream || !app.config.upstream_reuse_connections);
    let span = crate::otel::upstream(
        ex.span(),
        intake.dialect.map(|d| d.name()),
        intake.summary.model.as_deref(),
        &mut intake.parts.headers,
    );
    Ok(Forwarding {
        inflight,
        strip_usage,
        own_connection,
        span,
    })
}

/// One attempt: sent (retried while the upstream is unavailable), until an answer begins, it fails,
/// or a sheddable request is told to yield its slot first.
pub(super) async fn attempt(
    app: &App,
    intake: &Intake,
    going: Forwarding,
    admitted: Admitted,
    ex: &mut Exchange,
) -> Result<Attempt, GateError> {
    let forwarded_at = Instant::now();
    let mut held = CancelGrace(admitted.slot);
    let step = tokio::select! {
        biased;
        sent = send(app, intake, admitted.deadline, going.own_connection, admitted.no_autoload) => Some(sent),
        // Sheddable and told to yield before its answer began: the attempt is dropped, which
        // closes its connection (llama-server stops once it notices).
        _ = told_to_yield(held.0.as_mut()) => None,
    };
    let mut slot = held.disarm();
    let admitted = Admitted {
        slot: None,
        ..admitted
    };
    let response = match step {
        Some(Ok(resp)) => resp,
        Some(Err(e)) => return Err(failed(app, &going.span, slot, e)),
        None => {
            let slot = slot.expect("only a request holding a slot is told to yield");
            return Ok(Attempt::Shed(going, Shed { slot, admitted }));
        }
    };
    if let Some(s) = slot.as_mut() {
        if !answers(s, &response) {
            drop(response);
            let slot = slot.expect("checked above");
            return Ok(Attempt::Shed(going, Shed { slot, admitted }));
        }
    }
    ex.set_status(response.status().as_u16());
    let Forwarding {
        inflight,
        strip_usage,
        span,
        ..
    } = going;
    if !span.is_disabled() {
        span.record(
            "http.response.status_code",
            i64::from(response.status().as_u16()),
        );
    }
    Ok(Attempt::Answered(Sent {
        span,
        response,
        slot,
        inflight,
        queue_wait: admitted.queue_wait,
        forwarded_at,
        strip_usage,
    }))
}

/// Whether the answer that has begun is the client's. Told to yield as it came: a whole answer is
/// finished, and is answered (its slots are free as soon as it is written) rather than generated
/// again; a stream has sent nothing to the client yet, and goes back to the queue.
fn answers(slot: &mut SlotGuard, response: &http::Response<Body>) -> bool {
    let stream = crate::dialect::is_event_stream(
        response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    if slot.answering(stream) {
        return true;
    }
    slot.try_shed();
    !stream
}

/// A request that could not be forwarded: its slot settled as never served, or held in quarantine
/// while llama-server may still hold it.
fn failed(app: &App, span: &tracing::Span, slot: Option<SlotGuard>, e: GateError) -> GateError {
    if !span.is_disabled() {
        span.record("error.type", e.outcome().label());
        span.record("otel.status_code", "error");
    }
    match (slot, &e) {
        // Never reached the upstream: nothing was served.
        (Some(mut slot), GateError::UpstreamUnavailable { .. }) => slot.settle(0),
        // llama-server may still hold it, unread, if it is stopped rather than slow.
        (Some(slot), GateError::UpstreamTimeout(_)) => app.quarantine.hold(slot),
        _ => {}
    }
    e
}

/// Ready when a sheddable request is told to yield its slot; never without a slot.
async fn told_to_yield(slot: Option<&mut SlotGuard>) {
    match slot {
        Some(s) => {
            s.shed().await;
        }
        None => std::future::pending().await,
    }
}

/// Holds the slot while the request is with the upstream and no answer has begun. If the client
/// leaves then, this future is dropped mid-request and the pooled client closes that upstream
/// connection on its own task, a moment later; the slot is handed on only after `ABANDON_GRACE`, so
/// the next request does not reach llama-server while it still works on the abandoned one. Normal
/// completion and errors take the slot back with `disarm`.
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

/// Sends the request, retrying with exponential backoff and jitter only while the upstream is
/// unreachable or loading (nothing was processed), until the request's deadline. With
/// `own_connection` it goes out on a connection of its own (see `Upstream::send`).
async fn send(
    app: &App,
    intake: &Intake,
    deadline: Instant,
    own_connection: bool,
    no_autoload: bool,
) -> Result<http::Response<Body>, GateError> {
    let path_and_query = intake
        .parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str());
    let with_param;
    let path_and_query = match no_autoload {
        true => {
            let sep = if path_and_query.contains('?') {
                '&'
            } else {
                '?'
            };
            with_param = format!("{path_and_query}{sep}autoload=false");
            with_param.as_str()
        }
        false => path_and_query,
    };
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
        // Never reachable since slotgate started (a wrong address, a server not started): no use
        // waiting the whole deadline for it. Once it has answered at all, it is waited for.
        if let Some(why) = app.upstream.never_reachable() {
            return Err(GateError::UpstreamUnavailable {
                reason: format!(
                    "upstream {} has never been reachable: {why}",
                    app.upstream.target()
                ),
                retry_after: UNAVAILABLE_RETRY_AFTER,
            });
        }
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
