//! GuardedBody: streams the upstream's response to the client while holding the request's slot,
//! in-flight count and access record, and settles all three when the stream ends, fails or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

use crate::access::Exchange;
use crate::admission::SlotGuard;
use crate::error::Outcome;
use crate::metrics as m;
use crate::respond::{self, Body, BodyError};
use crate::upstream::InflightGuard;
use crate::usage::{Usage, UsageScanner};

/// How long a slot stays held after its client left: the upstream connection is closed on the pooled
/// client's own task, a moment after we drop it.
pub const ABANDON_GRACE: Duration = Duration::from_millis(20);

pub struct GuardedBody {
    inner: Body,
    /// Everything released when the response is over. `None` once settled.
    held: Option<Held>,
    forwarded_at: Instant,
    first_byte: bool,
    usage: UsageScanner,
}

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
            usage: UsageScanner::new(content_type),
        }
    }

    /// Releases the slot and records the request's fate. Runs at most once.
    fn settle(&mut self, outcome: Outcome) {
        let Some(mut held) = self.held.take() else {
            return;
        };
        let elapsed = self.forwarded_at.elapsed();
        held.exchange.set_upstream_time(elapsed);
        metrics::histogram!(m::UPSTREAM_SECONDS).record(elapsed.as_secs_f64());
        if outcome == Outcome::Ok {
            let usage = self.usage.finish();
            if let Some(u) = usage {
                held.exchange.set_usage(u);
                metrics::counter!(m::TOKENS_TOTAL, "kind" => "prompt").increment(u.prompt_tokens);
                metrics::counter!(m::TOKENS_TOTAL, "kind" => "completion")
                    .increment(u.completion_tokens);
            }
            if let Some(slot) = held.slot.as_mut() {
                slot.complete();
                // Without a usage report the tenant stays charged its estimate.
                if let Some(u) = usage {
                    slot.settle(u.prompt_tokens.saturating_add(u.completion_tokens));
                }
            }
        }
        if outcome == Outcome::ClientGone {
            // Charged only what it was served: the tokens streamed before it left, and the prompt
            // once llama-server had begun answering.
            let completion = self.usage.generated();
            let prompt = if self.first_byte {
                held.exchange.prompt_tokens()
            } else {
                0
            };
            if completion > 0 {
                let u = Usage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                };
                held.exchange.set_usage(u);
                metrics::counter!(m::TOKENS_TOTAL, "kind" => "prompt").increment(prompt);
                metrics::counter!(m::TOKENS_TOTAL, "kind" => "completion").increment(completion);
            }
            if let Some(slot) = held.slot.as_mut() {
                slot.settle(prompt + completion);
            }
        }
        held.exchange.finish(outcome);
        if outcome == Outcome::ClientGone {
            if let Some(slot) = held.slot.take() {
                slot.release_after(ABANDON_GRACE);
            }
        }
        // `held` drops here: the slot goes to the next waiter, in-flight is decremented, the
        // access line is written.
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
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !this.first_byte {
                        this.first_byte = true;
                        metrics::histogram!(m::TTFB_SECONDS)
                            .record(this.forwarded_at.elapsed().as_secs_f64());
                    }
                    this.usage.feed(data);
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
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        // hyper stops polling once `is_end_stream` says so, and never polls an empty body at all.
        let outcome = if self.inner.is_end_stream() {
            Outcome::Ok
        } else {
            Outcome::ClientGone
        };
        // Close the upstream connection before the slot is handed on, so llama-server stops
        // generating for a client that has gone as early as it can notice.
        drop(std::mem::replace(
            &mut self.inner,
            respond::full(Bytes::new()),
        ));
        self.settle(outcome);
    }
}
