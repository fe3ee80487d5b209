//! Host-side policy state that outlives one evaluation: token buckets and sliding-window counters,
//! keyed by strings the policy chooses (namespaced per policy), plus the per-store limits.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use dashmap::DashMap;
use slotgate_sdk::bucket;
use wasmtime::StoreLimits;

use crate::fleet::Fleet;

/// State shared by all evaluations of all policies.
#[derive(Default)]
pub struct SharedState {
    buckets: DashMap<(Arc<str>, String), Bucket>,
    windows: DashMap<(Arc<str>, String), Window>,
    /// With `state.backend = redis`: the fleet buckets and windows, which then take the place of
    /// `buckets` and `windows`.
    fleet: OnceLock<Arc<Fleet>>,
}

struct Bucket {
    level: f64,
    updated: Instant,
}

struct Window {
    events: VecDeque<(Instant, i64)>,
    total: i64,
}

impl SharedState {
    /// Puts the buckets on the fleet's store from now on (once, at start-up).
    pub fn use_fleet(&self, fleet: Arc<Fleet>) {
        let _ = self.fleet.set(fleet);
    }

    /// Takes `amount` if available: returns 0.0. Otherwise takes nothing and returns the seconds until
    /// `amount` will be available (infinity if it never can be).
    pub fn bucket_take(
        &self,
        policy: &Arc<str>,
        key: &str,
        capacity: f64,
        refill: f64,
        amount: f64,
    ) -> f64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.bucket_take(policy, key, capacity, refill, amount);
        }
        let mut b = self.bucket(policy, key, capacity, refill);
        let (level, wait) = bucket::take(b.level, capacity, refill, amount);
        b.level = level;
        wait
    }

    /// Gives `amount` back (a negative amount charges more); returns the new level.
    pub fn bucket_refund(
        &self,
        policy: &Arc<str>,
        key: &str,
        capacity: f64,
        refill: f64,
        amount: f64,
    ) -> f64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.bucket_refund(policy, key, capacity, refill, amount);
        }
        let mut b = self.bucket(policy, key, capacity, refill);
        b.level = bucket::refund(b.level, capacity, amount);
        b.level
    }

    /// Adds `amount` now and returns the total of the last `window_ms` milliseconds.
    pub fn window_add(&self, policy: &Arc<str>, key: &str, window_ms: i64, amount: i64) -> i64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.window_add(policy, key, window_ms, amount);
        }
        let now = Instant::now();
        let span = std::time::Duration::from_millis(window_ms.max(0) as u64);
        let mut w = self
            .windows
            .entry((policy.clone(), key.to_owned()))
            .or_insert_with(|| Window {
                events: VecDeque::new(),
                total: 0,
            });
        while let Some(&(at, n)) = w.events.front() {
            if now.duration_since(at) < span {
                break;
            }
            w.total -= n;
            w.events.pop_front();
        }
        if amount != 0 {
            w.events.push_back((now, amount));
            w.total += amount;
        }
        w.total
    }

    /// The bucket, created full and refilled up to now.
    fn bucket(
        &self,
        policy: &Arc<str>,
        key: &str,
        capacity: f64,
        refill: f64,
    ) -> dashmap::mapref::one::RefMut<'_, (Arc<str>, String), Bucket> {
        let now = Instant::now();
        let mut b = self
            .buckets
            .entry((policy.clone(), key.to_owned()))
            .or_insert_with(|| Bucket {
                level: capacity,
                updated: now,
            });
        let dt = now.duration_since(b.updated).as_secs_f64();
        b.level = bucket::refilled(b.level, dt, capacity, refill);
        b.updated = now;
        b
    }
}

/// What one store carries: its limits, the shared state and who it is evaluating for.
pub struct HostState {
    pub limits: StoreLimits,
    pub shared: Arc<SharedState>,
    pub policy: Arc<str>,
    /// Host calls made during this evaluation (each also costs fuel).
    pub host_calls: u64,
    /// Set when the memory cap refused a growth, to tell that failure from other traps.
    pub memory_denied: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_takes_refuses_and_refunds() {
        let s = SharedState::default();
        let p: Arc<str> = Arc::from("p");
        assert_eq!(s.bucket_take(&p, "a", 100.0, 10.0, 60.0), 0.0);
        let wait = s.bucket_take(&p, "a", 100.0, 10.0, 60.0);
        assert!(wait > 1.9 && wait <= 2.0, "{wait}");
        assert_eq!(
            s.bucket_take(&p, "b", 100.0, 10.0, 60.0),
            0.0,
            "keys are separate"
        );
        assert!(s.bucket_refund(&p, "a", 100.0, 10.0, 50.0) >= 90.0);
        assert_eq!(s.bucket_take(&p, "a", 100.0, 0.0, 500.0), f64::INFINITY);
    }

    #[test]
    fn window_counts_recent_events() {
        let s = SharedState::default();
        let p: Arc<str> = Arc::from("p");
        assert_eq!(s.window_add(&p, "k", 60_000, 2), 2);
        assert_eq!(s.window_add(&p, "k", 60_000, 3), 5);
        assert_eq!(
            s.window_add(&p, "k", 0, 0),
            0,
            "a zero window forgets everything"
        );
    }
}
