//! What a request holds of the slots and of the KV pool they may share ([`Hold`]), and whether it
//! fits beside what is in service: both its slots and its pool tokens must fit (alone, a request
//! may use the whole server). What it takes is counted as in service until its `SlotGuard` gives
//! it back.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{shed, Admission, Claim, State};

/// What one request in service holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hold {
    pub(super) slots: usize,
    pub(super) kv: u64,
    /// The band it counts against.
    pub(super) band: Option<usize>,
    /// When it was taken: its tenant's cap counts it from then (see [`super::cap`]).
    pub(super) since: Instant,
}

impl Admission {
    /// The slots requests are admitted to now.
    pub fn slots(&self) -> usize {
        self.shared.slots.load(Ordering::Relaxed)
    }

    /// Admits to `n` slots from now on (at least 1). More slots go at once to waiters; with fewer,
    /// requests already in service finish and no new one is admitted until the rest fit.
    pub fn set_slots(&self, n: usize) {
        let mut st = self.lock();
        self.shared.slots.store(n.max(1), Ordering::Relaxed);
        self.dispatch(&mut st);
    }

    /// Tokens of the KV pool the slots share from now on (`None`: each slot its own context).
    /// A larger pool goes at once to waiters; with a smaller one, what is in service finishes.
    pub fn set_pool(&self, tokens: Option<u64>) {
        let mut st = self.lock();
        self.shared
            .pool
            .store(tokens.unwrap_or(0), Ordering::Relaxed);
        self.dispatch(&mut st);
    }

    /// The pool, when the slots share one.
    pub fn pool(&self) -> Option<u64> {
        match self.shared.pool.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// What `claim` holds if admitted now: its slots and pool tokens, neither more than there is
    /// (alone, a request may use the whole server).
    pub(super) fn hold_of(&self, claim: &Claim) -> Hold {
        Hold {
            slots: claim.slots.clamp(1, self.slots()),
            kv: self.pool().map_or(claim.kv, |p| claim.kv.min(p)),
            band: claim.band,
            since: Instant::now(),
        }
    }

    /// Whether `claim` can be admitted beside what is in service; when it can, its start is
    /// counted in the models' turns (the caller admits it).
    pub(super) fn try_start(&self, st: &State, claim: &Claim) -> bool {
        if !self.fits_beside(st, claim, shed::Freed::default()) {
            return false;
        }
        match self.shared.turn.get() {
            Some(seat) => seat.start(st.serving, self.slots(), Self::oldest(st)),
            None => true,
        }
    }

    /// Whether `claim` could be admitted beside what is in service once `freed` has been given
    /// back (see [`super::shed`]).
    pub(super) fn fits_beside(&self, st: &State, claim: &Claim, freed: shed::Freed) -> bool {
        if st.paused || self.held_back(st, claim) {
            return false;
        }
        let serving = st.serving.saturating_sub(freed.serving);
        if let Some(seat) = self.shared.turn.get() {
            if !seat.allows(serving, self.slots(), Self::oldest(st)) {
                return false;
            }
        }
        if serving == 0 {
            return true;
        }
        let hold = self.hold_of(claim);
        let (busy, kv) = (
            st.busy.saturating_sub(freed.slots),
            st.kv.saturating_sub(freed.kv),
        );
        busy + hold.slots <= self.slots() && self.pool().is_none_or(|p| kv + hold.kv <= p)
    }

    /// Counts `hold` (of `claim`) as in service.
    pub(super) fn take(&self, st: &mut State, hold: Hold, claim: &Claim) {
        if let Some(b) = hold.band {
            if st.band_busy.len() <= b {
                st.band_busy.resize(b + 1, 0);
            }
            st.band_busy[b] += hold.slots;
        }
        st.busy += hold.slots;
        st.kv += hold.kv;
        st.serving += 1;
        st.drain.in_service += claim.cost as f64;
        st.in_service
            .start(&claim.tenant, claim.cap.in_service, hold.since);
        if let Some((team, _)) = &claim.team_cap {
            st.in_service.team_start(team);
        }
    }
}
