//! The waiters as the live view shows them (`GET /live`, `slotgate top`): in the order they will be
//! served, each with when it is expected to start.

use tokio::time::Instant;

use super::{Admission, State, INITIAL_SERVICE_SECONDS};

/// One waiter, as it stands now.
#[derive(Debug, Clone, PartialEq)]
pub struct WaiterView {
    /// Its claim's tag (see `Claim::tag`): who it is in the live view.
    pub tag: u64,
    pub tenant: String,
    pub priority: i64,
    /// Its priority after aging (see `Fairness::aging`): what it is served by.
    pub effective_priority: i64,
    pub age_seconds: f64,
    /// Tokens it is charged when admitted (its reservation, or its policy's cost).
    pub cost: u64,
    pub slots: usize,
    pub kv: u64,
    /// Seconds from now until it is expected to start, by the same model as Retry-After: the work
    /// in service and the waiters served before it, over the throughput measured.
    pub expected_start_seconds: f64,
    /// Seconds from now to its own deadline, when it set one.
    pub deadline_in_seconds: Option<f64>,
    /// Its overload band, when it is in one.
    pub band: Option<std::sync::Arc<str>>,
}

impl Admission {
    /// The first `limit` waiters in the order they will be served, if nothing else arrives: by
    /// their `Place` (effective priority, a deadline within the tenant's share, the tenant's
    /// virtual counter, which grows by each charge as its waiters are served in turn, arrival).
    pub fn waiters(&self, limit: usize) -> Vec<WaiterView> {
        let st = self.lock();
        let now = Instant::now();
        let mut counters: std::collections::HashMap<&str, f64> = st
            .waiters
            .values()
            .map(|w| (&*w.claim.tenant, st.tenants.counter(&w.claim.tenant)))
            .collect();
        let mut left: Vec<(u64, i64)> = st
            .waiters
            .iter()
            .map(|(seq, w)| (*seq, self.effective(w, now)))
            .collect();
        let mut ahead = st.drain.in_service;
        let mut out = Vec::with_capacity(limit.min(left.len()));
        let any_due = st.waiters.values().any(|w| w.claim.deadline.is_some());
        while out.len() < limit && !left.is_empty() {
            let least = match any_due {
                true => left
                    .iter()
                    .map(|(seq, _)| counters[&*st.waiters[seq].claim.tenant])
                    .fold(f64::MAX, f64::min),
                false => f64::MAX,
            };
            let place = |(seq, effective): &(u64, i64)| {
                let claim = &st.waiters[seq].claim;
                self.place(claim, *effective, counters[&*claim.tenant], least, *seq)
            };
            let (at, _) = left
                .iter()
                .enumerate()
                .min_by(|(_, a), (_, b)| place(a).cmp(&place(b)))
                .expect("not empty");
            let (seq, effective) = left.swap_remove(at);
            let w = &st.waiters[&seq];
            out.push(WaiterView {
                tag: w.claim.tag,
                tenant: w.claim.tenant.to_string(),
                priority: w.claim.priority,
                effective_priority: effective,
                age_seconds: now.saturating_duration_since(w.queued).as_secs_f64(),
                cost: w.claim.cost,
                slots: w.claim.slots,
                kv: w.claim.kv,
                expected_start_seconds: self.start_after(&st, ahead, out.len()),
                deadline_in_seconds: w
                    .claim
                    .deadline
                    .map(|d| d.saturating_duration_since(now).as_secs_f64()),
                band: w.claim.band.map(|b| self.bands().get(b).name.clone()),
            });
            ahead += w.claim.cost as f64;
            if let Some(c) = counters.get_mut(&*w.claim.tenant) {
                *c += w.claim.charge();
            }
        }
        out
    }

    /// Seconds until `ahead` charged tokens (in service and waiting before) have drained, `before`
    /// of them waiters: by tokens once a throughput is known, else by requests.
    fn start_after(&self, st: &State, ahead: f64, before: usize) -> f64 {
        let lanes = self.lanes(st);
        let drain = st.drain.seconds(ahead, lanes.slots).unwrap_or_else(|| {
            let waiting = (st.serving + before) as f64 / lanes.requests;
            // Nothing in service and nothing before it: it starts as soon as the slots allow.
            (waiting.floor()) * st.service_ewma.unwrap_or(INITIAL_SERVICE_SECONDS)
        });
        drain + self.until_ready(st, Instant::now())
    }
}
