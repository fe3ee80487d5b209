//! GuardedBody: streams the upstream's response to the client while holding the request's slot,
//! in-flight count and access record, and settles all three when the stream ends, fails or is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::admission::SlotGuard;
use crate::dialect::usage::{Usage, UsageScanner};
use crate::dialect::{self, DialectRef};
use crate::error::Outcome;
use crate::live::Phase;
use crate::metrics as m;
use crate::pipeline::access::Exchange;
use crate::respond::{self, Body, BodyError};
use crate::server::write_watch::WriteWatch;
use crate::upstream::quarantine::{Quarantine, ABANDON_GRACE};
use crate::upstream::InflightGuard;

pub struct GuardedBody {
    inner: Body,
    /// Everything released when the response is over. `None` once settled.
    held: Option<Held>,
    forwarded_at: Instant,
    first_byte: bool,
    usage: UsageScanner,
    /// Why the client's connection may go away: cut for not reading, rather than gone.
    watch: Option<WriteWatch>,
    idle: Option<IdleTimer>,
    /// Takes the slot after an upstream timeout, instead of the usual hand-over.
    on_upstream_timeout: Option<Arc<Quarantine>>,
    /// llama-server's status: a refusal (4xx) or a failure (5xx) served nothing, whatever its body.
    status: http::StatusCode,
    /// The request named a conversation (`X-Conversation-Id`): llama-server finishes its answer
    /// into a session the client can resume (`GET /v1/stream`) even after the client has left.
    resumable: bool,
    /// The client has left a resumable answer: it is read to its end in the background, holding
    /// the slot, and recorded as `client_gone` with the usage it really had.
    client_left: bool,
    /// The trace's span of the request to llama-server: the first token is an event on it, and it
    /// ends with the answer.
    trace: tracing::Span,
    /// Its API, and whether the answer is a stream of events: how a shed answer is ended.
    dialect: Option<DialectRef>,
    sse: bool,
    /// Shed mid-answer: how far its end has gone (see [`Ending`]).
    ending: Ending,
    /// The last bytes passed on stopped inside an event: a shed waits for its end, so the error
    /// event is never glued to half of another.
    mid_event: bool,
    /// Told to yield while `mid_event`: ended at the event's end.
    shed_due: Option<crate::admission::Shed>,
}

/// What polling a body for its next frame gives.
type Polled = Poll<Option<Result<Frame<Bytes>, BodyError>>>;

/// The end of a shed answer: its error event, a pause for it to be written out (hyper flushes
/// while the body is pending, and drops what is unwritten when the body fails), then the abort.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    No,
    EventSent,
    Flushed,
}

/// The error that aborts a shed answer after its error event.
#[derive(Debug, thiserror::Error)]
#[error("the answer of a sheddable request was ended for a more urgent request (shed)")]
pub struct ShedAbort;

/// `--upstream-idle-timeout`: armed at the last frame, checked only while waiting for the next one.
/// The timer is moved on lazily, when it fires, rather than reset for every streamed token.
struct IdleTimer {
    limit: Duration,
    last_frame: Instant,
    sleep: Pin<Box<Sleep>>,
}

impl IdleTimer {
    fn new(limit: Duration) -> Self {
        let now = Instant::now();
        IdleTimer {
            limit,
            last_frame: now,
            sleep: Box::pin(tokio::time::sleep_until(now + limit)),
        }
    }

    /// Ready once llama-server has been silent for the whole limit.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            std::task::ready!(self.sleep.as_mut().poll(cx));
            let due = self.last_frame + self.limit;
            if Instant::now() >= due {
                return Poll::Ready(());
            }
            self.sleep.as_mut().reset(due);
        }
    }
}

/// The error that aborts a client's response when llama-server went silent.
#[derive(Debug, thiserror::Error)]
#[error("llama-server sent nothing for {0:?} mid-answer (upstream idle timeout)")]
pub struct UpstreamIdle(Duration);

struct Held {
    slot: Option<SlotGuard>,
    _inflight: InflightGuard,
    exchange: Exchange,
}

impl GuardedBody {
    pub fn new(
        inner: Body,
        slot: Option<SlotGuard>,
        inflight: InflightGuard,
        exchange: Exchange,
        forwarded_at: Instant,
        content_type: Option<&str>,
        dialect: Option<DialectRef>,
    ) -> Self {
        GuardedBody {
            inner,
            held: Some(Held {
                slot,
                _inflight: inflight,
                exchange,
            }),
            forwarded_at,
            first_byte: false,
            usage: UsageScanner::new(content_type, dialect.unwrap_or(dialect::CHAT)),
            dialect,
            sse: dialect::is_event_stream(content_type),
            ending: Ending::No,
            mid_event: false,
            shed_due: None,
            watch: None,
            idle: None,
            on_upstream_timeout: None,
            status: http::StatusCode::OK,
            resumable: false,
            client_left: false,
            trace: tracing::Span::none(),
        }
    }

    /// The trace's span of the request to llama-server, ended with the answer.
    pub fn traced(mut self, span: tracing::Span) -> Self {
        self.trace = span;
        self
    }

    /// The request named a conversation: its answer outlives its client (see `resumable`).
    pub fn resumable(mut self, resumable: bool) -> Self {
        self.resumable = resumable;
        self
    }

    /// llama-server's status: a refusal or a failure is no success, whatever it streams.
    pub fn answered(mut self, status: http::StatusCode) -> Self {
        self.status = status;
        self
    }

    /// Who takes the slot when llama-server went silent mid-answer: it may still hold the request.
    pub fn on_upstream_timeout(mut self, quarantine: Arc<Quarantine>) -> Self {
        self.on_upstream_timeout = Some(quarantine);
        self
    }

    /// Arms the stall and silence guards: `watch` tells a client cut for not reading from one that
    /// left, and `idle_timeout` bounds llama-server's silence mid-answer.
    pub fn guarded(mut self, watch: Option<WriteWatch>, idle_timeout: Option<Duration>) -> Self {
        self.watch = watch;
        self.idle = idle_timeout.map(IdleTimer::new);
        self
    }

    /// Releases the slot and records the request's fate. Runs at most once.
    fn settle(&mut self, outcome: Outcome) {
        let Some(mut held) = self.held.take() else {
            return;
        };
        // Delivered whole, but a refusal or a failure of llama-server's own: nothing was served.
        let outcome = match outcome {
            Outcome::Ok if self.status.is_server_error() => Outcome::Upstream5xx,
            Outcome::Ok if self.status.is_client_error() => Outcome::Upstream4xx,
            other => other,
        };
        if matches!(outcome, Outcome::Upstream5xx | Outcome::Upstream4xx) {
            if outcome == Outcome::Upstream5xx {
                tracing::warn!(
                    status = self.status.as_u16(),
                    "llama-server answered with a server error"
                );
            }
            if let Some(slot) = held.slot.as_mut() {
                slot.settle(0);
            }
        }
        let elapsed = self.forwarded_at.elapsed();
        held.exchange.set_upstream_time(elapsed);
        if !self.trace.is_disabled() {
            self.trace_end(outcome);
        }
        m::hot().upstream_seconds.record(elapsed.as_secs_f64());
        // Only work a slot did is counted: a passthrough that replays a stream (`GET /v1/stream`)
        // carries the usage of a generation counted already.
        if outcome == Outcome::Ok && held.slot.is_some() {
            let usage = self.usage.finish();
            if let Some(u) = usage {
                held.exchange.set_usage(u);
                m::hot().prompt_tokens.increment(u.prompt_tokens);
                m::hot().completion_tokens.increment(u.completion_tokens);
            }
            if let Some(slot) = held.slot.as_mut() {
                slot.complete();
                // Without a usage report the tenant stays charged its estimate.
                if let Some(u) = usage {
                    slot.settle_usage(&u);
                }
            }
        }
        // Ended before llama-server finished: it may still be generating until it sees the closed
        // connection.
        let abandoned = matches!(
            outcome,
            Outcome::ClientGone
                | Outcome::ClientStalled
                | Outcome::UpstreamTimeout
                | Outcome::DrainTimeout
                | Outcome::Shed
        );
        if abandoned {
            // Charged only what it was served: the tokens streamed before it left, and the prompt
            // once llama-server had begun answering.
            let completion = self.usage.generated();
            let prompt = if self.first_byte {
                held.exchange.prompt_tokens()
            } else {
                0
            };
            if completion > 0 {
                // What of the prompt came from the cache is known only from llama-server's report.
                let u = Usage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    cached_tokens: 0,
                };
                held.exchange.set_usage(u);
                m::hot().prompt_tokens.increment(prompt);
                m::hot().completion_tokens.increment(completion);
            }
            if let Some(slot) = held.slot.as_mut() {
                slot.settle(prompt + completion);
            }
        }
        // A resumable answer read to its end after its client left: what happened to the client.
        held.exchange.finish(match self.client_left {
            true if outcome == Outcome::Ok => Outcome::ClientGone,
            _ => outcome,
        });
        if abandoned {
            if let Some(slot) = held.slot.take() {
                match self.on_upstream_timeout.take() {
                    Some(q) if outcome == Outcome::UpstreamTimeout => q.hold(slot),
                    _ => slot.release_after(ABANDON_GRACE),
                }
            }
        }
        // `held` drops here: the slot goes to the next waiter, in-flight is decremented, the
        // access line is written.
    }
}

impl GuardedBody {
    /// What the upstream span says of the answer's end: its usage, or why it did not finish.
    fn trace_end(&mut self, outcome: Outcome) {
        // Taken: the span ends with this function, with the answer (not when the body drops).
        let span = std::mem::replace(&mut self.trace, tracing::Span::none());
        // What llama-server reported (read again by `settle`: `finish` may be called twice), else
        // what streamed before the answer was cut.
        match self.usage.finish() {
            Some(u) => {
                span.record("gen_ai.usage.input_tokens", u.prompt_tokens as i64);
                span.record("gen_ai.usage.output_tokens", u.completion_tokens as i64);
            }
            None if self.usage.generated() > 0 => {
                span.record("gen_ai.usage.output_tokens", self.usage.generated() as i64);
            }
            None => {}
        }
        if outcome != Outcome::Ok {
            span.record("error.type", outcome.label());
        }
        let failed = self.status.is_server_error()
            || matches!(outcome, Outcome::UpstreamError | Outcome::UpstreamTimeout);
        span.record("otel.status_code", if failed { "error" } else { "ok" });
    }
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        match this.ending {
            Ending::No => {}
            Ending::EventSent => {
                this.ending = Ending::Flushed;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Ending::Flushed => return Poll::Ready(Some(Err(Box::new(ShedAbort)))),
        }
        if let Some(shed) = this.poll_shed(cx) {
            return shed;
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(idle) = this.idle.as_mut() {
                    idle.last_frame = Instant::now();
                }
                if let Some(data) = frame.data_ref() {
                    if !this.first_byte {
                        this.first_byte = true;
                        m::hot()
                            .ttfb
                            .record(this.forwarded_at.elapsed().as_secs_f64());
                        if let Some(held) = &this.held {
                            held.exchange.live().set_phase(Phase::Answering);
                        }
                        crate::otel::first_token(&this.trace);
                    }
                    this.usage.feed(data);
                    if !data.is_empty() {
                        this.mid_event = !(data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n"));
                    }
                    if let Some(held) = &this.held {
                        held.exchange.live().set_generated(this.usage.generated());
                    }
                }
                if this.inner.is_end_stream() {
                    this.settle(Outcome::Ok);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::warn!(error = %e, "upstream response failed mid-stream; aborting the client's response");
                this.settle(Outcome::UpstreamError);
            }
            Poll::Ready(None) => this.settle(Outcome::Ok),
            Poll::Pending => {
                if let Some(idle) = this.idle.as_mut() {
                    if idle.poll_expired(cx).is_ready() {
                        let limit = idle.limit;
                        tracing::warn!(
                            idle_ms = limit.as_millis() as u64,
                            "llama-server went silent mid-answer; aborting the client's response"
                        );
                        // Close the upstream connection first, then hand the slot on.
                        this.inner = respond::full(Bytes::new());
                        this.settle(Outcome::UpstreamTimeout);
                        return Poll::Ready(Some(Err(Box::new(UpstreamIdle(limit)))));
                    }
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ending == Ending::No && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        // hyper stops polling once `is_end_stream` says so, and never polls an empty body at all. A
        // client that closes once it has read the stream's last event (many SDKs do, before the
        // stream's end reaches it) got the whole answer.
        let outcome = if self.inner.is_end_stream() || self.usage.done() {
            Outcome::Ok
        } else if self.watch.as_ref().is_some_and(WriteWatch::is_stalled) {
            Outcome::ClientStalled
        } else {
            super::access::ended_unfinished()
        };
        if self.resumable && outcome != Outcome::Ok && self.held.is_some() {
            // llama-server goes on generating into the conversation's session, whatever the
            // connection: the slot stays held until it is done, or the next request would run on
            // a slot still in use.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let rest = self.take_rest();
                rt.spawn(rest.read_to_end());
                return;
            }
        }
        // Close the upstream connection before the slot is handed on, so llama-server stops
        // generating for a client that has gone as early as it can notice.
        drop(std::mem::replace(
            &mut self.inner,
            respond::full(Bytes::new()),
        ));
        self.settle(outcome);
    }
}

impl GuardedBody {
    /// A sheddable request told to yield mid-answer: the upstream connection is closed (llama-server
    /// stops generating), the slot is given back once llama-server has seen it, the request is
    /// charged what streamed and counted `shed`, and the client gets the error event (on a stream)
    /// and then the abort.
    fn poll_shed(&mut self, cx: &mut Context<'_>) -> Option<Polled> {
        let held = self.held.as_mut()?;
        let slot = held.slot.as_mut()?;
        let shed = match self.shed_due.take() {
            Some(shed) => shed,
            None => match slot.poll_shed(cx) {
                Poll::Ready(shed) => shed,
                Poll::Pending => return None,
            },
        };
        // Its answer is over already, only its end still to read: it frees its slots as it ends.
        if self.usage.done() {
            return None;
        }
        if self.sse && self.mid_event {
            self.shed_due = Some(shed);
            return None;
        }
        slot.ended_by_shed();
        let error = crate::error::GateError::Shed {
            retry_after: shed.retry_after,
        };
        held.exchange.refused(&error);
        tracing::info!(
            retry_after_ms = error.retry_after_ms(),
            generated = self.usage.generated(),
            "a sheddable answer was ended for a more urgent request"
        );
        self.inner = respond::full(Bytes::new());
        self.settle(Outcome::Shed);
        match self.sse {
            true => {
                self.ending = Ending::EventSent;
                Some(Poll::Ready(Some(Ok(Frame::data(respond::error_event(
                    &error,
                    self.dialect,
                ))))))
            }
            false => Some(Poll::Ready(Some(Err(Box::new(ShedAbort))))),
        }
    }

    /// Everything this body still holds, moved into a body of its own, to be read without a client.
    fn take_rest(&mut self) -> GuardedBody {
        GuardedBody {
            inner: std::mem::replace(&mut self.inner, respond::full(Bytes::new())),
            held: self.held.take(),
            forwarded_at: self.forwarded_at,
            first_byte: self.first_byte,
            usage: std::mem::replace(&mut self.usage, UsageScanner::new(None, dialect::CHAT)),
            watch: None,
            idle: self.idle.take(),
            on_upstream_timeout: self.on_upstream_timeout.take(),
            status: self.status,
            resumable: false,
            client_left: true,
            trace: std::mem::replace(&mut self.trace, tracing::Span::none()),
            dialect: self.dialect,
            sse: self.sse,
            ending: Ending::No,
            mid_event: false,
            shed_due: None,
        }
    }

    /// Reads the answer to its end (or its idle timeout); settling happens as it ends.
    async fn read_to_end(mut self) {
        use http_body_util::BodyExt;
        while let Some(frame) = self.frame().await {
            if frame.is_err() {
                break;
            }
        }
    }
}
