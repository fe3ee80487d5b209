//! A streaming request that has to wait for a slot, kept alive and told its place
//! (docs/scheduling.md#waiting-streams). Without this it gets no byte until it has a slot, and a
//! proxy in front with an idle timeout (nginx's `proxy_read_timeout`, 60 s) cuts it while it
//! waits. With it (`--stream-keepalive`, or the request's `X-Slotgate-Keepalive-Ms`), once the
//! request is queued its answer begins at once, `200` with `text/event-stream`, and an SSE comment
//! is sent at every interval with its place and expected start, until its own answer begins; that
//! answer's events follow. A refusal after that point (a queue timeout, a deadline, a shed) can no
//! longer be a status: it is an error event in the API's shape, and the stream ends.
//!
//! The request's phases run as a task of their own; this module only watches for the signal that
//! the request joined the queue, and from then on writes the stream the client reads.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::dialect::DialectRef;
use crate::respond::{self, Body, BodyError};
use crate::router::Pool;
use crate::state::App;

/// The request's own interval, in milliseconds (`0`: none for this request, whatever the setting).
pub const KEEPALIVE_HEADER: HeaderName = HeaderName::from_static("x-slotgate-keepalive-ms");

/// No comment more often than this, whatever the request asks.
const FLOOR: Duration = Duration::from_millis(100);

/// The most waiters looked through for a waiting stream's place (the queue is walked in service
/// order, under its lock, once per comment).
const MOST_PLACES: usize = 256;

/// How often a waiting stream of this request is sent a comment: its header's interval (`0`
/// turns it off), else the setting. A header that is no number is refused by the intake phase
/// (see [`asked`]); here it counts as absent.
pub fn interval(setting: Option<Duration>, headers: &HeaderMap) -> Option<Duration> {
    match asked(headers) {
        Ok(Some(ms)) => (ms > 0).then(|| Duration::from_millis(ms).max(FLOOR)),
        Ok(None) | Err(_) => setting,
    }
}

/// The request's `X-Slotgate-Keepalive-Ms`, when it sends one; `Err` with its text when it is no
/// whole number of milliseconds.
pub fn asked(headers: &HeaderMap) -> Result<Option<u64>, String> {
    let Some(v) = headers.get(&KEEPALIVE_HEADER) else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(v.as_bytes());
    text.trim().parse::<u64>().map(Some).map_err(|_| {
        format!(
            "{KEEPALIVE_HEADER}: `{text}` is not an interval; give whole milliseconds between the \
             comments a waiting stream is sent, or 0 for none"
        )
    })
}

/// What the admit phase tells, once, when a streaming request joins a queue.
pub struct Queued {
    /// Its tag in the queue (and key in the live view).
    pub tag: u64,
    /// In front of llama-server's router, its model's pool; else the gate's queue.
    pub pool: Option<Arc<Pool>>,
    pub dialect: Option<DialectRef>,
}

/// The admit phase's end of the signal.
pub struct Signal(Mutex<Option<oneshot::Sender<Queued>>>);

impl Signal {
    pub fn new() -> (Signal, oneshot::Receiver<Queued>) {
        let (tx, rx) = oneshot::channel();
        (Signal(Mutex::new(Some(tx))), rx)
    }

    /// The request joined a queue (only the first call counts: a shed request queued again is
    /// already kept alive).
    pub fn queued(&self, q: Queued) {
        let tx = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(q);
        }
    }
}

/// The phases' task, aborted when its client is gone (the stream dropped): the request leaves the
/// queue, and its record ends as a client's who left. A request naming a conversation is `kept`
/// instead: dropping the handle detaches it, as `pipeline::detached` does without a keep-alive,
/// since llama-server generates such an answer into its session for a later resume.
pub struct Phases {
    pub task: JoinHandle<http::Response<Body>>,
    pub kept: bool,
}

impl Drop for Phases {
    fn drop(&mut self) {
        if !self.kept {
            self.task.abort();
        }
    }
}

/// The answer begun early: headers now, comments while it waits, then its own answer's events
/// (or an error event for a refusal).
pub fn early(
    app: Arc<App>,
    phases: Phases,
    queued: Queued,
    every: Duration,
) -> http::Response<Body> {
    let dialect = queued.dialect;
    let first = comment(&app, &queued);
    let state = State::Waiting {
        app,
        queued,
        phases,
        ticker: tokio::time::interval_at(tokio::time::Instant::now() + every, every),
    };
    let rest = futures_util::stream::unfold(state, move |s| next(s, dialect));
    let stream = futures_util::stream::once(async move { Ok(Frame::data(first)) }).chain(rest);
    let mut resp = http::Response::new(StreamBody::new(stream).boxed_unsync());
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx passes the comments on as they come instead of buffering them.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.insert("x-slotgate-queued", HeaderValue::from_static("1"));
    resp
}

type Item = Result<Frame<Bytes>, BodyError>;

enum State {
    Waiting {
        app: Arc<App>,
        queued: Queued,
        phases: Phases,
        ticker: tokio::time::Interval,
    },
    Answering(Body),
    Done,
}

async fn next(state: State, dialect: Option<DialectRef>) -> Option<(Item, State)> {
    match state {
        State::Waiting {
            app,
            queued,
            mut phases,
            mut ticker,
        } => {
            tokio::select! {
                biased;
                done = &mut phases.task => {
                    let answer = match done {
                        Ok(resp) => resp,
                        // The task panicked: the stream ends with an error event.
                        Err(_) => respond::task_failed(dialect),
                    };
                    answered(answer, dialect).await
                }
                _ = ticker.tick() => {
                    let c = comment(&app, &queued);
                    Some((Ok(Frame::data(c)), State::Waiting { app, queued, phases, ticker }))
                }
            }
        }
        State::Answering(mut body) => body
            .frame()
            .await
            .map(|frame| (frame, State::Answering(body))),
        State::Done => None,
    }
}

/// Its own answer, as it began: a stream's events follow the comments; anything else (slotgate's
/// refusal, llama-server's error) becomes one error event, and the stream ends.
async fn answered(
    answer: http::Response<Body>,
    dialect: Option<DialectRef>,
) -> Option<(Item, State)> {
    let streams = answer.status().is_success()
        && answer
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
    if streams {
        let mut body = answer.into_body();
        return body
            .frame()
            .await
            .map(|frame| (frame, State::Answering(body)));
    }
    let retry_after_ms = answer
        .headers()
        .get(respond::RETRY_AFTER_MS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let status = answer.status().as_u16();
    let bytes = match answer.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let event = respond::error_event_of(&bytes, status, retry_after_ms, dialect);
    Some((Ok(Frame::data(event)), State::Done))
}

/// `: slotgate queued position=P of=N expected_start_s=S` while it waits; `: slotgate started`
/// once it has its slot and its answer has not begun.
fn comment(app: &App, queued: &Queued) -> Bytes {
    let admission = queued
        .pool
        .as_ref()
        .map_or(&app.admission, |p| &p.admission);
    let waiters = admission.waiters(MOST_PLACES);
    let text = match waiters.iter().position(|w| w.tag == queued.tag) {
        Some(at) => format!(
            ": slotgate queued position={} of={} expected_start_s={:.1}\n\n",
            at + 1,
            admission.stats().depth,
            waiters[at].expected_start_seconds
        ),
        None if admission.stats().depth > MOST_PLACES => {
            format!(": slotgate queued position>{MOST_PLACES}\n\n")
        }
        None => ": slotgate started\n\n".to_owned(),
    };
    Bytes::from(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_wins_over_the_setting_and_zero_turns_it_off() {
        let mut h = HeaderMap::new();
        let on = Some(Duration::from_secs(15));
        assert_eq!(interval(on, &h), on);
        assert_eq!(interval(None, &h), None);
        h.insert(KEEPALIVE_HEADER, HeaderValue::from_static("2000"));
        assert_eq!(interval(None, &h), Some(Duration::from_secs(2)));
        h.insert(KEEPALIVE_HEADER, HeaderValue::from_static("5"));
        assert_eq!(interval(None, &h), Some(FLOOR));
        h.insert(KEEPALIVE_HEADER, HeaderValue::from_static("0"));
        assert_eq!(interval(on, &h), None);
        h.insert(KEEPALIVE_HEADER, HeaderValue::from_static("soon"));
        assert!(asked(&h).unwrap_err().contains("`soon`"));
        assert_eq!(interval(on, &h), on);
    }
}
