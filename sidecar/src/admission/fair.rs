//! Fair shares between tenants: a virtual token counter per tenant, as in VTC ("Fairness in Serving
//! Large Language Models", OSDI '24). A tenant's counter is the tokens it has been served divided by
//! its weight; the queue hands a free slot to the waiting tenant with the lowest counter.
//!
//! - Admitted: the counter grows by `cost / weight` (the estimate, charged up front).
//! - Ended: it is corrected by `(actual - charged) / weight` once the real usage is known.
//! - Became active (no waiter and nothing in service before): the counter is lifted to at least the
//!   *baseline*, the service the least-served active tenant has completed (its counter without the
//!   charges of requests it still has in service), so idle time is never banked as credit. With
//!   nobody active, the baseline is where the last active tenant left off.
//!
//! Placing a newcomer at the completed service of the others, rather than at their counters with
//! their in-service charges, puts it next in line (start-time fair queueing): a tenant that starts
//! sending while another floods the queue waits for at most one request already in service.
//!
//! The state is only touched under the queue's lock.

use std::collections::HashMap;
use std::sync::Arc;

/// Tenants remembered when inactive before the ones whose counters no longer matter are forgotten.
const MAX_REMEMBERED: usize = 4096;

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tenant {
    /// Virtual tokens: tokens served divided by weight, including charges of requests in service.
    pub counter: f64,
    /// The part of `counter` that is the up-front charges of requests still in service.
    in_service_charge: f64,
    pub waiting: usize,
    pub in_service: usize,
}

impl Tenant {
    pub fn is_active(&self) -> bool {
        self.waiting > 0 || self.in_service > 0
    }

    /// Service completed: the counter without what is still being served.
    fn completed(&self) -> f64 {
        self.counter - self.in_service_charge
    }
}

#[derive(Debug, Default)]
pub struct Tenants {
    map: HashMap<Arc<str>, Tenant>,
    /// The baseline while nobody is active: where the last active tenant left off.
    idle_floor: f64,
}

impl Tenants {
    /// The tenant's counter for ordering waiters (0 for a tenant never seen).
    pub fn counter(&self, tenant: &str) -> f64 {
        self.map.get(tenant).map_or(0.0, |t| t.counter)
    }

    pub fn waiting(&self, tenant: &str) -> usize {
        self.map.get(tenant).map_or(0, |t| t.waiting)
    }

    /// Requests of `tenant` in service.
    pub fn in_service(&self, tenant: &str) -> usize {
        self.map.get(tenant).map_or(0, |t| t.in_service)
    }

    /// Whether a tenant other than `tenant` has requests waiting or in service.
    pub fn others_active(&self, tenant: &str) -> bool {
        self.map
            .iter()
            .any(|(name, t)| &**name != tenant && t.is_active())
    }

    /// Active tenants and those remembered for their counters, for /status.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tenant)> {
        self.map.iter().map(|(k, v)| (&**k, v))
    }

    /// Where a tenant becoming active now starts at the least.
    pub fn baseline(&self) -> f64 {
        self.map
            .values()
            .filter(|t| t.is_active())
            .map(Tenant::completed)
            .min_by(f64::total_cmp)
            .unwrap_or(self.idle_floor)
    }

    /// A request of `tenant` joins the queue.
    pub fn enqueue(&mut self, tenant: &Arc<str>) {
        self.activate(tenant).waiting += 1;
    }

    /// A waiter of `tenant` left the queue without being served (timeout, client gone, displaced,
    /// shutdown).
    pub fn dequeue(&mut self, tenant: &str) {
        if let Some(t) = self.map.get_mut(tenant) {
            t.waiting = t.waiting.saturating_sub(1);
        }
        self.deactivate_if_idle(tenant);
    }

    /// A request of `tenant` takes a slot straight away, charged `charge` virtual tokens.
    pub fn admit(&mut self, tenant: &Arc<str>, charge: f64) {
        self.activate(tenant);
        self.start(tenant, charge);
    }

    /// A waiter of `tenant` is handed a slot, charged `charge` virtual tokens.
    pub fn promote(&mut self, tenant: &str, charge: f64) {
        if let Some(t) = self.map.get_mut(tenant) {
            t.waiting = t.waiting.saturating_sub(1);
        }
        self.start(tenant, charge);
    }

    fn start(&mut self, tenant: &str, charge: f64) {
        if let Some(t) = self.map.get_mut(tenant) {
            t.in_service += 1;
            t.counter += charge;
            t.in_service_charge += charge;
        }
    }

    /// Replaces a request's up-front `charged` by `actual` (both virtual tokens). Once per request.
    pub fn settle(&mut self, tenant: &str, charged: f64, actual: f64) {
        if let Some(t) = self.map.get_mut(tenant) {
            t.counter += actual - charged;
            t.in_service_charge -= charged;
        }
    }

    /// A request of `tenant` left its slot; `unsettled` is its charge if it was never settled (it
    /// then stays charged in full).
    pub fn finish(&mut self, tenant: &str, unsettled: f64) {
        if let Some(t) = self.map.get_mut(tenant) {
            t.in_service = t.in_service.saturating_sub(1);
            t.in_service_charge -= unsettled;
            if t.in_service == 0 {
                // No float residue may outlive the requests it belonged to.
                t.in_service_charge = 0.0;
            }
        }
        self.deactivate_if_idle(tenant);
    }

    /// Returns the entry of `tenant`, lifted to the baseline if it was not active.
    fn activate(&mut self, tenant: &Arc<str>) -> &mut Tenant {
        let inactive = self.map.get(tenant).is_none_or(|t| !t.is_active());
        if inactive {
            let baseline = self.baseline();
            if !self.map.contains_key(tenant) && self.map.len() >= MAX_REMEMBERED {
                self.forget(baseline);
            }
            let t = self.map.entry(tenant.clone()).or_default();
            t.counter = t.counter.max(baseline);
            t.in_service_charge = 0.0;
        }
        self.map.entry(tenant.clone()).or_default()
    }

    /// When `tenant` has nothing waiting or in service, it stops being active. Its counter is kept
    /// only while it is above the baseline: otherwise a return would lift it there anyway.
    fn deactivate_if_idle(&mut self, tenant: &str) {
        let Some(t) = self.map.get(tenant) else {
            return;
        };
        if t.is_active() {
            return;
        }
        let counter = t.counter;
        if self.map.values().all(|t| !t.is_active()) {
            self.idle_floor = counter;
        }
        if counter <= self.baseline() {
            self.map.remove(tenant);
        }
    }

    /// Drops inactive tenants whose counters no longer matter, and if that is not enough, every
    /// inactive tenant (a burst of distinct tenants must not grow memory without bound; the price is
    /// that a forgotten tenant returns at the baseline).
    fn forget(&mut self, baseline: f64) {
        let before = self.map.len();
        self.map
            .retain(|_, t| t.is_active() || t.counter > baseline);
        if self.map.len() >= MAX_REMEMBERED {
            self.map.retain(|_, t| t.is_active());
        }
        crate::metrics::state_evicted("tenants", before - self.map.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn a_newcomer_starts_at_the_completed_service_of_the_least_served() {
        let mut ts = Tenants::default();
        let a = t("a");
        ts.admit(&a, 100.0);
        ts.settle(&a, 100.0, 30.0);
        ts.finish(&a, 0.0);
        ts.admit(&a, 50.0);
        assert_eq!(ts.counter("a"), 80.0, "back where it left off");
        for _ in 0..3 {
            ts.enqueue(&a);
        }
        // a has completed 30 and has 50 in service: b starts at 30, ahead of a's waiters.
        ts.enqueue(&t("b"));
        assert_eq!(ts.counter("b"), 30.0);
        assert!(ts.counter("b") < ts.counter("a"));
    }

    #[test]
    fn idle_time_is_not_banked_and_forgotten_tenants_lose_nothing() {
        let mut ts = Tenants::default();
        let (a, b) = (t("a"), t("b"));
        ts.admit(&b, 5.0);
        ts.finish(&b, 5.0);
        // b leaves at 5; a is then served alone for a long time.
        for _ in 0..10 {
            ts.admit(&a, 100.0);
            ts.finish(&a, 100.0);
        }
        ts.admit(&a, 100.0);
        assert_eq!(
            ts.counter("a"),
            1105.0,
            "each return starts where a left off"
        );
        ts.enqueue(&b);
        assert_eq!(ts.counter("b"), 1005.0, "lifted to a's completed service");
        ts.dequeue(&b);
        ts.finish(&a, 100.0);
        assert_eq!(
            ts.iter().count(),
            0,
            "nobody above the baseline to remember"
        );
        ts.enqueue(&t("c"));
        assert_eq!(ts.counter("c"), 1105.0, "the idle floor");
    }

    #[test]
    fn settle_corrects_and_the_heavy_tenant_is_remembered() {
        let mut ts = Tenants::default();
        let (a, b) = (t("a"), t("b"));
        ts.admit(&a, 10.0);
        ts.admit(&b, 10.0);
        ts.settle(&a, 10.0, 400.0);
        ts.finish(&a, 0.0);
        ts.settle(&b, 10.0, 2.0);
        assert_eq!((ts.counter("a"), ts.counter("b")), (400.0, 2.0));
        // a went idle above the baseline (b's 2): its debt is kept, so it cannot return fresh.
        ts.enqueue(&a);
        assert_eq!(ts.counter("a"), 400.0);
        ts.dequeue(&a);
        ts.finish(&b, 0.0);
        assert_eq!(ts.counter("a"), 400.0);
    }
}
