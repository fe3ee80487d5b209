//! Order and fairness: which waiter is served next, and who gives way when the queue is full.
//!
//! The next waiter is the smallest [`Place`]: its priority, improved by one level for every `aging`
//! it has waited; then a deadline, while its tenant is within its fair share; then the tenant with
//! the lowest virtual counter; then arrival. A waiter its band or its tenant's cap holds back is
//! passed over without holding back those behind it.
//!
//! At arrival, a tenant holding its share of the queue is turned away while others are active, and
//! a full queue makes room for a newcomer (a tenant beyond its share gives up its newest place,
//! else a strictly more urgent arrival displaces the least urgent, most recent waiter) or refuses
//! it.

use std::time::Duration;

use tokio::time::Instant;

use super::{Admission, Claim, Grant, State, Waiter};
use crate::error::GateError;

/// Where a waiter stands in the service order, smallest first:
///
/// 1. its effective priority (after aging);
/// 2. then, within a priority level, the waiters with a deadline (see [`Claim::deadline`]) by the
///    earliest, while their tenant is within its fair share (no more than that request ahead of
///    the least-served waiting tenant); the others after them;
/// 3. then its tenant's virtual counter (the least served first);
/// 4. then arrival.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    priority: i64,
    due: Option<Instant>,
    counter: f64,
    seq: u64,
}

impl Place {
    pub(super) fn cmp(&self, other: &Place) -> std::cmp::Ordering {
        // A deadline comes before none (`None` sorts first in `Option`'s order, so compare by hand).
        let due = match (self.due, other.due) {
            (Some(a), Some(b)) => a.cmp(&b),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        self.priority
            .cmp(&other.priority)
            .then(due)
            .then(self.counter.total_cmp(&other.counter))
            .then(self.seq.cmp(&other.seq))
    }
}

impl Admission {
    /// At arrival: refuses `claim` (429 `tenant_queue_full`) when its tenant holds its share of
    /// the queue while other tenants are active; alone, a tenant may use the whole queue.
    pub(super) fn check_share(&self, st: &mut State, claim: &Claim) -> Result<(), GateError> {
        let Some(limit) = self.shared.fairness.tenant_limit else {
            return Ok(());
        };
        let waiting = st.tenants.waiting(&claim.tenant);
        if waiting < limit || !st.tenants.others_active(&claim.tenant) {
            return Ok(());
        }
        let retry_after = self.retry_after(st, claim.cost);
        self.book_return(st, claim, retry_after);
        Err(GateError::TenantQueueFull {
            waiting,
            retry_after,
        })
    }

    /// At arrival, when the queue is full: a place for `claim`, or its refusal (429 `queue_full`).
    /// A tenant beyond its share gives up its newest place to one within its share; else a
    /// strictly more urgent arrival displaces the least urgent, most recent waiter. The places
    /// kept for clients due back count as taken, except for those clients (`returning`).
    pub(super) fn make_room(
        &self,
        st: &mut State,
        claim: &Claim,
        returning: bool,
        arrived: Instant,
    ) -> Result<(), GateError> {
        let held = match returning {
            true => 0,
            false => Self::held_places(st, arrived),
        };
        if st.waiters.len() + held < self.shared.capacity {
            return Ok(());
        }
        let now = Instant::now();
        if let Some(seq) = self.over_share_victim(st, claim, now) {
            // A tenant beyond its share gives up its newest place to one within its share.
            if let Some(w) = st.waiters.remove(&seq) {
                let waiting = st.tenants.waiting(&w.claim.tenant);
                st.tenants.dequeue(&w.claim.tenant);
                let retry_after = self.retry_after(st, w.claim.cost);
                self.book_return(st, &w.claim, retry_after);
                let _ = w.tx.send(Grant::OverShare {
                    waiting,
                    retry_after,
                });
            }
            return Ok(());
        }
        let victim = st
            .waiters
            .iter()
            .map(|(seq, w)| (self.effective(w, now), *seq))
            .max();
        match victim {
            // Strictly more urgent: the least urgent, most recently queued waiter gives way.
            Some((urgency, seq)) if claim.priority < urgency => {
                if let Some(w) = st.waiters.remove(&seq) {
                    st.tenants.dequeue(&w.claim.tenant);
                    let retry_after = self.retry_after(st, w.claim.cost);
                    self.book_return(st, &w.claim, retry_after);
                    let _ = w.tx.send(Grant::Displaced { retry_after });
                }
                Ok(())
            }
            _ => {
                let retry_after = self.retry_after(st, claim.cost);
                self.book_return(st, claim, retry_after);
                Err(GateError::QueueFull {
                    depth: st.waiters.len(),
                    retry_after,
                })
            }
        }
    }

    /// On a full queue, the waiter that gives way to `claim` when `claim`'s tenant is within its
    /// share: of the tenant holding the most waiters beyond its share, the least urgent and most
    /// recent one, provided it is not more urgent than `claim`.
    pub(super) fn over_share_victim(&self, st: &State, claim: &Claim, now: Instant) -> Option<u64> {
        let limit = self.shared.fairness.tenant_limit?;
        if st.tenants.waiting(&claim.tenant) >= limit {
            return None;
        }
        st.waiters
            .iter()
            .filter_map(|(seq, w)| {
                let held = st.tenants.waiting(&w.claim.tenant);
                (held > limit).then(|| (held, self.effective(w, now), *seq))
            })
            .max()
            .filter(|(_, urgency, _)| claim.priority <= *urgency)
            .map(|(_, _, seq)| seq)
    }

    /// A waiter's priority after aging: one level more urgent for every `aging` waited.
    pub(super) fn effective(&self, w: &Waiter, now: Instant) -> i64 {
        self.aged(w.claim.priority, now.saturating_duration_since(w.queued))
    }

    /// `priority` after waiting `waited`.
    pub(super) fn aged(&self, priority: i64, waited: Duration) -> i64 {
        let Some(step) = self.shared.fairness.aging else {
            return priority;
        };
        let levels = waited.as_nanos() / step.as_nanos();
        priority.saturating_sub(i64::try_from(levels).unwrap_or(i64::MAX))
    }

    /// The waiter served next: the smallest [`Place`].
    pub(super) fn next_waiter(&self, st: &State, now: Instant) -> Option<u64> {
        let least = Self::least_counter(st, |t| st.tenants.counter(t));
        st.waiters
            .iter()
            // A waiter whose band holds its share of the slots, or whose tenant is at its cap, waits
            // without blocking the others.
            .filter(|(_, w)| !self.held_back(st, &w.claim))
            .map(|(seq, w)| {
                let counter = st.tenants.counter(&w.claim.tenant);
                self.place(&w.claim, self.effective(w, now), counter, least, *seq)
            })
            .min_by(Place::cmp)
            .map(|p| p.seq)
    }

    /// Whether a waiter that could start (its band within its share of the slots, its tenant below
    /// its cap) would be served before `claim`, were it queued now.
    pub(super) fn anyone_before(&self, st: &State, claim: &Claim, now: Instant) -> bool {
        if st.waiters.is_empty() {
            return false;
        }
        let ahead = self.ahead_of(st, claim, now);
        st.waiters
            .values()
            .any(|w| !self.held_back(st, &w.claim) && ahead(w))
    }

    /// Whether `claim` could not start now whatever is free: its band holds its share of the
    /// slots, or its tenant is at its cap.
    pub(super) fn held_back(&self, st: &State, claim: &Claim) -> bool {
        self.band_full(st, claim) || self.at_cap(st, claim)
    }

    /// Whether a waiter would be served before `claim`, were `claim` queued now.
    pub(super) fn ahead_of<'a>(
        &'a self,
        st: &'a State,
        claim: &Claim,
        now: Instant,
    ) -> impl Fn(&Waiter) -> bool + 'a {
        let counter = |w: &Waiter| st.tenants.counter(&w.claim.tenant);
        let mine = st.tenants.counter(&claim.tenant);
        let any_due =
            claim.deadline.is_some() || st.waiters.values().any(|w| w.claim.deadline.is_some());
        let least = match any_due {
            true => st.waiters.values().map(counter).fold(mine, f64::min),
            false => f64::MAX,
        };
        let me = self.place(claim, claim.priority, mine, least, st.next_seq);
        // Every waiter came before it (a smaller sequence).
        move |w: &Waiter| {
            let p = self.place(&w.claim, self.effective(w, now), counter(w), least, 0);
            p.cmp(&me).is_lt()
        }
    }

    /// Where a claim stands in the service order, its tenant's counter at `counter` and the least
    /// counter of any waiting tenant `least` (only looked at when some waiter has a deadline).
    pub(super) fn place(
        &self,
        claim: &Claim,
        effective: i64,
        counter: f64,
        least: f64,
        seq: u64,
    ) -> Place {
        // A deadline counts while its tenant is no more than this request ahead of the least
        // served: a tenant sending only short deadlines cannot take more than its share.
        let due = claim.deadline.filter(|_| counter <= least + claim.charge());
        Place {
            priority: effective,
            due,
            counter,
            seq,
        }
    }

    /// The least counter of the tenants waiting with a deadline beside others (`f64::MAX`: no
    /// waiter has a deadline, so none is compared).
    fn least_counter(st: &State, counter: impl Fn(&str) -> f64) -> f64 {
        if !st.waiters.values().any(|w| w.claim.deadline.is_some()) {
            return f64::MAX;
        }
        st.waiters
            .values()
            .map(|w| counter(&w.claim.tenant))
            .fold(f64::MAX, f64::min)
    }
}
