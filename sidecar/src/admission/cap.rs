//! Per-tenant concurrency caps: at most so many of one tenant's requests in service at once, and
//! optionally at most so many waiting. A request carries its tenant's cap (the operator's setting
//! for the tenant, cut by its policies' decision); the queue holds a waiter back while its tenant is
//! at its cap without holding back the others (see `queue::cap`).
//!
//! This file owns the value and what the queue remembers to answer honestly: when each tenant's
//! requests in service started, so a refusal's Retry-After is the time until one of them is
//! expected to end.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;

/// One request's cap on its tenant. `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantCap {
    /// The most of the tenant's requests in service while this one starts (at least 1).
    pub in_service: Option<usize>,
    /// The most of the tenant's requests waiting when this one arrives (0: none may wait).
    pub waiting: Option<usize>,
}

impl TenantCap {
    /// The stricter of `self` and `other`, key by key: the smallest of each limit either sets.
    pub fn tightened(self, other: TenantCap) -> TenantCap {
        let min = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        TenantCap {
            // A cap of 0 would never start the request: a refusal is a policy's deny.
            in_service: min(self.in_service, other.in_service).map(|n| n.max(1)),
            waiting: min(self.waiting, other.waiting),
        }
    }

    /// Whether it limits anything.
    pub fn is_none(&self) -> bool {
        self.in_service.is_none() && self.waiting.is_none()
    }
}

/// When each tenant's requests in service started, and the in-service cap of the latest to start
/// (what `slotgate_tenants_at_cap` counts it against). Only tenants with requests in service are
/// kept: the map is never larger than the requests in service.
#[derive(Debug, Default)]
pub struct InService(HashMap<Arc<str>, Running>, Teams);

/// Requests in service by team, for the teams with a cap (`[teams."NAME"]`); only teams with
/// requests in service are kept.
#[derive(Debug, Default)]
struct Teams(HashMap<Arc<str>, usize>);

#[derive(Debug, Default)]
struct Running {
    since: Vec<Instant>,
    cap: Option<usize>,
}

impl InService {
    /// A request of `tenant` capped at `cap` started at `at`.
    pub fn start(&mut self, tenant: &Arc<str>, cap: Option<usize>, at: Instant) {
        let r = self.0.entry(tenant.clone()).or_default();
        r.since.push(at);
        r.cap = cap;
    }

    /// A request of the capped `team` started.
    pub fn team_start(&mut self, team: &Arc<str>) {
        *self.1 .0.entry(team.clone()).or_default() += 1;
    }

    /// A request of the capped `team` ended.
    pub fn team_end(&mut self, team: &str) {
        if let Some(n) = self.1 .0.get_mut(team) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.1 .0.remove(team);
            }
        }
    }

    /// `team`'s requests in service.
    pub fn of_team(&self, team: &str) -> usize {
        self.1 .0.get(team).copied().unwrap_or(0)
    }

    /// The request of `tenant` that started at `at` ended.
    pub fn end(&mut self, tenant: &str, at: Instant) {
        let Some(r) = self.0.get_mut(tenant) else {
            return;
        };
        if let Some(i) = r.since.iter().position(|s| *s == at) {
            r.since.swap_remove(i);
        }
        if r.since.is_empty() {
            self.0.remove(tenant);
        }
    }

    /// Tenants whose requests in service reach the cap of the latest of them to start.
    pub fn at_cap(&self) -> usize {
        self.0
            .values()
            .filter(|r| r.cap.is_some_and(|c| r.since.len() >= c))
            .count()
    }

    /// Seconds until the `k`-th (from 1) of `tenant`'s requests in service is expected to end, each
    /// expected to take `service` seconds from its start; beyond those in service, each further
    /// round of them takes `service` more. `None`: it has nothing in service.
    pub fn kth_end(&self, tenant: &str, k: usize, service: f64, now: Instant) -> Option<f64> {
        let r = self.0.get(tenant).filter(|r| !r.since.is_empty())?;
        let mut left: Vec<f64> = r
            .since
            .iter()
            .map(|s| (service - now.saturating_duration_since(*s).as_secs_f64()).max(0.0))
            .collect();
        left.sort_by(f64::total_cmp);
        let i = k.max(1) - 1;
        Some(left[i % left.len()] + (i / left.len()) as f64 * service)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_stricter_limit_wins_key_by_key() {
        let setting = TenantCap {
            in_service: Some(3),
            waiting: None,
        };
        let policy = TenantCap {
            in_service: Some(1),
            waiting: Some(2),
        };
        assert_eq!(setting.tightened(policy), policy);
        assert_eq!(policy.tightened(TenantCap::default()), policy);
        assert!(TenantCap::default().is_none());
    }

    #[test]
    fn the_kth_end_counts_from_the_oldest_and_then_in_rounds() {
        let now = Instant::now();
        let t: Arc<str> = Arc::from("a");
        let mut s = InService::default();
        assert_eq!(s.kth_end("a", 1, 2.0, now), None);
        s.start(&t, Some(2), now - Duration::from_millis(1500));
        s.start(&t, Some(2), now - Duration::from_millis(500));
        assert_eq!(s.at_cap(), 1);
        let near = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-6;
        assert!(near(s.kth_end("a", 1, 2.0, now), 0.5));
        assert!(near(s.kth_end("a", 2, 2.0, now), 1.5));
        assert!(near(s.kth_end("a", 3, 2.0, now), 2.5), "a round later");
        s.end("a", now - Duration::from_millis(1500));
        assert_eq!(s.at_cap(), 0);
        s.end("a", now - Duration::from_millis(500));
        assert!(
            s.0.is_empty(),
            "nothing kept for a tenant with nothing in service"
        );
    }
}
