//! Slots llama-server may still be working on after slotgate gave up on their request: handed on
//! only once llama-server has let the request go, so two requests never share one of its slots.

use std::time::{Duration, Instant};

use http::Method;

use super::Upstream;
use crate::admission::{Admission, SlotGuard};

/// How long a slot stays held after its client left: the upstream connection is closed on the pooled
/// client's own task, a moment after we drop it.
pub const ABANDON_GRACE: Duration = Duration::from_millis(20);
/// Longest hold of a slot whose request llama-server may still run after an upstream timeout.
const QUARANTINE_CAP: Duration = Duration::from_secs(30);
/// How long llama-server must show fewer requests than slotgate's busy slots before the one given
/// up on counts as dropped (a stopped server, once running again, may list its slots first).
const THAWED_SETTLE: Duration = Duration::from_millis(500);
/// Time allowed for one `/slots` or `/health` probe while waiting for a dropped request.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Without `/slots`: how long after `/health` answers again a request given up on is assumed gone.
const NO_SLOTS_GRACE: Duration = Duration::from_millis(500);

/// Keeps a slot after an upstream timeout until llama-server has dropped the request: one per
/// server, shared, so arming it for a response costs a reference count.
pub struct Quarantine {
    upstream: Upstream,
    admission: Admission,
}

impl Quarantine {
    pub fn new(upstream: Upstream, admission: Admission) -> Self {
        Quarantine {
            upstream,
            admission,
        }
    }

    /// The slot is handed on only once llama-server has dropped the request slotgate gave up on
    /// (see [`dropped_below`]), at most `QUARANTINE_CAP` later.
    pub fn hold(&self, mut slot: SlotGuard) {
        // Told to yield, it could not: only llama-server's letting go frees it.
        slot.no_longer_sheddable();
        let (upstream, admission) = (self.upstream.clone(), self.admission.clone());
        // The task owns the slot: it is released by its guard's Drop, also if the task never finishes.
        tokio::spawn(async move {
            tokio::time::sleep(ABANDON_GRACE).await;
            dropped_below(&upstream, move || admission.stats().busy, QUARANTINE_CAP).await;
            drop(slot);
        });
    }
}

/// Resolves once llama-server works on fewer requests than `busy()` (slotgate's own count of
/// slots in use, including the one given up on): it has dropped a request slotgate gave up on.
/// Without `/slots` (started without it) it waits for `/health` to answer, then a moment more.
/// Gives up after `cap`. A stopped (SIGSTOP) llama-server still holds a request it has not
/// read yet and starts it once it runs again; handing its slot on before then would put two
/// requests on one llama-server slot.
async fn dropped_below(upstream: &Upstream, busy: impl Fn() -> usize, cap: Duration) {
    let poll = async {
        // The request was given up on because llama-server did not answer it: it may be
        // stopped or stuck and run again any moment, and then its slot list can be read before
        // the request it held. So "fewer" must hold for [`THAWED_SETTLE`] before it counts.
        let mut fewer_since: Option<Instant> = None;
        loop {
            match upstream
                .json(Method::GET, "/slots", None, PROBE_TIMEOUT)
                .await
            {
                Ok(serde_json::Value::Array(slots)) => {
                    let processing = slots
                        .iter()
                        .filter(|s| s["is_processing"].as_bool() == Some(true))
                        .count();
                    if processing < busy() {
                        let since = *fewer_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= THAWED_SETTLE {
                            return;
                        }
                    } else {
                        fewer_since = None;
                    }
                }
                // No answer at all: still stopped (or just thawed, the slot list not read
                // yet). Only a server that answers and has no slot list falls back on /health.
                Err(e) if e.contains("no answer within") => fewer_since = None,
                // Running again, but without a slot list to tell.
                _ if upstream.probe_health(PROBE_TIMEOUT).await => {
                    tokio::time::sleep(NO_SLOTS_GRACE).await;
                    return;
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let _ = tokio::time::timeout(cap, poll).await;
}
