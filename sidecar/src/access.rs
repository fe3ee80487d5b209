//! One record per request: its outcome, status, timings and peer. Counted and logged exactly once, when
//! the record drops, so a request whose future is cancelled (client gone) is still accounted for.

use std::time::Duration;

use slotgate_sdk::Peer;
use tokio::time::Instant;

use crate::error::Outcome;
use crate::metrics as m;

pub struct Exchange {
    method: http::Method,
    path: String,
    peer: Option<Peer>,
    started: Instant,
    priority: i64,
    queue_wait: Option<Duration>,
    upstream: Option<Duration>,
    status: Option<u16>,
    outcome: Option<Outcome>,
}

impl Exchange {
    pub fn new(method: http::Method, path: &str, peer: Option<Peer>) -> Self {
        Exchange {
            method,
            path: path.to_owned(),
            peer,
            started: Instant::now(),
            priority: 0,
            queue_wait: None,
            upstream: None,
            status: None,
            outcome: None,
        }
    }

    pub fn set_priority(&mut self, priority: i64) {
        self.priority = priority;
    }

    pub fn set_queue_wait(&mut self, wait: Duration) {
        metrics::histogram!(m::QUEUE_WAIT_SECONDS).record(wait.as_secs_f64());
        self.queue_wait = Some(wait);
    }

    pub fn set_status(&mut self, status: u16) {
        self.status = Some(status);
    }

    pub fn set_upstream_time(&mut self, t: Duration) {
        self.upstream = Some(t);
    }

    /// The request's fate. Only the first call counts.
    pub fn finish(&mut self, outcome: Outcome) {
        self.outcome.get_or_insert(outcome);
    }

    pub fn is_finished(&self) -> bool {
        self.outcome.is_some()
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or(Outcome::ClientGone);
        metrics::counter!(m::REQUESTS_TOTAL, "outcome" => outcome.label()).increment(1);
        // Absent values (no status yet, no peer on TCP) are left out of the line rather than faked,
        // and numbers stay numbers in JSON logs.
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
        tracing::info!(
            target: "slotgate::access",
            outcome = %outcome.label(),
            status = self.status,
            method = %self.method,
            path = %self.path,
            priority = self.priority,
            queue_wait_ms = ms(self.queue_wait),
            upstream_ms = ms(self.upstream),
            total_ms = self.started.elapsed().as_millis() as u64,
            peer_uid = self.peer.map(|p| p.uid),
            peer_gid = self.peer.map(|p| p.gid),
            peer_pid = self.peer.and_then(|p| p.pid),
            "request"
        );
    }
}
