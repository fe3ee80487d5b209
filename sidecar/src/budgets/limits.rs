//! The limits of calendar quotas: the one each policy asks for, an operator's that replaces it
//! (kept on disk, or on a fleet in its store), and an operator's one-off grants above it for the
//! current window; and the operators' changes, which move a window in use along with them.

use std::sync::Arc;

use dashmap::DashMap;

use super::{BucketName, Budgets, QuotaKey, MAX_ENTRIES};

#[derive(Default)]
pub(super) struct Limits {
    /// Limits an operator set: they replace the policy's.
    pub(super) operator: DashMap<QuotaKey, f64>,
    /// The limit each quota's policy asks for itself, as its last call gave it: what a quota goes
    /// back to when an operator's limit is taken away, and the quotas an operator may change (at
    /// most `MAX_ENTRIES`).
    policy: DashMap<QuotaKey, f64>,
    /// One-off grants above a quota's limit: (the start of the window they are for, the amount).
    /// A grant ends with its window.
    pub(super) grants: DashMap<QuotaKey, (i64, f64)>,
}

impl Budgets {
    /// `quota_limit`: the limit in force (the operator's, else `limit`).
    pub fn quota_limit_in_force(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        limit: f64,
    ) -> f64 {
        let quota = QuotaKey::new(policy, key, period);
        match self.fleet.get() {
            Some(fleet) => fleet.limit(&quota).unwrap_or(limit),
            None => self.quota_limit(&quota, limit),
        }
    }

    /// The limit of a quota: the operator's, where one is set, else the policy's.
    /// On the fleet backend the policy's: the fleet's store puts an operator's in its place.
    pub(super) fn quota_limit(&self, quota: &QuotaKey, limit: f64) -> f64 {
        self.note_policy_limit(quota, limit);
        let l = &self.limits;
        if (l.operator.is_empty() && l.grants.is_empty()) || self.fleet.get().is_some() {
            return limit;
        }
        let base = l.operator.get(quota).map_or(limit, |l| *l);
        base + self.grant_at(quota, self.clock.wall_ms())
    }

    /// An operator's limit of a quota: the fleet's, or this sidecar's.
    pub(super) fn operator_limit(&self, quota: &QuotaKey) -> Option<f64> {
        match self.fleet.get() {
            Some(fleet) => fleet.limit(quota),
            None => self.limits.operator.get(quota).map(|l| *l),
        }
    }

    /// What a grant adds to a quota in the window that holds `at_ms`: only the window it was
    /// given in.
    fn grant_at(&self, quota: &QuotaKey, at_ms: i64) -> f64 {
        let Some((start, amount)) = self.limits.grants.get(quota).map(|g| *g) else {
            return 0.0;
        };
        match self.quota_window(&quota.policy, &quota.key, &quota.period, at_ms) {
            Ok((_, (now_start, _))) if now_start == start => amount,
            _ => 0.0,
        }
    }

    /// Grants `amount` above a quota's limit for its current window only (added to any grant of
    /// the same window), kept on disk at once; returns what is left after, `None` when the window
    /// is not in use yet (it will start whole at the limit and the grant). Not on a fleet.
    pub fn grant_quota(
        &self,
        policy: &str,
        key: &str,
        period: &str,
        amount: f64,
    ) -> Result<Option<f64>, String> {
        if self.fleet.get().is_some() {
            return Err("a grant is kept by one sidecar; on a fleet, raise the limit with `quota set` and set it back after".into());
        }
        let (quota, (start, _)) =
            self.quota_window(&Arc::from(policy), key, period, self.clock.wall_ms())?;
        let before = self.grant_at(&quota, self.clock.wall_ms());
        if let Some(d) = self.durable.get() {
            d.store
                .put_grant(&quota, (start, before + amount))
                .map_err(|e| e.to_string())?;
        }
        let window = BucketName::Quota {
            quota: quota.clone(),
            start_ms: start,
        };
        // The window's capacity now: the limit in force and what was granted before.
        let in_use = self.window_limit(&window);
        let base = self
            .operator_limit(&quota)
            .or_else(|| self.policy_limit(&quota));
        self.limits.grants.insert(quota, (start, before + amount));
        Ok(in_use.map(|seen| {
            let cap = base.map_or(seen, |b| b + before);
            self.adjust_window(&window, cap, cap + amount, amount)
        }))
    }

    /// Remembers the limit a policy asks for a quota (a look-up when it is unchanged).
    fn note_policy_limit(&self, quota: &QuotaKey, limit: f64) {
        let known = &self.limits.policy;
        if known.get(quota).is_some_and(|l| *l == limit) {
            return;
        }
        if known.len() >= MAX_ENTRIES && !known.contains_key(quota) {
            return;
        }
        known.insert(quota.clone(), limit);
    }

    /// The limit the policy itself asks for a quota, when one of its calls said.
    fn policy_limit(&self, quota: &QuotaKey) -> Option<f64> {
        self.limits.policy.get(quota).map(|l| *l)
    }

    /// Whether a quota is one a policy keeps: one of its calls named it, an operator set its
    /// limit, or its current window is in use. Else the quotas of `policy` (or of `key`) that are,
    /// as `policy key period`, at most 20: what an operator meant to name, perhaps.
    pub fn quota_known(&self, policy: &str, key: &str, period: &str) -> Result<(), Vec<String>> {
        let p: Arc<str> = Arc::from(policy);
        let quota = QuotaKey::new(&p, key, period);
        let named = self.policy_limit(&quota).is_some()
            || self.limits.operator.contains_key(&quota)
            || self
                .quota_window(&p, key, period, self.clock.wall_ms())
                .is_ok_and(|(quota, (start_ms, _))| {
                    let window = BucketName::Quota { quota, start_ms };
                    self.buckets.map.contains_key(&window)
                });
        if named {
            return Ok(());
        }
        let mut known: Vec<String> = self
            .limits
            .policy
            .iter()
            .map(|e| e.key().clone())
            .chain(self.limits.operator.iter().map(|e| e.key().clone()))
            .filter(|q| *q.policy == *policy || q.key == key)
            .map(|q| format!("{} {} {}", q.policy, q.key, q.period))
            .collect();
        known.sort();
        known.dedup();
        known.truncate(20);
        Err(known)
    }

    /// Sets an operator's limit for a quota (`None`: the policy's again, `policy_limit`), written
    /// to the store at once. The current window moves with it: what was used stays used, so what
    /// is left grows or shrinks by the difference. Returns what is left after.
    pub fn set_quota_limit(
        &self,
        policy: &str,
        key: &str,
        period: &str,
        limit: Option<f64>,
    ) -> Result<f64, String> {
        let (quota, (start, _)) =
            self.quota_window(&Arc::from(policy), key, period, self.clock.wall_ms())?;
        let window = BucketName::Quota {
            quota: quota.clone(),
            start_ms: start,
        };
        let old = self.window_limit(&window);
        if let Some(d) = self.durable.get() {
            d.store
                .put_limit(&quota, limit)
                .map_err(|e| e.to_string())?;
        }
        match limit {
            Some(l) => {
                self.limits.operator.insert(quota.clone(), l);
            }
            None => {
                self.limits.operator.remove(&quota);
            }
        }
        let Some(old) = old else {
            // Not used in this window yet: it starts whole at whichever limit applies.
            return Ok(limit.unwrap_or(f64::NAN));
        };
        // Back to the policy's own limit: what was used stays used, against that limit.
        let new = limit.or_else(|| self.policy_limit(&quota)).unwrap_or(old);
        Ok(self.adjust_window(&window, old, new, new - old))
    }

    /// Whether an operator set this quota's limit.
    pub fn has_quota_limit(&self, policy: &str, key: &str, period: &str) -> bool {
        self.operator_limit(&QuotaKey::new(&Arc::from(policy), key, period))
            .is_some()
    }

    /// The quota's limit as its current window knows it (the operator's, else the policy's last),
    /// `None` when unknown.
    pub fn quota_limit_of(&self, policy: &str, key: &str, period: &str) -> Option<f64> {
        let window = self.quota_window_now(policy, key, period).ok()?;
        let (quota, _) = window.quota()?;
        self.window_limit(&window)
            .or_else(|| self.operator_limit(quota))
    }

    /// Gives back up to `amount` of what a quota's current window used (never above its limit);
    /// `None` for the whole of it (a reset). Returns what is left after, `None` when the window is
    /// not in use (it is whole).
    pub fn quota_give_back(
        &self,
        policy: &str,
        key: &str,
        period: &str,
        amount: Option<f64>,
    ) -> Result<Option<f64>, String> {
        let window = self.quota_window_now(policy, key, period)?;
        let Some(limit) = self.window_limit(&window) else {
            return Ok(None);
        };
        let left = self.level(&window, limit, 0.0);
        let amount = amount.unwrap_or(limit - left).max(0.0);
        Ok(Some(self.adjust_window(&window, limit, limit, amount)))
    }

    /// The limit a quota's window in use was last taken from at: the operator's, else the policy's
    /// as its last call gave it. `None` when this sidecar holds no such window.
    fn window_limit(&self, window: &BucketName) -> Option<f64> {
        let (quota, _) = window.quota()?;
        let seen = match self.fleet.get() {
            Some(fleet) => fleet.bucket_shape(window),
            None => self.buckets.map.get(window).map(|b| b.shape.map(|s| s.0)),
        }?;
        self.operator_limit(quota).or(seen)
    }

    /// Moves a window from limit `old` to `new`, adding `amount` to what is left; returns it.
    fn adjust_window(&self, window: &BucketName, old: f64, new: f64, amount: f64) -> f64 {
        if self.fleet.get().is_none() {
            // The capacity first, so that a raised limit has room for what it adds.
            if let Some(mut b) = self.buckets.map.get_mut(window) {
                b.shape = Some((new.max(old), 0.0));
            }
        }
        let left = self.refund(window, new.max(old), 0.0, amount);
        if new < old {
            return self.refund(window, new, 0.0, 0.0).min(left);
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_ends_with_its_window_whatever_the_zone() {
        let s = Budgets::default();
        for period in ["day", "day@Europe/Berlin", "week", "month@America/New_York"] {
            let p: Arc<str> = Arc::from("quota");
            let id = QuotaKey::new(&p, "tokens:alice", period);
            s.grant_quota("quota", "tokens:alice", period, 500.0)
                .unwrap();
            s.grant_quota("quota", "tokens:alice", period, 250.0)
                .unwrap();
            let now = s.clock().wall_ms();
            let (_, (start, end)) = s.quota_window(&p, "tokens:alice", period, now).unwrap();
            assert_eq!(s.grant_at(&id, now), 750.0, "{period}");
            assert_eq!(s.grant_at(&id, start), 750.0, "{period}");
            assert_eq!(s.grant_at(&id, end - 1), 750.0, "{period}");
            assert_eq!(
                s.grant_at(&id, end),
                0.0,
                "{period}: the grant ends at its window's end, {end}"
            );
            assert_eq!(s.grant_at(&id, start - 1), 0.0, "{period}");
        }
    }
}
