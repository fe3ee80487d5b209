//! What a request holds while it runs: its slots and pool tokens, released (or handed on) by
//! `Drop` when the response has been streamed or its client has gone.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Hold, EWMA_ALPHA};

/// A request's slots (and pool tokens), held until the response has been fully streamed or the
/// client has gone.
pub struct SlotGuard {
    pub(super) admission: Admission,
    /// Its id among the sheddable requests in service (see `shed`), when it is one.
    pub(super) shed_id: Option<u64>,
    pub(super) yielding: Option<Box<super::shed::Yielding>>,
    pub(super) hold: Hold,
    pub(super) started: Instant,
    pub(super) completed: bool,
    pub(super) tenant: Arc<str>,
    /// Its team, when the team is capped.
    pub(super) team: Option<Arc<str>>,
    pub(super) weight: f64,
    /// The up-front charge to the tenant, until [`SlotGuard::settle`] replaces it by the real count.
    pub(super) unsettled: Option<f64>,
    /// Tokens charged up front, and really used once known.
    pub(super) cost: u64,
    pub(super) used: Option<u64>,
}

impl SlotGuard {
    /// Marks the request as served in full, so its duration feeds the service-time estimate.
    pub fn complete(&mut self) {
        self.completed = true;
    }

    /// Replaces the tenant's up-front charge by the tokens the request really used: 0 for a request
    /// that never reached the upstream. Once; a request never settled stays charged its estimate.
    pub fn settle(&mut self, actual_tokens: u64) {
        let Some(charged) = self.unsettled.take() else {
            return;
        };
        self.used = Some(actual_tokens);
        let mut st = self.admission.lock();
        st.tenants
            .settle(&self.tenant, charged, actual_tokens as f64 / self.weight);
        if actual_tokens > 0 {
            let counter = st.labels.counter(&self.tenant);
            drop(st);
            counter.increment(actual_tokens);
        }
    }

    /// [`SlotGuard::settle`] by what llama-server reported: its cached prompt tokens at the
    /// queue's `--cached-token-weight`.
    pub fn settle_usage(&mut self, usage: &crate::dialect::usage::Usage) {
        let counted = self.admission.shared.fairness.cached_weight.count(usage);
        self.settle(counted);
    }

    /// Releases the slot `after` from now instead of at once: for a request abandoned while its
    /// upstream connection is still being torn down on another task, so the next request does not
    /// reach llama-server before it has noticed. Outside a runtime it is released at once.
    pub fn release_after(self, after: Duration) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep(after).await;
                drop(self);
            });
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut st = self.admission.lock();
        st.drain.in_service = (st.drain.in_service - self.cost as f64).max(0.0);
        st.busy = st.busy.saturating_sub(self.hold.slots);
        if let Some(busy) = self.hold.band.and_then(|b| st.band_busy.get_mut(b)) {
            *busy = busy.saturating_sub(self.hold.slots);
        }
        st.kv = st.kv.saturating_sub(self.hold.kv);
        st.serving = st.serving.saturating_sub(1);
        if self.completed {
            let sample = self.started.elapsed().as_secs_f64();
            st.service_ewma = Some(match st.service_ewma {
                Some(avg) => avg + EWMA_ALPHA * (sample - avg),
                None => sample,
            });
            st.drain
                .learn(self.cost, self.used.unwrap_or(0), sample, self.hold.slots);
            st.drain.measured = st.drain.measured.saturating_add(1);
        }
        st.tenants
            .finish(&self.tenant, self.unsettled.unwrap_or(0.0));
        // Its tenant's next waiter, held back by its cap, may start now (dispatched below).
        st.in_service.end(&self.tenant, self.hold.since);
        if let Some(team) = &self.team {
            st.in_service.team_end(team);
        }
        if let Some(id) = self.shed_id {
            self.admission.discharge(&mut st, id);
        }
        self.admission.dispatch(&mut st);
    }
}
