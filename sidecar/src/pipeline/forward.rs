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
use super::Ctx;

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

pub(super) async fn forward(
    app: &App,
    intake: &mut Intake,
    admitted: Admitted,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<Sent, GateError> {
    let Admitted {
        slot,
        mut queue_wait,
        mut deadline,
        no_autoload,
    } = admitted;
    // Every chat stream reports its usage; the client still gets the stream it asked for.
    let strip_usage = intake.ask_for_stream_usage()?;
    let inflight = app.upstream.inflight_guard();
    let mut forwarded_at = Instant::now();
    // A generation request goes out on a connection of its own when it streams (llama-server closes
    // it after the stream), or when reuse is off; a whole answer may reuse an idle one.
    let own_connection =
        ctx.slot_route && (intake.ask.stream || !app.config.upstream_reuse_connections);
    // Traced, llama-server gets this span's context as its `traceparent`; else the caller's, as it
    // came.
    let span = crate::otel::upstream(
        ex.span(),
        intake.dialect.map(|d| d.name()),
        intake.summary.model.as_deref(),
        &mut intake.parts.headers,
    );
    let mut slot = slot;
    let sent = loop {
        let mut held = CancelGrace(slot);
        let step = tokio::select! {
            biased;
            sent = send(app, intake, deadline, own_connection, no_autoload) => Some(sent),
            // Sheddable and told to yield before its answer began: the attempt is dropped, which
            // closes its connection (llama-server stops once it notices).
            _ = told_to_yield(held.0.as_mut()) => None,
        };
        slot = held.disarm();
        match step {
            Some(Ok(resp)) => {
                let Some(s) = slot.as_mut() else {
                    break Ok(resp);
                };
                let stream = crate::dialect::is_event_stream(
                    resp.headers()
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok()),
                );
                if s.answering(stream) {
                    break Ok(resp);
                }
                // Told to yield as the answer came. A whole answer is finished: it is answered
                // (its slots are free as soon as it is written) rather than generated again. A
                // stream has sent nothing to the client yet: it goes back to the queue.
                s.try_shed();
                if !stream {
                    break Ok(resp);
                }
                drop(resp);
            }
            Some(Err(e)) => break Err(e),
            None => {}
        }
        // Back to its place in the queue, unanswered; then forwarded again, whole.
        let Some(shed) = slot.take() else {
            unreachable!("only a request holding a slot is told to yield");
        };
        let mut ticket = match shed.requeue(ABANDON_GRACE) {
            Ok(ticket) => ticket,
            Err(kept) => {
                slot = Some(*kept);
                continue;
            }
        };
        ex.shed();
        let timeout = intake
            .pool
            .get()
            .map_or(app.config.queue_timeout, |p| p.queue_timeout);
        deadline = Instant::now() + timeout;
        tracing::debug!(request_id = %ex.request_id(), "shed before its first byte: queued again");
        let (again, waited) = ticket.wait(deadline).await?;
        queue_wait += waited;
        ex.set_total_queue_wait(queue_wait);
        ex.live().readmitted();
        slot = Some(again);
        forwarded_at = Instant::now();
    };
    match sent {
        Ok(response) => {
            ex.set_status(response.status().as_u16());
            if !span.is_disabled() {
                span.record(
                    "http.response.status_code",
                    i64::from(response.status().as_u16()),
                );
            }
            Ok(Sent {
                span,
                response,
                slot,
                inflight,
                queue_wait,
                forwarded_at,
                strip_usage,
            })
        }
        Err(e) => {
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
            Err(e)
        }
    }
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
