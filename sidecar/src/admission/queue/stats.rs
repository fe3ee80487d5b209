//! What the queue shows of itself, for `/status` and for Retry-After: its numbers now
//! ([`QueueStats`]), its tenants the next to be served first ([`TenantStats`]), its bands
//! ([`BandStats`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Admission, State, INITIAL_SERVICE_SECONDS};

/// One overload band of a pool now, for `/status`.
#[derive(Debug, Clone, PartialEq)]
pub struct BandStats {
    pub name: Arc<str>,
    pub priorities: (i64, i64),
    pub slots_busy: usize,
    pub slot_limit: Option<usize>,
    pub waiting: usize,
    pub queue_limit: Option<usize>,
    /// Refused since start, its share of the queue full (over every pool).
    pub refused: u64,
}

/// A point-in-time view for /status and for Retry-After.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QueueStats {
    pub slots: usize,
    /// Slots held by the requests in service.
    pub busy: usize,
    /// Requests in service.
    pub serving: usize,
    /// KV pool tokens they hold, and the pool (`None`: a context per slot).
    pub kv_reserved: u64,
    pub kv_pool: Option<u64>,
    pub depth: usize,
    pub capacity: usize,
    pub tenant_limit: Option<usize>,
    pub service_seconds: f64,
    /// Estimated wait for a request queued now (see `Admission::wait_seconds`).
    pub wait_seconds: f64,
    pub closed: bool,
    /// Tokens reserved (claim costs) by the requests in service.
    pub tokens_in_service: f64,
    /// Waiters with a deadline of their own (see `Claim::deadline`).
    pub with_deadline: usize,
    /// Sheddable requests in service (see [`super::shed`]), and those told to yield still giving back.
    pub sheddable: usize,
    pub yielding: usize,
    /// Requests shed since start: queued again before their first byte, ended after it.
    pub shed_requeued: u64,
    pub shed_ended: u64,
}

impl QueueStats {
    /// Seconds until the work already admitted (in service and waiting) has drained.
    pub fn drain_seconds(&self) -> f64 {
        self.wait_seconds
    }

    /// The KV pool's share (0 to 1) the requests in service hold, once the pool is known.
    pub fn kv_share(&self) -> Option<f64> {
        self.kv_pool
            .filter(|p| *p > 0)
            .map(|p| self.kv_reserved as f64 / p as f64)
    }
}

/// One tenant's share of the queue, for /status.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantStats {
    pub tenant: String,
    /// Virtual tokens: tokens served divided by weight, including charges of requests in service.
    pub counter: f64,
    pub waiting: usize,
    pub in_service: usize,
}

impl TenantStats {
    /// Orders tenants the next to be served first (lowest counter, then name), keeping `limit`.
    pub fn next_served_first(all: &mut Vec<TenantStats>, limit: usize) {
        all.sort_by(|a, b| {
            a.counter
                .total_cmp(&b.counter)
                .then_with(|| a.tenant.cmp(&b.tenant))
        });
        all.truncate(limit);
    }
}

impl Admission {
    pub fn stats(&self) -> QueueStats {
        self.stats_of(&self.lock())
    }

    fn stats_of(&self, st: &State) -> QueueStats {
        QueueStats {
            slots: self.slots(),
            busy: st.busy,
            serving: st.serving,
            kv_reserved: st.kv,
            kv_pool: self.pool(),
            depth: st.waiters.len(),
            capacity: self.shared.capacity,
            tenant_limit: self.shared.fairness.tenant_limit,
            service_seconds: st.service_ewma.unwrap_or(INITIAL_SERVICE_SECONDS),
            wait_seconds: self.wait_seconds(st),
            closed: st.closed,
            tokens_in_service: st.drain.in_service,
            with_deadline: st
                .waiters
                .values()
                .filter(|w| w.claim.deadline.is_some())
                .count(),
            sheddable: st.sheddable.len(),
            yielding: st.freeing.len(),
            shed_requeued: self.shared.shed_requeued.load(Ordering::Relaxed),
            shed_ended: self.shared.shed_ended.load(Ordering::Relaxed),
        }
    }

    /// The tenants the scheduler knows (active, or remembered for a counter above the others'), the
    /// next to be served first, at most `limit`.
    pub fn tenants(&self, limit: usize) -> Vec<TenantStats> {
        let st = self.lock();
        let mut all: Vec<TenantStats> = st
            .tenants
            .iter()
            .map(|(name, t)| TenantStats {
                tenant: name.to_owned(),
                counter: t.counter,
                waiting: t.waiting,
                in_service: t.in_service,
            })
            .collect();
        drop(st);
        TenantStats::next_served_first(&mut all, limit);
        all
    }
}
