//! Host-side policy state that outlives one evaluation: token buckets and sliding-window counters,
//! keyed by strings the policy chooses (namespaced per policy), plus the per-store limits. With a
//! `store` (`state.dir`), what changed is written behind, a batch each `persist`, and read back at
//! start; the request path never waits for the disk.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use slotgate_sdk::bucket;
use slotgate_sdk::calendar::{self, Period};

use crate::fleet::Fleet;
use crate::store::{BucketRow, Store, StoreError, WindowRow};

/// A bucket's or window's name: (policy, key).
type Name = (Arc<str>, String);

/// Buckets (quota windows among them) and sliding windows each kept in memory; past it the oldest
/// made is forgotten (counted in `slotgate_state_evicted_total`), so callers with keys of their own
/// choosing cannot grow the state without bound.
pub const MAX_ENTRIES: usize = 100_000;

/// Window events persisted within this much of each other are kept as one, at the later time: a
/// window then forgets them a little later, never sooner.
const WINDOW_GRAIN_MS: u64 = 100;

/// The disk behind the maps, and what changed since it was last written.
struct Durable {
    store: Arc<Store>,
    dirty_buckets: Mutex<HashSet<Name>>,
    dirty_windows: Mutex<HashSet<Name>>,
}

/// State shared by all evaluations of all policies.
#[derive(Default)]
pub struct SharedState {
    buckets: DashMap<(Arc<str>, String), Bucket>,
    windows: DashMap<(Arc<str>, String), Window>,
    /// With `state.backend = redis`: the fleet buckets and windows, which then take the place of
    /// `buckets` and `windows`.
    fleet: OnceLock<Arc<Fleet>>,
    /// With `state.dir`: where `buckets` and `windows` are kept across restarts.
    durable: OnceLock<Durable>,
    /// The current window of each quota period in use (parsed period, (start, end)).
    windows_of: DashMap<String, (Period, (i64, i64))>,
    /// Limits an operator set, by policy, key and period: they replace the policy's.
    quota_limits: DashMap<(Arc<str>, String, String), f64>,
    /// The limit each quota's policy asks for itself, by policy, key and period, as its last call
    /// gave it: what a quota goes back to when an operator's limit is taken away, and the quotas
    /// an operator may change (at most `MAX_ENTRIES`).
    policy_limits: DashMap<(Arc<str>, String, String), f64>,
    /// One-off grants above a quota's limit, by policy, key and period: (the start of the window
    /// they are for, the amount). A grant ends with its window.
    grants: DashMap<(Arc<str>, String, String), (i64, f64)>,
    /// The counter of each (policy, event) counted.
    events: DashMap<(Arc<str>, String), metrics::Counter>,
    /// The buckets and the windows in the order they were made, to forget the oldest at
    /// [`MAX_ENTRIES`] (a name forgotten since may still be here).
    made: Mutex<(VecDeque<Name>, VecDeque<Name>)>,
}

/// Distinct (policy, event) series of `slotgate_policy_events_total`.
const EVENT_SERIES: usize = 256;

struct Bucket {
    level: f64,
    updated: Instant,
    /// As the policy's last call gave them (`None` after a restart until its next call: the store
    /// keeps only the level and its time).
    shape: Option<(f64, f64)>,
}

/// One bucket as `/status` shows it: its level now.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketLevel {
    pub policy: String,
    pub key: String,
    pub level: f64,
    pub capacity: Option<f64>,
    pub refill_per_second: Option<f64>,
}

/// One calendar quota as `/status` shows it: what is left in its current window.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaLevel {
    pub policy: String,
    pub key: String,
    pub period: String,
    pub window_start_ms: i64,
    pub window_end_ms: i64,
    /// The operator's limit, else the policy's as its last call gave it (`None` after a restart
    /// until its next call).
    pub limit: Option<f64>,
    pub left: f64,
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
        drop(b);
        self.changed_bucket(policy, key);
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
        let level = b.level;
        drop(b);
        self.changed_bucket(policy, key);
        level
    }

    /// Adds `amount` now and returns the total of the last `window_ms` milliseconds.
    pub fn window_add(&self, policy: &Arc<str>, key: &str, window_ms: i64, amount: i64) -> i64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.window_add(policy, key, window_ms, amount);
        }
        let now = Instant::now();
        let span = std::time::Duration::from_millis(window_ms.max(0) as u64);
        self.room_for(false, policy, key);
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
        let changed = amount != 0;
        if changed {
            w.events.push_back((now, amount));
            w.total += amount;
        }
        let total = w.total;
        drop(w);
        if changed {
            if let Some(d) = self.durable.get() {
                lock(&d.dirty_windows).insert((policy.clone(), key.to_owned()));
            }
        }
        total
    }

    /// The bucket's level now, refilled, without taking anything or creating it.
    pub fn bucket_level(&self, policy: &Arc<str>, key: &str, capacity: f64, refill: f64) -> f64 {
        if let Some(fleet) = self.fleet.get() {
            return fleet.bucket_level(policy, key, capacity, refill);
        }
        let name = (policy.clone(), key.to_owned());
        self.buckets.get(&name).map_or(capacity, |b| {
            let since = Instant::now().saturating_duration_since(b.updated);
            bucket::refilled(b.level, since.as_secs_f64(), capacity, refill)
        })
    }

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
        let now = wall_ms();
        let (bucket, (start, end)) = self.quota_window(key, period, now)?;
        let limit = self.quota_limit(policy, key, period, limit);
        let new_window = !self.buckets.contains_key(&(policy.clone(), bucket.clone()));
        let wait = self.bucket_take(policy, &bucket, limit, 0.0, amount);
        if new_window && self.fleet.get().is_none() {
            self.forget_window_before(policy, key, period, start);
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
        let now = wall_ms();
        let at = if at_ms == 0 { now } else { at_ms };
        let (bucket, (_, end)) = self.quota_window(key, period, at)?;
        let limit = self.quota_limit(policy, key, period, limit);
        if end <= now {
            return Ok(self.bucket_level(policy, &bucket, limit, 0.0));
        }
        Ok(self.bucket_refund(policy, &bucket, limit, 0.0, amount))
    }

    /// `quota_level`: what is left in the current window of `period`.
    pub fn quota_level(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        limit: f64,
    ) -> Result<f64, String> {
        let (bucket, _) = self.quota_window(key, period, wall_ms())?;
        let limit = self.quota_limit(policy, key, period, limit);
        Ok(self.bucket_level(policy, &bucket, limit, 0.0))
    }

    /// `quota_limit`: the limit in force (the operator's, else `limit`).
    pub fn quota_limit_in_force(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        limit: f64,
    ) -> f64 {
        match self.fleet.get() {
            Some(fleet) => fleet
                .limit(policy, key, &canonical(period))
                .unwrap_or(limit),
            None => self.quota_limit(policy, key, period, limit),
        }
    }

    /// The fleet backend, when budgets are on it.
    pub fn fleet(&self) -> Option<&Arc<Fleet>> {
        self.fleet.get()
    }

    /// The bucket of the quota's current window.
    pub fn quota_bucket_now(&self, key: &str, period: &str) -> Result<String, String> {
        Ok(self.quota_window(key, period, wall_ms())?.0)
    }

    /// An operator's limit of a quota: the fleet's, or this sidecar's.
    fn operator_limit(&self, policy: &Arc<str>, key: &str, period: &str) -> Option<f64> {
        let period = canonical(period);
        match self.fleet.get() {
            Some(fleet) => fleet.limit(policy, key, &period),
            None => self
                .quota_limits
                .get(&(policy.clone(), key.to_owned(), period))
                .map(|l| *l),
        }
    }

    /// `quota_reset_ms`: when the current window of `period` ends.
    pub fn quota_reset_ms(&self, period: &str) -> Result<i64, String> {
        Ok(self.quota_window("", period, wall_ms())?.1 .1)
    }

    /// The limit of a quota: the operator's, where one is set, else the policy's.
    /// On the fleet backend the policy's: the fleet's store puts an operator's in its place.
    fn quota_limit(&self, policy: &Arc<str>, key: &str, period: &str, limit: f64) -> f64 {
        self.note_policy_limit(policy, key, period, limit);
        if (self.quota_limits.is_empty() && self.grants.is_empty()) || self.fleet.get().is_some() {
            return limit;
        }
        let id = (policy.clone(), key.to_owned(), canonical(period));
        let base = self.quota_limits.get(&id).map_or(limit, |l| *l);
        base + self.grant_now(&id, key, period)
    }

    /// What a grant adds to a quota in its current window (0 without one, or once it ended).
    fn grant_now(&self, id: &(Arc<str>, String, String), key: &str, period: &str) -> f64 {
        self.grant_at(id, key, period, wall_ms())
    }

    /// What a grant adds to a quota in the window that holds `at_ms`: only the window it was
    /// given in.
    fn grant_at(
        &self,
        id: &(Arc<str>, String, String),
        key: &str,
        period: &str,
        at_ms: i64,
    ) -> f64 {
        let Some((start, amount)) = self.grants.get(id).map(|g| *g) else {
            return 0.0;
        };
        match self.quota_window(key, period, at_ms) {
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
        let policy: Arc<str> = Arc::from(policy);
        let (bucket, (start, _)) = self.quota_window(key, period, wall_ms())?;
        let id = (policy.clone(), key.to_owned(), canonical(period));
        let before = self.grant_now(&id, key, period);
        if let Some(d) = self.durable.get() {
            d.store
                .put_grant(&policy, key, &id.2, (start, before + amount))
                .map_err(|e| e.to_string())?;
        }
        // The window's capacity now: the limit in force and what was granted before.
        let in_use = self.window_limit(&policy, key, period, &bucket);
        let base = self
            .operator_limit(&policy, key, period)
            .or_else(|| self.policy_limit(&policy, key, period));
        self.grants.insert(id, (start, before + amount));
        Ok(in_use.map(|seen| {
            let cap = base.map_or(seen, |b| b + before);
            self.adjust_window(&policy, &bucket, cap, cap + amount, amount)
        }))
    }

    /// Remembers the limit a policy asks for a quota (a look-up when it is unchanged).
    fn note_policy_limit(&self, policy: &Arc<str>, key: &str, period: &str, limit: f64) {
        let id = (policy.clone(), key.to_owned(), period.to_owned());
        if self.policy_limits.get(&id).is_some_and(|l| *l == limit) {
            return;
        }
        if self.policy_limits.len() >= MAX_ENTRIES && !self.policy_limits.contains_key(&id) {
            return;
        }
        self.policy_limits.insert(id, limit);
    }

    /// The limit the policy itself asks for a quota, when one of its calls said.
    fn policy_limit(&self, policy: &Arc<str>, key: &str, period: &str) -> Option<f64> {
        let canon = canonical(period);
        self.policy_limits
            .iter()
            .find(|e| e.key().0 == *policy && e.key().1 == key && canonical(&e.key().2) == canon)
            .map(|e| *e.value())
    }

    /// Whether a quota is one a policy keeps: one of its calls named it, an operator set its
    /// limit, or its current window is in use. Else the quotas of `policy` (or of `key`) that are,
    /// as `policy key period`, at most 20: what an operator meant to name, perhaps.
    pub fn quota_known(&self, policy: &str, key: &str, period: &str) -> Result<(), Vec<String>> {
        let p: Arc<str> = Arc::from(policy);
        let canon = canonical(period);
        let named = self.policy_limit(&p, key, period).is_some()
            || self
                .quota_limits
                .contains_key(&(p.clone(), key.to_owned(), canon.clone()))
            || self
                .quota_window(key, period, wall_ms())
                .is_ok_and(|(bucket, _)| self.buckets.contains_key(&(p.clone(), bucket)));
        if named {
            return Ok(());
        }
        let mut known: Vec<String> = self
            .policy_limits
            .iter()
            .map(|e| e.key().clone())
            .chain(self.quota_limits.iter().map(|e| e.key().clone()))
            .filter(|(q, k, _)| **q == *policy || k == key)
            .map(|(q, k, per)| format!("{q} {k} {}", canonical(&per)))
            .collect();
        known.sort();
        known.dedup();
        known.truncate(20);
        Err(known)
    }

    /// The bucket a quota's window is kept in, and the window (start, end), for the window of
    /// `period` holding `at_ms`. Windows are computed once per period and window.
    fn quota_window(
        &self,
        key: &str,
        period: &str,
        at_ms: i64,
    ) -> Result<(String, (i64, i64)), String> {
        if let Some(e) = self.windows_of.get(period) {
            let (p, w) = &*e;
            if w.0 <= at_ms && at_ms < w.1 {
                return Ok((calendar::quota_bucket(key, p, w.0), *w));
            }
        }
        let p = Period::parse(period)?;
        let w = calendar::window(&p, at_ms)?;
        // The current window is kept (a refund's older one is computed each time), for a bounded
        // number of periods (a policy may pass any string).
        if at_ms + 1000 >= wall_ms() && self.windows_of.len() < 1024 {
            self.windows_of.insert(period.to_owned(), (p.clone(), w));
        }
        Ok((calendar::quota_bucket(key, &p, w.0), w))
    }

    /// Forgets the quota's previous window (its bucket and its row on disk) once a new one has
    /// begun: nothing can be taken from an ended window nor given back to it.
    fn forget_window_before(&self, policy: &Arc<str>, key: &str, period: &str, start: i64) {
        let Ok((old, _)) = self.quota_window(key, period, start - 1) else {
            return;
        };
        if self
            .buckets
            .remove(&(policy.clone(), old.clone()))
            .is_some()
        {
            self.changed_bucket(policy, &old);
        }
    }

    /// `event`: counts it in `slotgate_policy_events_total{policy, event}`, for at most
    /// [`EVENT_SERIES`] pairs (a policy may name any number of events): later ones count as
    /// `other`.
    pub fn event(&self, policy: &Arc<str>, name: &str) {
        let id = (policy.clone(), name.to_owned());
        if let Some(c) = self.events.get(&id) {
            c.increment(1);
            return;
        }
        let name = if self.events.len() < EVENT_SERIES {
            name
        } else {
            "other"
        };
        let c = metrics::counter!(crate::metrics::POLICY_EVENTS_TOTAL,
            "policy" => policy.to_string(), "event" => name.to_owned());
        c.increment(1);
        self.events.insert(id, c);
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
        let policy: Arc<str> = Arc::from(policy);
        let (bucket, _) = self.quota_window(key, period, wall_ms())?;
        let old = self.window_limit(&policy, key, period, &bucket);
        if let Some(d) = self.durable.get() {
            d.store
                .put_limit(&policy, key, &canonical(period), limit)
                .map_err(|e| e.to_string())?;
        }
        let id = (policy.clone(), key.to_owned(), canonical(period));
        match limit {
            Some(l) => {
                self.quota_limits.insert(id, l);
            }
            None => {
                self.quota_limits.remove(&id);
            }
        }
        let Some(old) = old else {
            // Not used in this window yet: it starts whole at whichever limit applies.
            return Ok(limit.unwrap_or(f64::NAN));
        };
        // Back to the policy's own limit: what was used stays used, against that limit.
        let new = limit
            .or_else(|| self.policy_limit(&policy, key, period))
            .unwrap_or(old);
        Ok(self.adjust_window(&policy, &bucket, old, new, new - old))
    }

    /// Whether an operator set this quota's limit.
    pub fn has_quota_limit(&self, policy: &str, key: &str, period: &str) -> bool {
        self.operator_limit(&Arc::from(policy), key, period)
            .is_some()
    }

    /// The quota's limit as its current window knows it (the operator's, else the policy's last),
    /// `None` when unknown.
    pub fn quota_limit_of(&self, policy: &str, key: &str, period: &str) -> Option<f64> {
        let policy: Arc<str> = Arc::from(policy);
        let (bucket, _) = self.quota_window(key, period, wall_ms()).ok()?;
        self.window_limit(&policy, key, period, &bucket)
            .or_else(|| self.operator_limit(&policy, key, period))
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
        let policy: Arc<str> = Arc::from(policy);
        let (bucket, _) = self.quota_window(key, period, wall_ms())?;
        let Some(limit) = self.window_limit(&policy, key, period, &bucket) else {
            return Ok(None);
        };
        let left = self.bucket_level(&policy, &bucket, limit, 0.0);
        let amount = amount.unwrap_or(limit - left).max(0.0);
        Ok(Some(
            self.adjust_window(&policy, &bucket, limit, limit, amount),
        ))
    }

    /// The limit a window in use was last taken from at: the operator's, else the policy's as its
    /// last call gave it. `None` when this sidecar holds no such window.
    fn window_limit(
        &self,
        policy: &Arc<str>,
        key: &str,
        period: &str,
        bucket: &str,
    ) -> Option<f64> {
        let name = (policy.clone(), bucket.to_owned());
        let seen = match self.fleet.get() {
            Some(fleet) => fleet.bucket_shape(policy, bucket),
            None => self.buckets.get(&name).map(|b| b.shape.map(|s| s.0)),
        }?;
        self.operator_limit(policy, key, period).or(seen)
    }

    /// Moves a window from limit `old` to `new`, adding `amount` to what is left; returns it.
    fn adjust_window(
        &self,
        policy: &Arc<str>,
        bucket: &str,
        old: f64,
        new: f64,
        amount: f64,
    ) -> f64 {
        if self.fleet.get().is_none() {
            // The capacity first, so that a raised limit has room for what it adds.
            if let Some(mut b) = self.buckets.get_mut(&(policy.clone(), bucket.to_owned())) {
                b.shape = Some((new.max(old), 0.0));
            }
        }
        let left = self.bucket_refund(policy, bucket, new.max(old), 0.0, amount);
        if new < old {
            return self.bucket_refund(policy, bucket, new, 0.0, 0.0).min(left);
        }
        left
    }

    fn changed_bucket(&self, policy: &Arc<str>, key: &str) {
        if let Some(d) = self.durable.get() {
            lock(&d.dirty_buckets).insert((policy.clone(), key.to_owned()));
        }
    }

    /// Keeps the buckets and windows in `store` from now on, starting from what it holds (once, at
    /// start-up, before any evaluation). Returns how many buckets and windows it held.
    pub fn use_store(&self, store: Arc<Store>) -> Result<(usize, usize), StoreError> {
        for ((policy, key, period), limit) in store.load_limits()? {
            self.quota_limits
                .insert((Arc::from(policy), key, period), limit);
        }
        for ((policy, key, period), grant) in store.load_grants()? {
            self.grants.insert((Arc::from(policy), key, period), grant);
        }
        if self.fleet.get().is_some() {
            // The fleet's store holds the budgets: this one keeps the operator's limits only.
            let _ = self.durable.set(Durable {
                store,
                dirty_buckets: Mutex::default(),
                dirty_windows: Mutex::default(),
            });
            return Ok((0, 0));
        }
        let (buckets, windows) = store.load()?;
        let (now, wall) = clocks();
        let counts = (buckets.len(), windows.len());
        let mut made = lock(&self.made);
        for b in buckets {
            let name: Name = (Arc::from(b.policy), b.key);
            made.0.push_back(name.clone());
            self.buckets.insert(
                name,
                Bucket {
                    level: b.level,
                    updated: instant_of(b.updated_ms, now, wall),
                    shape: None,
                },
            );
        }
        for w in windows {
            let events: VecDeque<(Instant, i64)> = w
                .events
                .iter()
                .map(|&(at, n)| (instant_of(at, now, wall), n))
                .collect();
            let total = events.iter().map(|e| e.1).sum();
            let name: Name = (Arc::from(w.policy), w.key);
            made.1.push_back(name.clone());
            self.windows.insert(name, Window { events, total });
        }
        drop(made);
        let _ = self.durable.set(Durable {
            store,
            dirty_buckets: Mutex::default(),
            dirty_windows: Mutex::default(),
        });
        Ok(counts)
    }

    /// The file budgets are kept in, if any.
    pub fn store_file(&self) -> Option<std::path::PathBuf> {
        self.durable.get().map(|d| d.store.file().to_owned())
    }

    /// Writes what changed since the last call, in one durable commit; returns how many buckets and
    /// windows. On failure what was to be written stays to be written.
    pub fn persist(&self) -> Result<usize, StoreError> {
        let Some(d) = self.durable.get() else {
            return Ok(0);
        };
        let buckets_due = std::mem::take(&mut *lock(&d.dirty_buckets));
        let windows_due = std::mem::take(&mut *lock(&d.dirty_windows));
        if buckets_due.is_empty() && windows_due.is_empty() {
            return Ok(0);
        }
        let (now, wall) = clocks();
        let mut gone = Vec::new();
        let buckets: Vec<BucketRow> = buckets_due
            .iter()
            .filter_map(|name| {
                let Some(b) = self.buckets.get(name) else {
                    gone.push((name.0.to_string(), name.1.clone()));
                    return None;
                };
                Some(BucketRow {
                    policy: name.0.to_string(),
                    key: name.1.clone(),
                    level: b.level,
                    updated_ms: wall_ms_of(b.updated, now, wall),
                })
            })
            .collect();
        let windows: Vec<WindowRow> = windows_due
            .iter()
            .filter_map(|name| {
                let w = self.windows.get(name)?;
                let mut events: Vec<(u64, i64)> = Vec::new();
                for &(at, n) in &w.events {
                    let ms = wall_ms_of(at, now, wall).div_ceil(WINDOW_GRAIN_MS) * WINDOW_GRAIN_MS;
                    match events.last_mut() {
                        Some(last) if last.0 == ms => last.1 += n,
                        _ => events.push((ms, n)),
                    }
                }
                Some(WindowRow {
                    policy: name.0.to_string(),
                    key: name.1.clone(),
                    events,
                })
            })
            .collect();
        match d.store.write(&buckets, &windows, &gone) {
            Ok(()) => Ok(buckets.len() + windows.len() + gone.len()),
            Err(e) => {
                lock(&d.dirty_buckets).extend(buckets_due);
                lock(&d.dirty_windows).extend(windows_due);
                Err(e)
            }
        }
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
        self.room_for(true, policy, key);
        let mut b = self
            .buckets
            .entry((policy.clone(), key.to_owned()))
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

    /// Before a bucket (`bucket`) or a window is looked up that may be made: when it is new and the
    /// map holds [`MAX_ENTRIES`], the oldest made are forgotten first.
    fn room_for(&self, bucket: bool, policy: &Arc<str>, key: &str) {
        let name = (policy.clone(), key.to_owned());
        let len = match bucket {
            true if self.buckets.contains_key(&name) => return,
            false if self.windows.contains_key(&name) => return,
            true => self.buckets.len(),
            false => self.windows.len(),
        };
        let mut made = lock(&self.made);
        let order = if bucket { &mut made.0 } else { &mut made.1 };
        let mut evicted = 0;
        let mut len = len;
        while len >= MAX_ENTRIES {
            let Some(old) = order.pop_front() else { break };
            let gone = match bucket {
                true => self.buckets.remove(&old).is_some(),
                false => self.windows.remove(&old).is_some(),
            };
            if gone {
                evicted += 1;
                len -= 1;
                // Forgotten on disk too, at the next write (see `persist`).
                if let Some(d) = self.durable.get() {
                    let dirty = if bucket {
                        &d.dirty_buckets
                    } else {
                        &d.dirty_windows
                    };
                    lock(dirty).insert(old);
                }
            }
        }
        order.push_back(name);
        if order.len() > 2 * MAX_ENTRIES {
            match bucket {
                true => order.retain(|n| self.buckets.contains_key(n)),
                false => order.retain(|n| self.windows.contains_key(n)),
            }
        }
        drop(made);
        crate::metrics::state_evicted(if bucket { "buckets" } else { "windows" }, evicted);
    }

    /// The buckets of this sidecar with their levels now (refilled as the policy's last call said,
    /// nothing changed), the emptiest first, at most `limit`; and how many there are. With the redis
    /// backend the fleet's buckets are in the store, not here.
    pub fn bucket_levels(&self, limit: usize) -> (Vec<BucketLevel>, usize) {
        self.levels(limit, false)
    }

    /// The calendar quotas of this sidecar in their current windows, with what is left, the
    /// emptiest first, at most `limit`; and how many there are.
    pub fn quota_levels(&self, limit: usize) -> (Vec<QuotaLevel>, usize) {
        let now = wall_ms();
        let (levels, _) = self.levels(usize::MAX, true);
        let mut all: Vec<QuotaLevel> = levels
            .into_iter()
            .filter_map(|b| {
                let (key, period, start) = calendar::parse_quota_bucket(&b.key)?;
                let (_, end) = calendar::window(&period, start).ok()?;
                (end > now).then(|| QuotaLevel {
                    limit: self
                        .operator_limit(&Arc::from(b.policy.as_str()), key, &period.to_string())
                        .or(b.capacity),
                    policy: b.policy.clone(),
                    key: key.to_owned(),
                    period: period.to_string(),
                    window_start_ms: start,
                    window_end_ms: end,
                    left: b.level,
                })
            })
            .collect();
        let count = all.len();
        all.truncate(limit);
        (all, count)
    }

    /// Buckets (`quotas` false) or the buckets of quota windows (true), the emptiest first. On the
    /// fleet backend: those this sidecar holds a lease of, at the fleet's level.
    fn levels(&self, limit: usize, quotas: bool) -> (Vec<BucketLevel>, usize) {
        let all: Vec<BucketLevel> = match self.fleet.get() {
            Some(fleet) => fleet
                .leased()
                .into_iter()
                .filter(|(_, key, ..)| calendar::parse_quota_bucket(key).is_some() == quotas)
                .map(|(policy, key, capacity, refill)| BucketLevel {
                    level: fleet.bucket_level(&policy, &key, capacity, refill),
                    policy: policy.to_string(),
                    key,
                    capacity: Some(capacity),
                    refill_per_second: Some(refill),
                })
                .collect(),
            None => {
                let now = Instant::now();
                self.buckets
                    .iter()
                    .filter(|e| calendar::parse_quota_bucket(&e.key().1).is_some() == quotas)
                    .map(|e| {
                        let (name, b) = (e.key(), e.value());
                        let level = match b.shape {
                            Some((capacity, refill)) => bucket::refilled(
                                b.level,
                                now.duration_since(b.updated).as_secs_f64(),
                                capacity,
                                refill,
                            ),
                            None => b.level,
                        };
                        BucketLevel {
                            policy: name.0.to_string(),
                            key: name.1.clone(),
                            level,
                            capacity: b.shape.map(|s| s.0),
                            refill_per_second: b.shape.map(|s| s.1),
                        }
                    })
                    .collect()
            }
        };
        emptiest_first(all, limit)
    }
}

/// `all`, the emptiest (by share of its capacity) first, cut to `limit`; and how many there were.
fn emptiest_first(mut all: Vec<BucketLevel>, limit: usize) -> (Vec<BucketLevel>, usize) {
    let count = all.len();
    let fill = |b: &BucketLevel| b.capacity.map_or(f64::INFINITY, |c| b.level / c.max(1e-9));
    all.sort_by(|a, b| fill(a).total_cmp(&fill(b)).then_with(|| a.key.cmp(&b.key)));
    all.truncate(limit);
    (all, count)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A period as the quotas are kept under (`day@UTC` is `day`); one that does not parse as itself.
fn canonical(period: &str) -> String {
    Period::parse(period).map_or_else(|_| period.to_owned(), |p| p.to_string())
}

/// Wall-clock time in Unix milliseconds: `wall_ms`, the quota windows, `now_unix_ms`.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Now, on the monotonic clock and in Unix milliseconds.
fn clocks() -> (Instant, u64) {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (Instant::now(), wall)
}

/// The Unix milliseconds of `at`.
fn wall_ms_of(at: Instant, now: Instant, wall: u64) -> u64 {
    wall.saturating_sub(now.saturating_duration_since(at).as_millis() as u64)
}

/// The instant of Unix milliseconds `ms`: one in the future (a clock set back) is now; one before
/// this machine's monotonic clock began is as early as it can be told.
fn instant_of(ms: u64, now: Instant, wall: u64) -> Instant {
    let ago = Duration::from_millis(wall.saturating_sub(ms));
    now.checked_sub(ago).unwrap_or_else(|| {
        // As far back as the clock goes, halving until it can.
        let mut back = ago;
        loop {
            back /= 2;
            if let Some(t) = now.checked_sub(back) {
                return t;
            }
        }
    })
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
    fn a_grant_ends_with_its_window_whatever_the_zone() {
        let s = SharedState::default();
        for period in ["day", "day@Europe/Berlin", "week", "month@America/New_York"] {
            let id = (
                Arc::from("quota"),
                "tokens:alice".to_owned(),
                canonical(period),
            );
            s.grant_quota("quota", "tokens:alice", period, 500.0)
                .unwrap();
            s.grant_quota("quota", "tokens:alice", period, 250.0)
                .unwrap();
            let now = wall_ms();
            let (_, (start, end)) = s.quota_window("tokens:alice", period, now).unwrap();
            assert_eq!(
                s.grant_at(&id, "tokens:alice", period, now),
                750.0,
                "{period}"
            );
            assert_eq!(
                s.grant_at(&id, "tokens:alice", period, start),
                750.0,
                "{period}"
            );
            assert_eq!(
                s.grant_at(&id, "tokens:alice", period, end - 1),
                750.0,
                "{period}"
            );
            assert_eq!(
                s.grant_at(&id, "tokens:alice", period, end),
                0.0,
                "{period}: the grant ends at its window's end, {end}"
            );
            assert_eq!(
                s.grant_at(&id, "tokens:alice", period, start - 1),
                0.0,
                "{period}"
            );
        }
    }

    #[test]
    fn budgets_kept_in_a_store_are_there_after_a_restart() {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-state-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let p: Arc<str> = Arc::from("budget");
        let s = SharedState::default();
        s.use_store(Arc::new(Store::open(&dir).unwrap())).unwrap();
        // A fixed quota of 100, 70 taken; a window of 5.
        assert_eq!(s.bucket_take(&p, "t", 100.0, 0.0, 70.0), 0.0);
        assert_eq!(s.window_add(&p, "w", 60_000, 5), 5);
        assert_eq!(s.persist().unwrap(), 2);
        assert_eq!(s.persist().unwrap(), 0, "nothing changed since");
        drop(s);

        let s = SharedState::default();
        assert_eq!(
            s.use_store(Arc::new(Store::open(&dir).unwrap())).unwrap(),
            (1, 1)
        );
        assert!(
            s.bucket_take(&p, "t", 100.0, 0.0, 40.0).is_infinite(),
            "30 left, never refilled"
        );
        assert_eq!(s.bucket_take(&p, "t", 100.0, 0.0, 30.0), 0.0);
        assert_eq!(s.window_add(&p, "w", 60_000, 1), 6);
    }

    #[test]
    fn levels_are_read_without_taking_and_the_emptiest_come_first() {
        let s = SharedState::default();
        let p: Arc<str> = Arc::from("budget");
        s.bucket_take(&p, "full", 100.0, 0.0, 0.0);
        s.bucket_take(&p, "low", 100.0, 0.0, 90.0);
        s.bucket_take(&p, "half", 1000.0, 0.0, 500.0);
        let (levels, count) = s.bucket_levels(2);
        assert_eq!(count, 3);
        assert_eq!(
            levels
                .iter()
                .map(|l| (l.key.as_str(), l.level))
                .collect::<Vec<_>>(),
            [("low", 10.0), ("half", 500.0)]
        );
        assert_eq!(levels[0].capacity, Some(100.0));
        assert_eq!(s.bucket_levels(9).0.len(), 3, "reading took nothing");
        assert_eq!(s.bucket_take(&p, "low", 100.0, 0.0, 10.0), 0.0);
    }

    #[test]
    fn wall_and_monotonic_times_convert_both_ways() {
        let (now, wall) = clocks();
        let ago = now - Duration::from_millis(1500);
        assert_eq!(wall_ms_of(ago, now, wall), wall - 1500);
        let back = instant_of(wall - 1500, now, wall);
        assert_eq!(now.duration_since(back), Duration::from_millis(1500));
        assert_eq!(
            instant_of(wall + 10_000, now, wall),
            now,
            "the future is now"
        );
        assert!(
            instant_of(0, now, wall) <= now,
            "before boot: as early as it goes"
        );
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
