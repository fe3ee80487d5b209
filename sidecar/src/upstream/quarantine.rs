//! Slots llama-server may still be working on after slotgate gave up on their request: handed on
//! only once llama-server has let the request go, so two requests never share one of its slots.

use std::time::Duration;

use super::Upstream;
use crate::admission::{Admission, SlotGuard};

/// How long a slot stays held after its client left: the upstream connection is closed on the pooled
/// client's own task, a moment after we drop it.
pub const ABANDON_GRACE: Duration = Duration::from_millis(20);
/// Longest hold of a slot whose request llama-server may still run after an upstream timeout.
const QUARANTINE_CAP: Duration = Duration::from_secs(30);

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
    /// (see `Upstream::dropped_below`), at most `QUARANTINE_CAP` later.
    pub fn hold(&self, mut slot: SlotGuard) {
        // Told to yield, it could not: only llama-server's letting go frees it.
        slot.no_longer_sheddable();
        let (upstream, admission) = (self.upstream.clone(), self.admission.clone());
        // The task owns the slot: it is released by its guard's Drop, also if the task never finishes.
        tokio::spawn(async move {
            tokio::time::sleep(ABANDON_GRACE).await;
            upstream
                .dropped_below(move || admission.stats().busy, QUARANTINE_CAP)
                .await;
            drop(slot);
        });
    }
}
