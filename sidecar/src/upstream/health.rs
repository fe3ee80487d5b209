//! Whether llama-server is there: the `/health` probe and what it learnt (ready or not, reached
//! at all since slotgate started), and the last failure, kept for `/status` and said in the log
//! when it starts, changes, or lasts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Full, Limited};

use super::client::{error_chain, PROBE_BODY_LIMIT};
use super::Upstream;
use crate::metrics as m;

/// How often a failure that lasts is said again in the log.
const UNREACHABLE_REPEAT: Duration = Duration::from_secs(30);

/// The last failed probe: in words, whether it could not even connect, and when it was last said
/// in the log.
struct LastError {
    text: String,
    unreachable: bool,
    said: Instant,
}

/// How a `/health` probe failed.
#[derive(Debug, thiserror::Error)]
enum Probe {
    /// The connect failed: nothing listens there, or it refuses.
    #[error("cannot reach it: {0}")]
    Unreachable(String),
    /// It answered, but not ready (503 while it loads, 401 without a key).
    #[error("GET /health answered {0}")]
    Answered(http::StatusCode),
    /// Connected, but no answer came (a stopped or stuck server), or the connection failed.
    #[error("{0}")]
    Failed(String),
}

/// What the probes have learnt, shared by every clone of the [`Upstream`].
pub(super) struct Health {
    ready: AtomicBool,
    /// llama-server has answered slotgate at least once (any status) since it started.
    reached: AtomicBool,
    /// The last failed probe.
    last_error: Mutex<Option<LastError>>,
    /// slotgate starts llama-server itself (`wrap`).
    starts_it: bool,
}

impl Health {
    pub(super) fn new() -> Self {
        Health {
            ready: AtomicBool::new(false),
            reached: AtomicBool::new(false),
            last_error: Mutex::new(None),
            starts_it: false,
        }
    }

    /// It answered a request: whatever it said, it is there (see `never_reachable`). Read first: a
    /// store per request would bounce the cache line between the workers.
    pub(super) fn answered(&self) {
        if !self.reached.load(Ordering::Relaxed) {
            self.reached.store(true, Ordering::Relaxed);
        }
    }
}

impl Upstream {
    pub fn is_ready(&self) -> bool {
        self.inner.health.ready.load(Ordering::Relaxed)
    }

    /// Probes `GET /health` once and records readiness.
    pub async fn probe_health(&self, timeout: Duration) -> bool {
        let attempt = async {
            // A connection of its own each time: a probe riding an old connection would still
            // answer after llama-server's socket is gone and new connections fail.
            let req = Request::get(self.uri("/health"))
                .header(header::CONNECTION, "close")
                .body(Full::new(Bytes::new()))
                .map_err(|e| Probe::Unreachable(e.to_string()))?;
            let resp = self
                .inner
                .fresh
                .request(req)
                .await
                .map_err(|e| match e.is_connect() {
                    true => Probe::Unreachable(error_chain(&e)),
                    false => Probe::Failed(error_chain(&e)),
                })?;
            let status = resp.status();
            let _ = Limited::new(resp.into_body(), PROBE_BODY_LIMIT)
                .collect()
                .await;
            match status {
                http::StatusCode::OK => Ok(()),
                // Loading (503), or refusing slotgate (401): it is there and answers.
                other => Err(Probe::Answered(other)),
            }
        };
        let probe = tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(Probe::Failed(format!("no answer within {timeout:?}"))));
        let ready = probe.is_ok();
        if matches!(probe, Ok(()) | Err(Probe::Answered(_))) {
            self.inner.health.reached.store(true, Ordering::Relaxed);
        }
        self.note_probe(&probe);
        let was = self.inner.health.ready.swap(ready, Ordering::Relaxed);
        metrics::gauge!(m::UPSTREAM_READY).set(if ready { 1.0 } else { 0.0 });
        if was != ready && ready {
            tracing::info!(upstream = %self.inner.target, "upstream is ready");
        }
        ready
    }

    /// Keeps the last probe's failure for `/status`, and says it in the log: when it starts or
    /// changes, and again every [`UNREACHABLE_REPEAT`] while it lasts.
    fn note_probe(&self, probe: &Result<(), Probe>) {
        let mut last = self.last();
        let Err(failure) = probe else {
            *last = None;
            return;
        };
        let text = failure.to_string();
        let repeat = match &*last {
            Some(l) if l.text == text => l.said.elapsed() >= UNREACHABLE_REPEAT,
            _ => true,
        };
        if !repeat {
            return;
        }
        let unreachable = matches!(failure, Probe::Unreachable(_));
        match unreachable {
            true => tracing::warn!(
                upstream = %self.inner.target,
                error = %text,
                "upstream not reachable; requests get 503 until it is, once it has answered they wait for it"
            ),
            false => {
                tracing::warn!(upstream = %self.inner.target, error = %text, "upstream is not ready")
            }
        }
        *last = Some(LastError {
            text,
            unreachable,
            said: Instant::now(),
        });
    }

    fn last(&self) -> std::sync::MutexGuard<'_, Option<LastError>> {
        self.inner
            .health
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The last failed probe, in words (`None` while llama-server answers ready).
    pub fn last_error(&self) -> Option<String> {
        self.last().as_ref().map(|l| l.text.clone())
    }

    /// Whether llama-server has answered slotgate at all since it started (any status).
    pub fn reached(&self) -> bool {
        self.inner.health.reached.load(Ordering::Relaxed)
    }

    /// Why a request should not wait for llama-server: it has never been reachable since slotgate
    /// started, and the last probe could not connect (a wrong `--upstream`, a server not started).
    /// Not when slotgate starts llama-server itself (`wrap`): then it is on its way.
    pub fn never_reachable(&self) -> Option<String> {
        if self.inner.health.starts_it || self.reached() {
            return None;
        }
        self.last()
            .as_ref()
            .filter(|l| l.unreachable)
            .map(|l| l.text.clone())
    }

    /// slotgate starts llama-server itself (`wrap`): while it is not reachable yet, it is starting.
    /// Call before the first clone: it sets a field of the shared state.
    pub fn set_starts_it(&mut self, starts: bool) {
        let inner = Arc::get_mut(&mut self.inner);
        debug_assert!(
            inner.is_some(),
            "set_starts_it after the upstream was shared"
        );
        if let Some(inner) = inner {
            inner.health.starts_it = starts;
        }
    }
}
