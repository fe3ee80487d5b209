//! Calendar quotas (`quota_take`, `quota_refund`, `quota_level`, `quota_reset_ms`): each window of
//! a quota's period is a bucket of its own, with no refill and the limit as its capacity, so each
//! window starts whole; the previous window is forgotten once a new one begins.

use std::sync::Arc;

use dashmap::DashMap;
use slotgate_sdk::calendar::{self, Period};

use super::{BucketName, Budgets, QuotaKey};

/// The current window of each quota period in use: period as the policy spells it → (canonical
/// period, (start, end)).
#[derive(Default)]
pub(super) struct Calendar {
    current: DashMap<String, (String, (i64, i64))>,
}

/// Periods whose current window is kept (a policy may pass any string).
const PERIODS_KEPT: usize = 1024;

impl Budgets {
    /// `quota_take`: takes `amount` from the window of `period` that holds now. `Ok(0.0)` when
    /// taken, else the seconds until the window ends (infinity if `amount` is over the limit).
    pub fn quota_take(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        limit: f64,
        amount: f64,
    ) -> Result<f64, String> {
        let now = self.clock.wall_ms();
        let (quota, (start, end)) = self.quota_window(policy, key, period, now)?;
        let limit = self.quota_limit(&quota, limit);
        let name = BucketName::Quota {
            quota,
            start_ms: start,
        };
        let new_window = !self.buckets.map.contains_key(&name);
        let wait = self.take(&name, limit, 0.0, amount);
        if new_window && self.fleet.get().is_none() {
            self.forget_window_before(&name, period);
        }
        Ok(match wait {
            0.0 => 0.0,
            _ if amount > limit => f64::INFINITY,
            _ => ((end - now) as f64 / 1000.0).max(0.001),
        })
    }

    /// `quota_refund`: gives `amount` back to the window that held `at_ms` (0: now), if it has not
    /// ended; returns what is left in it.
    #[allow(
        clippy::too_many_arguments,
        reason = "the host function's arguments, one for one"
    )]
    pub fn quota_refund(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        limit: f64,
        amount: f64,
        at_ms: i64,
    ) -> Result<f64, String> {
        let now = self.clock.wall_ms();
        let at = if at_ms == 0 { now } else { at_ms };
        let (quota, (start, end)) = self.quota_window(policy, key, period, at)?;
        let limit = self.quota_limit(&quota, limit);
        let name = BucketName::Quota {
            quota,
            start_ms: start,
        };
        if end <= now {
            return Ok(self.level(&name, limit, 0.0));
        }
        Ok(self.refund(&name, limit, 0.0, amount))
    }

    /// `quota_level`: what is left in the current window of `period`.
    pub fn quota_level(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        limit: f64,
    ) -> Result<f64, String> {
        let (quota, (start, _)) = self.quota_window(policy, key, period, self.clock.wall_ms())?;
        let limit = self.quota_limit(&quota, limit);
        let name = BucketName::Quota {
            quota,
            start_ms: start,
        };
        Ok(self.level(&name, limit, 0.0))
    }

    /// `quota_reset_ms`: when the current window of `period` ends.
    pub fn quota_reset_ms(&self, period: &str) -> Result<i64, String> {
        Ok(self
            .quota_window(&Arc::from(""), "", period, self.clock.wall_ms())?
            .1
             .1)
    }

    /// The bucket of the quota's current window.
    pub fn quota_window_now(
        &self,
        policy: &str,
        key: &str,
        period: &str,
    ) -> Result<BucketName, String> {
        let (quota, (start, _)) =
            self.quota_window(&Arc::from(policy), key, period, self.clock.wall_ms())?;
        Ok(BucketName::Quota {
            quota,
            start_ms: start,
        })
    }

    /// The quota, and the window (start, end) of `period` holding `at_ms`. The current window of
    /// each period is computed once.
    pub(super) fn quota_window(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        at_ms: i64,
    ) -> Result<(QuotaKey, (i64, i64)), String> {
        let quota = |canonical: String| QuotaKey {
            policy: policy.clone(),
            key: key.to_owned(),
            period: canonical,
        };
        if let Some(e) = self.calendar.current.get(period) {
            let (canonical, w) = &*e;
            if w.0 <= at_ms && at_ms < w.1 {
                return Ok((quota(canonical.clone()), *w));
            }
        }
        let p = Period::parse(period)?;
        let w = calendar::window(&p, at_ms)?;
        let canonical = p.to_string();
        // The current window is kept (a refund's older one is computed each time).
        if at_ms + 1000 >= self.clock.wall_ms() && self.calendar.current.len() < PERIODS_KEPT {
            self.calendar
                .current
                .insert(period.to_owned(), (canonical.clone(), w));
        }
        Ok((quota(canonical), w))
    }

    /// Forgets the quota's previous window (its bucket and its row on disk) once a new one, the
    /// window `name`, has begun: nothing can be taken from an ended window nor given back to it.
    fn forget_window_before(&self, name: &BucketName, period: &str) {
        let Some((quota, start)) = name.quota() else {
            return;
        };
        let Ok((quota, (old, _))) = self.quota_window(&quota.policy, &quota.key, period, start - 1)
        else {
            return;
        };
        let old = BucketName::Quota {
            quota,
            start_ms: old,
        };
        if self.buckets.map.remove(&old).is_some() {
            self.changed_bucket(&old);
        }
    }
}
