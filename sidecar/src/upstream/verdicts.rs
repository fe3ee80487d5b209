//! llama-server's verdicts on callers' keys, learnt before a request is charged (see
//! `pipeline::caller`): a key slotgate has not seen is shown to llama-server first, by a
//! `GET /v1/models` of slotgate's own carrying only that credential (never slotgate's key). The
//! verdict is kept a minute (a refusal ten seconds) for at most [`MAX_VERDICTS`] keys; at most four
//! keys are shown at once. Whether llama-server checks keys at all is learnt when it becomes ready
//! (`learn`); without keys upstream, or before that, a check is one atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue};
use tokio::sync::Semaphore;

use super::Upstream;
use crate::error::GateError;

/// Keys whose verdict is kept; past it the oldest verdicts are forgotten (and counted).
pub const MAX_VERDICTS: usize = 4096;
/// How long llama-server's acceptance of a key is trusted.
const ACCEPTED_FOR: Duration = Duration::from_secs(60);
/// How long its refusal is: a key being added to llama-server is let in soon after.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Keys shown to llama-server at once; others wait for a turn.
const AT_ONCE: usize = 4;
/// The longest a verdict is waited for; without one, llama-server decides on the request itself.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// The route a key is shown on: one llama-server checks keys on (all but `/health`), cheap, and
/// without side effects.
const ASK_PATH: &str = "/v1/models";

/// A caller's credential as llama-server will see it: the header, its value, and the SHA-256 of
/// the key in it.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    pub header: &'static HeaderName,
    pub value: &'a HeaderValue,
    pub digest: [u8; 32],
}

/// llama-server's verdicts on the keys it was shown.
pub struct Verdicts {
    /// Whether llama-server checks keys: [`UNKNOWN`], [`OPEN`] or [`CHECKS`], learnt when it
    /// becomes ready (`learn`).
    checks: AtomicU8,
    kept: Mutex<HashMap<[u8; 32], (bool, Instant)>>,
    turns: Semaphore,
}

/// Not learnt yet: callers are forwarded for llama-server to judge.
const UNKNOWN: u8 = 0;
/// llama-server answers without a key: it checks none.
const OPEN: u8 = 1;
/// llama-server refuses a caller without a key (`--api-key`).
const CHECKS: u8 = 2;

impl Default for Verdicts {
    fn default() -> Self {
        Verdicts {
            checks: AtomicU8::new(UNKNOWN),
            kept: Mutex::default(),
            turns: Semaphore::new(AT_ONCE),
        }
    }
}

impl Verdicts {
    /// Learns whether llama-server checks keys: slotgate's own `GET /v1/models` with no credential
    /// at all, 401 or 403 when it does. Called whenever llama-server becomes ready (a restart may
    /// have added or dropped `--api-key`); the verdicts kept are dropped with it.
    pub async fn learn(&self, upstream: &Upstream) {
        let Some(status) = upstream.status_for(ASK_PATH, None, ASK_TIMEOUT).await else {
            return;
        };
        let checks = matches!(status.as_u16(), 401 | 403);
        let was = self
            .checks
            .swap(if checks { CHECKS } else { OPEN }, Ordering::Relaxed);
        if was != UNKNOWN {
            self.lock().clear();
        }
        if checks && was != CHECKS {
            tracing::info!("llama-server checks API keys: a caller it would refuse is refused before it is charged or queued");
        }
    }

    /// Whether llama-server was found to check keys.
    pub fn checks_keys(&self) -> bool {
        self.checks.load(Ordering::Relaxed) == CHECKS
    }

    /// `Err(InvalidApiKey)` when llama-server checks keys and would refuse this request's: no key,
    /// or one it refused. A key not seen yet is shown to it first.
    pub async fn check(
        &self,
        upstream: &Upstream,
        credential: Option<Shown<'_>>,
    ) -> Result<(), GateError> {
        if !self.checks_keys() {
            return Ok(());
        }
        let Some(credential) = credential else {
            crate::metrics::caller_refused("no_key");
            return Err(GateError::InvalidApiKey);
        };
        let digest = credential.digest;
        if let Some(accepted) = self.kept(&digest) {
            return self.verdict(accepted);
        }
        let Ok(_turn) = self.turns.acquire().await else {
            return Ok(());
        };
        // Another request with the same key may have asked while this one waited for its turn.
        if let Some(accepted) = self.kept(&digest) {
            return self.verdict(accepted);
        }
        let status = upstream
            .status_for(
                ASK_PATH,
                Some((credential.header, credential.value)),
                ASK_TIMEOUT,
            )
            .await;
        let accepted = match status.map(|s| s.as_u16()) {
            Some(401 | 403) => false,
            Some(s) if s < 500 => true,
            // Loading, failing or silent: no verdict; llama-server checks the request itself.
            _ => return Ok(()),
        };
        self.keep(digest, accepted);
        self.verdict(accepted)
    }

    fn verdict(&self, accepted: bool) -> Result<(), GateError> {
        if accepted {
            Ok(())
        } else {
            crate::metrics::caller_refused("refused_key");
            Err(GateError::InvalidApiKey)
        }
    }

    fn kept(&self, digest: &[u8; 32]) -> Option<bool> {
        let kept = self.lock();
        let &(accepted, at) = kept.get(digest)?;
        let for_ = if accepted { ACCEPTED_FOR } else { REFUSED_FOR };
        (at.elapsed() < for_).then_some(accepted)
    }

    fn keep(&self, digest: [u8; 32], accepted: bool) {
        let mut kept = self.lock();
        if kept.len() >= MAX_VERDICTS && !kept.contains_key(&digest) {
            let now = Instant::now();
            let before = kept.len();
            kept.retain(|_, (ok, at)| {
                now.duration_since(*at) < if *ok { ACCEPTED_FOR } else { REFUSED_FOR }
            });
            if kept.len() >= MAX_VERDICTS {
                // Still full of live verdicts: the oldest half goes.
                let mut ages: Vec<Instant> = kept.values().map(|v| v.1).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                kept.retain(|_, (_, at)| *at > cut);
            }
            crate::metrics::state_evicted("verdicts", before - kept.len());
        }
        kept.insert(digest, (accepted, Instant::now()));
    }

    /// Keys whose verdict is kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (bool, Instant)>> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
