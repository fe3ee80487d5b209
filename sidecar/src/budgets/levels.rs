//! What is left in the budgets, read without changing them: the buckets and the calendar quotas
//! of this sidecar (on a fleet, those it holds a lease of), the emptiest first, for `/status`,
//! `/quotas`, `/me` and the live view.

use slotgate_sdk::bucket;
use slotgate_sdk::calendar::{self, Period};

use super::{BucketName, BudgetKey, Budgets, QuotaKey};

/// One bucket as `/status` shows it: its level now.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketLevel {
    pub name: BudgetKey,
    pub level: f64,
    pub capacity: Option<f64>,
    pub refill_per_second: Option<f64>,
}

/// One calendar quota as `/status` shows it: what is left in its current window.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaLevel {
    pub quota: QuotaKey,
    pub window_start_ms: i64,
    pub window_end_ms: i64,
    /// The operator's limit, else the policy's as its last call gave it (`None` after a restart
    /// until its next call).
    pub limit: Option<f64>,
    pub left: f64,
}

/// A bucket of either kind and its level.
struct Level {
    name: BucketName,
    level: f64,
    shape: Option<(f64, f64)>,
}

impl Level {
    /// Its share of its capacity left (unknown capacity: last).
    fn fill(&self) -> f64 {
        self.shape
            .map_or(f64::INFINITY, |(c, _)| self.level / c.max(1e-9))
    }
}

impl Budgets {
    /// The buckets of this sidecar with their levels now (refilled as the policy's last call said,
    /// nothing changed), the emptiest first, at most `limit`; and how many there are. With the
    /// redis backend the fleet's buckets are in the store, not here.
    pub fn bucket_levels(&self, limit: usize) -> (Vec<BucketLevel>, usize) {
        let (levels, count) = self.levels(limit, false);
        let levels = levels
            .into_iter()
            .filter_map(|l| match l.name {
                BucketName::Bucket(name) => Some(BucketLevel {
                    name,
                    level: l.level,
                    capacity: l.shape.map(|s| s.0),
                    refill_per_second: l.shape.map(|s| s.1),
                }),
                BucketName::Quota { .. } => None,
            })
            .collect();
        (levels, count)
    }

    /// The calendar quotas of this sidecar in their current windows, with what is left, the
    /// emptiest first, at most `limit`; and how many there are.
    pub fn quota_levels(&self, limit: usize) -> (Vec<QuotaLevel>, usize) {
        let now = self.clock.wall_ms();
        let (levels, _) = self.levels(usize::MAX, true);
        let mut all: Vec<QuotaLevel> = levels
            .into_iter()
            .filter_map(|l| {
                let BucketName::Quota { quota, start_ms } = l.name else {
                    return None;
                };
                let period = Period::parse(&quota.period).ok()?;
                let (_, end) = calendar::window(&period, start_ms).ok()?;
                (end > now).then(|| QuotaLevel {
                    limit: self.operator_limit(&quota).or(l.shape.map(|s| s.0)),
                    quota,
                    window_start_ms: start_ms,
                    window_end_ms: end,
                    left: l.level,
                })
            })
            .collect();
        let count = all.len();
        all.truncate(limit);
        (all, count)
    }

    /// Buckets (`quotas` false) or the buckets of quota windows (true), the emptiest first. On the
    /// fleet backend: those this sidecar holds a lease of, at the fleet's level.
    fn levels(&self, limit: usize, quotas: bool) -> (Vec<Level>, usize) {
        let all: Vec<Level> = match self.fleet.get() {
            Some(fleet) => fleet
                .leased()
                .into_iter()
                .filter(|(name, ..)| name.quota().is_some() == quotas)
                .map(|(name, capacity, refill)| Level {
                    level: fleet.bucket_level(&name, capacity, refill),
                    name,
                    shape: Some((capacity, refill)),
                })
                .collect(),
            None => {
                let now = self.clock.now();
                self.buckets
                    .map
                    .iter()
                    .filter(|e| e.key().quota().is_some() == quotas)
                    .map(|e| {
                        let b = e.value();
                        let level = match b.shape {
                            Some((capacity, refill)) => bucket::refilled(
                                b.level,
                                now.duration_since(b.updated).as_secs_f64(),
                                capacity,
                                refill,
                            ),
                            None => b.level,
                        };
                        Level {
                            name: e.key().clone(),
                            level,
                            shape: b.shape,
                        }
                    })
                    .collect()
            }
        };
        emptiest_first(all, limit)
    }
}

/// `all`, the emptiest (by share of its capacity) first, cut to `limit`; and how many there were.
fn emptiest_first(mut all: Vec<Level>, limit: usize) -> (Vec<Level>, usize) {
    let count = all.len();
    all.sort_by(|a, b| {
        a.fill()
            .total_cmp(&b.fill())
            .then_with(|| tie(&a.name).cmp(&tie(&b.name)))
    });
    all.truncate(limit);
    (all, count)
}

/// The order of equally full buckets: by key; a quota's windows by period, start and key.
fn tie(name: &BucketName) -> (&str, i64, &str) {
    match name {
        BucketName::Bucket(b) => ("", 0, &b.key),
        BucketName::Quota { quota, start_ms } => (&quota.period, *start_ms, &quota.key),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn levels_are_read_without_taking_and_the_emptiest_come_first() {
        let s = Budgets::default();
        let p: Arc<str> = Arc::from("budget");
        s.bucket_take(&p, "full", 100.0, 0.0, 0.0);
        s.bucket_take(&p, "low", 100.0, 0.0, 90.0);
        s.bucket_take(&p, "half", 1000.0, 0.0, 500.0);
        let (levels, count) = s.bucket_levels(2);
        assert_eq!(count, 3);
        assert_eq!(
            levels
                .iter()
                .map(|l| (l.name.key.as_str(), l.level))
                .collect::<Vec<_>>(),
            [("low", 10.0), ("half", 500.0)]
        );
        assert_eq!(levels[0].capacity, Some(100.0));
        assert_eq!(s.bucket_levels(9).0.len(), 3, "reading took nothing");
        assert_eq!(s.bucket_take(&p, "low", 100.0, 0.0, 10.0), 0.0);
    }
}
