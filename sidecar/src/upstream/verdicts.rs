//! llama-server's verdicts on callers' keys, learnt before a request is charged (see
//! `pipeline::caller`): a key slotgate has not seen is shown to llama-server first, by a
//! `GET /v1/models` of slotgate's own carrying only that credential (never slotgate's key). The
//! verdict is kept a minute (a refusal ten seconds) for at most [`MAX_VERDICTS`] keys; at most four
//! keys are shown at once. Without keys upstream, a check is one atomic load.

use std::collections::HashMap;
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
    kept: Mutex<HashMap<[u8; 32], (bool, Instant)>>,
    turns: Semaphore,
}

impl Default for Verdicts {
    fn default() -> Self {
        Verdicts {
            kept: Mutex::default(),
            turns: Semaphore::new(AT_ONCE),
        }
    }
}

impl Verdicts {
    /// `Err(InvalidApiKey)` when llama-server checks keys and would refuse this request's: no key,
    /// or one it refused. A key not seen yet is shown to it first.
    pub async fn check(
        &self,
        upstream: &Upstream,
        credential: Option<Shown<'_>>,
    ) -> Result<(), GateError> {
        if !upstream.checks_keys() {
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
            .status_for(ASK_PATH, (credential.header, credential.value), ASK_TIMEOUT)
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
