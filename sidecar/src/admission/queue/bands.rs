//! The overload bands in the queue (see `admission::bands`): an arrival whose band holds its share
//! of the queue places is refused (429 `band_queue_full`); a waiter whose band holds its share of
//! the slots is passed over without holding back those behind it, as one whose tenant is at its
//! cap is; what each band holds now, for `/status`.

use std::sync::Arc;

use super::{Admission, BandStats, Bands, Claim, State};
use crate::error::GateError;

impl Admission {
    /// Whether `claim`'s band already holds its share of the slots, with some of it in service (a
    /// band with nothing in service may start a request however many slots it takes).
    pub(super) fn band_full(&self, st: &State, claim: &Claim) -> bool {
        let Some(b) = claim.band else {
            return false;
        };
        let Some(limit) = self.bands().slot_limit(b, self.slots()) else {
            return false;
        };
        let busy = st.band_busy.get(b).copied().unwrap_or(0);
        busy > 0 && busy + self.hold_of(claim).slots > limit
    }

    /// At arrival: refuses `claim` (429 `band_queue_full`) when its band holds its share of the
    /// queue places already: the rest are for the other bands.
    pub(super) fn check_band_queue(&self, st: &mut State, claim: &Claim) -> Result<(), GateError> {
        let Some(b) = claim.band else {
            return Ok(());
        };
        let Some(limit) = self.bands().queue_limit(b, self.shared.capacity) else {
            return Ok(());
        };
        let waiting = st
            .waiters
            .values()
            .filter(|w| w.claim.band == Some(b))
            .count();
        if waiting < limit {
            return Ok(());
        }
        self.bands().refused(b);
        Err(GateError::BandQueueFull {
            band: self.bands().get(b).name.to_string(),
            waiting,
            retry_after: self.retry_after(st, claim.cost),
        })
    }

    /// The pool's overload bands (none until [`Admission::set_bands`]).
    pub(super) fn bands(&self) -> &Bands {
        static NONE: std::sync::OnceLock<Bands> = std::sync::OnceLock::new();
        self.shared
            .bands
            .get()
            .unwrap_or_else(|| NONE.get_or_init(Bands::default))
    }

    /// Limits each band's share of the slots and queue places from now on (once).
    pub fn set_bands(&self, bands: Bands) {
        let _ = self.shared.bands.set(bands);
    }

    /// The band a request at `priority` belongs to, by name.
    pub fn band_of(&self, priority: i64) -> Option<Arc<str>> {
        let bands = self.bands();
        bands.of(priority).map(|b| bands.get(b).name.clone())
    }

    /// Each band now: what it holds and may hold.
    pub fn band_stats(&self) -> Vec<BandStats> {
        let bands = self.bands();
        let st = self.lock();
        (0..bands.len())
            .map(|b| {
                let band = bands.get(b);
                BandStats {
                    name: band.name.clone(),
                    priorities: band.priorities,
                    slots_busy: st.band_busy.get(b).copied().unwrap_or(0),
                    slot_limit: bands.slot_limit(b, self.slots()),
                    waiting: st
                        .waiters
                        .values()
                        .filter(|w| w.claim.band == Some(b))
                        .count(),
                    queue_limit: bands.queue_limit(b, self.shared.capacity),
                    refused: bands.refused_total(b),
                }
            })
            .collect()
    }
}
