//! Token buckets: a policy's own (`bucket_take`, `bucket_refund`, `bucket_level`) and those that
//! hold the calendar quotas' windows, in this sidecar or, on a fleet, its leases.

use std::sync::Arc;
use std::time::Instant;

use slotgate_sdk::bucket;

use super::{BucketName, Budgets};

pub(super) struct Bucket {
    pub(super) level: f64,
    pub(super) updated: Instant,
    /// (capacity, refill) as the policy's last call gave them (`None` after a restart until its
    /// next call: the store keeps only the level and its time).
    pub(super) shape: Option<(f64, f64)>,
}

impl Budgets {
    /// Takes `amount` if available: returns 0.0. Otherwise takes nothing and returns the seconds
    /// until `amount` will be available (infinity if it never can be).
    pub fn bucket_take(
        &self,
        policy: &Arc<str>,
        key: &str,
        capacity: f64,
        refill: f64,
        amount: f64,
    ) -> f64 {
        self.take(&BucketName::bucket(policy, key), capacity, refill, amount)
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
        self.refund(&BucketName::bucket(policy, key), capacity, refill, amount)
    }

    /// The bucket's level now, refilled, without taking anything or creating it.
    pub fn bucket_level(&self, policy: &Arc<str>, key: &str, capacity: f64, refill: f64) -> f64 {
        self.level(&BucketName::bucket(policy, key), capacity, refill)
    }

    /// [`Budgets::bucket_take`] on any bucket.
    pub(super) fn take(&self, name: &BucketName, capacity: f64, refill: f64, amount: f64) -> f64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.bucket_take(name, capacity, refill, amount);
        }
        let mut b = self.bucket(name, capacity, refill);
        let (level, wait) = bucket::take(b.level, capacity, refill, amount);
        b.level = level;
        drop(b);
        self.changed_bucket(name);
        wait
    }

    /// [`Budgets::bucket_refund`] on any bucket.
    pub(super) fn refund(&self, name: &BucketName, capacity: f64, refill: f64, amount: f64) -> f64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.bucket_refund(name, capacity, refill, amount);
        }
        let mut b = self.bucket(name, capacity, refill);
        b.level = bucket::refund(b.level, capacity, amount);
        let level = b.level;
        drop(b);
        self.changed_bucket(name);
        level
    }

    /// [`Budgets::bucket_level`] of any bucket.
    pub(super) fn level(&self, name: &BucketName, capacity: f64, refill: f64) -> f64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.bucket_level(name, capacity, refill);
        }
        self.buckets.map.get(name).map_or(capacity, |b| {
            let since = self.clock.now().saturating_duration_since(b.updated);
            bucket::refilled(b.level, since.as_secs_f64(), capacity, refill)
        })
    }

    /// The bucket, created full and refilled up to now.
    fn bucket(
        &self,
        name: &BucketName,
        capacity: f64,
        refill: f64,
    ) -> dashmap::mapref::one::RefMut<'_, BucketName, Bucket> {
        let now = self.clock.now();
        for gone in self.buckets.room_for(name, "buckets") {
            // Forgotten on disk too, at the next write (see `persist`).
            self.changed_bucket(&gone);
        }
        let mut b = self
            .buckets
            .map
            .entry(name.clone())
            .or_insert_with(|| Bucket {
                level: capacity,
                updated: now,
                shape: None,
            });
        let dt = now.duration_since(b.updated).as_secs_f64();
        b.level = bucket::refilled(b.level, dt, capacity, refill);
        b.updated = now;
        b.shape = Some((capacity, refill));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_takes_refuses_and_refunds() {
        let s = Budgets::default();
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
}
