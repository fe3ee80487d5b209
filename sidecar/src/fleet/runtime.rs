//! The `redis` state backend at run time: the leases this sidecar holds, what `bucket_take` and
//! `bucket_refund` do with them, and the background task that keeps them topped up, hands unused
//! tokens back, settles refunds and debt, counts the live sidecars and reconnects.
//!
//! The request path never waits for the store but once: when a lease cannot cover a take, one
//! synchronous fetch with a short timeout (`state.fetch-timeout`, 5 ms by default) is allowed (on the worker, inside the
//! policy's host call); then the failure mode applies.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use slotgate_sdk::bucket;

use super::lease::{Lease, LeasePolicy};
use super::store::{self, FleetStore, LeaseCall};
use crate::config::{OnUnavailable, StateConfig};
use crate::metrics as m;
use crate::store::name::{BucketName, BudgetKey, QuotaKey};

/// How often leases are checked for a top-up, a hand-back or something to settle.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(100);
/// How often this sidecar says it is alive; one not heard from for three of these is gone.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Longest wait between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Longest a background call may take before the store counts as unreachable (a paused or
/// overloaded store answers nothing rather than an error).
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// `call`, or a timeout error after [`CALL_TIMEOUT`].
async fn timed<T>(
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the state store did not answer in time",
            )))
        })
}

/// One bucket's lease and the parameters it was last used with.
struct Entry {
    lease: Lease,
    capacity: f64,
    refill: f64,
    /// The in-process bucket that stands in while the store is away (`local-share`).
    local: Option<(f64, Instant)>,
    /// The fleet bucket's level at the last sync, and when that was.
    level: Option<f64>,
    synced: Option<Instant>,
}

impl Entry {
    /// The store answered sync `seq`: `granted` tokens join the lease, the fleet bucket held
    /// `level`, and a failure-mode share kept since the last answer is forgotten.
    fn synced(&mut self, seq: u64, granted: f64, level: f64) {
        self.lease.finish_sync(seq, granted);
        self.level = Some(level);
        self.synced = Some(Instant::now());
        self.local = None;
    }
}

/// A lease that holds tokens reads the fleet bucket's level at least this often, so it learns when
/// the bucket runs nearly dry (and gives back what it holds, see [`SCARCE_RELEASE`]).
const REFRESH: Duration = Duration::from_millis(500);

/// A lease not taken from for this long, while the fleet bucket is nearly dry, goes back at once.
const SCARCE_RELEASE: Duration = Duration::from_millis(250);

/// One fleet window as this sidecar sees it: the fleet's total at the last push, and what it added
/// since.
struct WindowEntry {
    /// The fleet total the store last answered (this sidecar's pushed adds included).
    total: i64,
    /// Added here and not pushed yet.
    pending: i64,
    /// The push sent and not answered yet: sent again unchanged until it is.
    inflight: Option<(u64, i64)>,
    seq: u64,
    last_add: Instant,
}

/// What the fleet shares of the keys slotgate issues (`keys::Keys` implements it): to this room a
/// key is a copy in JSON with an id, whether it is revoked, and its version (see `keys.lua`).
pub trait SharedKeys: Send + Sync {
    /// The keys changed here and not yet shared, taken.
    fn take_unshared(&self) -> Vec<KeyCopy>;
    /// Shares these again at the next sync (they could not be pushed).
    fn not_shared(&self, ids: Vec<String>);
    /// Shares every key issued here again (the store lost them).
    fn share_all_again(&self);
    /// The fleet's copies, as read from the store: how many changed here.
    fn merge(&self, copies: Vec<String>) -> usize;
}

/// One key as the fleet's store holds it.
#[derive(Debug, Clone)]
pub struct KeyCopy {
    pub id: String,
    /// The key's record: digests, never a secret.
    pub json: String,
    pub revoked: bool,
    pub rev: u64,
}

pub struct Fleet {
    config: StateConfig,
    /// `<prefix>:<fleet>`: what every key of this fleet starts with.
    namespace: String,
    policy: LeasePolicy,
    client: redis::Client,
    /// This sidecar in the heartbeat set.
    id: String,
    leases: DashMap<BucketName, Entry>,
    /// By policy and key, and window length.
    windows: DashMap<(BudgetKey, i64), WindowEntry>,
    /// For the background task.
    store: tokio::sync::Mutex<Option<FleetStore>>,
    /// For the one synchronous fetch of a take.
    fetch_conn: Mutex<Option<redis::Connection>>,
    /// Wakes the background task to make a new fetch connection at once.
    fetch_wanted: tokio::sync::Notify,
    up: AtomicBool,
    /// Sidecars of the fleet alive at the last heartbeat (at least this one).
    live: AtomicU64,
    /// Milliseconds since the epoch of the last successful sync (0: never).
    last_sync_ms: AtomicU64,
    /// The fleet's operator limits of calendar quotas, as last read (every heartbeat): what this
    /// sidecar reports. The store applies them itself (`lease.lua`).
    limits: DashMap<QuotaKey, f64>,
    /// The keys slotgate issued, shared with the fleet under `--client-auth keys`.
    keys: std::sync::OnceLock<Arc<dyn SharedKeys>>,
    /// The fleet's keys version last read in (`u64::MAX`: never).
    keys_seen: AtomicU64,
}

impl Fleet {
    pub fn new(config: &StateConfig) -> Result<Arc<Fleet>, redis::RedisError> {
        // `rediss://`: rustls verifies the store against the system's roots (or `SSL_CERT_FILE`),
        // with ring as its crypto (installed once; a second install is a no-op error).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = config.redis_url.as_deref().unwrap_or_default();
        let client = redis::Client::open(url)?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let id = format!(
            "{}-{}-{:x}",
            host.trim(),
            std::process::id(),
            fastrand::u64(..)
        );
        Ok(Arc::new(Fleet {
            namespace: format!("{}:{}", config.prefix, config.fleet),
            config: config.clone(),
            policy: config.lease.into(),
            client,
            id,
            leases: DashMap::new(),
            windows: DashMap::new(),
            store: tokio::sync::Mutex::new(None),
            fetch_conn: Mutex::new(None),
            fetch_wanted: tokio::sync::Notify::new(),
            up: AtomicBool::new(false),
            live: AtomicU64::new(1),
            last_sync_ms: AtomicU64::new(0),
            limits: DashMap::new(),
            keys: std::sync::OnceLock::new(),
            keys_seen: AtomicU64::new(u64::MAX),
        }))
    }

    /// Shares `keys` with the fleet from now on: each made or changed here is pushed, each another
    /// sidecar made or changed is read in, within a sync or two ([`SYNC_INTERVAL`]). The keys are
    /// the prefix's, not one fleet's: a person's key works with every model's sidecars.
    pub fn share_keys(&self, keys: Arc<dyn SharedKeys>) {
        let _ = self.keys.set(keys);
    }

    fn keys_names(&self) -> [String; 3] {
        let p = &self.config.prefix;
        [
            format!("{p}:keys"),
            format!("{p}:keys-versions"),
            format!("{p}:keys-version"),
        ]
    }

    /// Pushes the keys changed here, then reads the fleet's in when its version moved.
    async fn sync_keys(&self, store: &FleetStore) -> redis::RedisResult<()> {
        let Some(keys) = self.keys.get() else {
            return Ok(());
        };
        let names = self.keys_names();
        let at = store::KeysAt {
            records: &names[0],
            versions: &names[1],
            counter: &names[2],
        };
        let mine = keys.take_unshared();
        for (i, copy) in mine.iter().enumerate() {
            let pushed =
                timed(store.key_push(&at, &copy.id, &copy.json, copy.revoked, copy.rev)).await;
            match pushed {
                Ok(true) => {
                    metrics::counter!(m::KEYS_SYNCED_TOTAL, "direction" => "pushed").increment(1)
                }
                Ok(false) => {}
                Err(e) => {
                    keys.not_shared(mine[i..].iter().map(|c| c.id.clone()).collect());
                    return Err(e);
                }
            }
        }
        let version = timed(store.keys_version(&at)).await?;
        let seen = self.keys_seen.load(Ordering::Relaxed);
        if version == seen {
            return Ok(());
        }
        if seen != u64::MAX && version < seen {
            // The store lost them (flushed, or a new one): share ours again.
            tracing::warn!("the fleet's store has fewer key changes than were read; sharing this sidecar's keys again");
            keys.share_all_again();
        }
        let all = timed(store.keys_all(&at)).await?;
        let copies = all.into_iter().map(|(_, json)| json).collect();
        let keys = keys.clone();
        let changed = tokio::task::spawn_blocking(move || keys.merge(copies))
            .await
            .unwrap_or(0);
        if changed > 0 {
            tracing::info!(
                keys = changed,
                "keys changed by other sidecars of the fleet are in force"
            );
            metrics::counter!(m::KEYS_SYNCED_TOTAL, "direction" => "pulled")
                .increment(changed as u64);
        }
        self.keys_seen.store(version, Ordering::Relaxed);
        Ok(())
    }

    /// `window_add` on the fleet window: adds here, answers the fleet's total as last synced plus
    /// what this sidecar added since (pushed in batches, every [`SYNC_INTERVAL`]). Never waits for
    /// the store; while it is away the answer is that total and this sidecar's own adds, which are
    /// pushed once it is back.
    pub fn window_add(&self, name: &BudgetKey, window_ms: i64, amount: i64) -> i64 {
        let now = Instant::now();
        let mut w = self
            .windows
            .entry((name.clone(), window_ms))
            .or_insert_with(|| WindowEntry {
                total: 0,
                pending: 0,
                inflight: None,
                seq: 0,
                last_add: now,
            });
        w.pending += amount;
        if amount != 0 {
            w.last_add = now;
        }
        w.total + w.pending + w.inflight.map_or(0, |(_, n)| n)
    }

    /// Pushes every window's pending adds and refreshes its total; forgets windows untouched for
    /// longer than themselves.
    async fn sync_windows(&self, store: &FleetStore) -> redis::RedisResult<()> {
        let now = Instant::now();
        let mut work = Vec::new();
        self.windows.retain(|id, w| {
            let window = Duration::from_millis(id.1.max(0) as u64);
            let idle = now.saturating_duration_since(w.last_add) > window + SYNC_INTERVAL;
            if idle && w.pending == 0 && w.inflight.is_none() {
                return false;
            }
            if w.inflight.is_none() {
                w.seq += 1;
                w.inflight = Some((w.seq, w.pending));
                w.pending = 0;
            }
            let (seq, n) = w.inflight.expect("set above");
            work.push((id.clone(), seq, n));
            true
        });
        for ((name, window_ms), seq, n) in work {
            let window = store::window_key(&self.namespace, &name, window_ms);
            let total = store
                .window_add(&window, window_ms, n, &self.id, seq)
                .await?;
            if let Some(mut w) = self.windows.get_mut(&(name, window_ms)) {
                if w.inflight.is_some_and(|(s, _)| s == seq) {
                    w.inflight = None;
                    w.total = total;
                }
            }
        }
        Ok(())
    }

    fn live_key(&self) -> String {
        format!("{}:live", self.namespace)
    }

    /// `bucket_take` on the fleet bucket: 0 when `amount` was taken, else the seconds until it may
    /// be (infinity if never).
    pub fn bucket_take(&self, name: &BucketName, capacity: f64, refill: f64, amount: f64) -> f64 {
        let now = Instant::now();
        {
            let mut e = self.entry(name, capacity, refill);
            if e.lease.take(amount, now, &self.policy) {
                return 0.0;
            }
        }
        // The lease cannot cover it: a fetch, briefly, before the failure mode. Three at most: one
        // may be a background sync still in flight (it is sent again as it was, see
        // `Lease::begin_sync`), asked for less than this take needs, and a concurrent take on the
        // same key may spend what a fetch brought.
        for _ in 0..3 {
            if !self.up.load(Ordering::Relaxed) {
                break;
            }
            let (seq, ask, covers) = {
                let mut e = self.entry(name, capacity, refill);
                if e.lease.spend(amount) {
                    return 0.0;
                }
                let held = e.lease.held();
                let Some((seq, ask)) = e.lease.begin_sync(capacity, amount, &self.policy) else {
                    break;
                };
                (seq, ask, held + ask.want >= amount)
            };
            let limits = self.limits_of(name);
            let call = LeaseCall {
                bucket: &store::bucket_key(&self.namespace, name),
                capacity,
                refill,
                want: ask.want,
                settle: ask.settle,
                sidecar: &self.id,
                seq,
                limits: limits.as_ref().map(|(h, f)| (h.as_str(), f.as_str())),
                expires_ms: store::quota_expiry_ms(name),
            };
            match self.fetch(&call) {
                Some(Ok((granted, level))) => {
                    let mut e = self.entry(name, capacity, refill);
                    e.synced(seq, granted, level);
                    if e.lease.spend(amount) {
                        return 0.0;
                    }
                    // Granted in full and still short: a concurrent take on this key spent it, or
                    // answered the same sync first. Ask again. (The script's numbers come back as
                    // text with 14 significant digits: "in full" allows for that.)
                    if !covers || granted >= ask.want * (1.0 - 1e-9) {
                        continue;
                    }
                    // The fleet cannot cover it either. What this lease holds goes back (at the
                    // next sync): kept, it would be stranded here while another sidecar's take
                    // finds the bucket short by just that much.
                    let short = amount - e.lease.held() - level.max(0.0);
                    e.lease.release();
                    return if refill > 0.0 && amount <= capacity {
                        (short / refill).max(0.001)
                    } else {
                        f64::INFINITY
                    };
                }
                Some(Err(e)) => {
                    // One late or failed answer on the request path is not an outage: the
                    // background task, with its longer timeout, decides whether the store is away.
                    metrics::counter!(m::STATE_ERRORS_TOTAL, "kind" => "fetch").increment(1);
                    tracing::debug!(error = %e, "a synchronous fetch failed; this take follows the failure mode");
                    break;
                }
                None => {
                    metrics::counter!(m::STATE_ERRORS_TOTAL, "kind" => "no_fetch_connection")
                        .increment(1);
                    break;
                }
            }
        }
        self.unavailable(name, capacity, refill, amount, now)
    }

    /// `bucket_refund`: settled against the fleet bucket at the next sync. Returns what the lease
    /// holds.
    pub fn bucket_refund(&self, name: &BucketName, capacity: f64, refill: f64, amount: f64) -> f64 {
        let mut e = self.entry(name, capacity, refill);
        e.lease.settle(amount);
        e.lease.held()
    }

    /// The fleet bucket's level now, read without taking: the level of the last sync, refilled
    /// since, plus what this sidecar's lease holds and what it has still to settle (other
    /// sidecars' leases are theirs). A bucket
    /// this sidecar has not synced is read from the store once (within `state.fetch-timeout`),
    /// without a lease; while the store is away it reads `capacity`, as a bucket never used.
    pub fn bucket_level(&self, name: &BucketName, capacity: f64, refill: f64) -> f64 {
        if let Some(e) = self.leases.get(name) {
            if let (Some(level), Some(at)) = (e.level, e.synced) {
                let since = at.elapsed().as_secs_f64();
                // Refunds not settled yet are the fleet's already; debts not charged are not.
                return bucket::refilled(level, since, capacity, refill)
                    + e.lease.held()
                    + e.lease.owed();
            }
        }
        if !self.up.load(Ordering::Relaxed) {
            return capacity;
        }
        // A read: nothing wanted, nothing settled, under a name of its own so that it can never
        // be taken for a retry of this sidecar's lease syncs.
        static READS: AtomicU64 = AtomicU64::new(0);
        let reader = format!("{}:read", self.id);
        let limits = self.limits_of(name);
        let call = LeaseCall {
            bucket: &store::bucket_key(&self.namespace, name),
            capacity,
            refill,
            want: 0.0,
            settle: 0.0,
            sidecar: &reader,
            seq: READS.fetch_add(1, Ordering::Relaxed),
            limits: limits.as_ref().map(|(h, f)| (h.as_str(), f.as_str())),
            expires_ms: store::quota_expiry_ms(name),
        };
        match self.fetch(&call) {
            Some(Ok((_, level))) => level,
            _ => capacity,
        }
    }

    /// The limits hash and this quota's field in it, for a calendar quota's window bucket.
    fn limits_of(&self, name: &BucketName) -> Option<(String, String)> {
        let (quota, _) = name.quota()?;
        Some((self.limits_key(), quota.field()))
    }

    fn limits_key(&self) -> String {
        format!("{}:quota-limits", self.namespace)
    }

    /// The fleet's operator limit of a quota, as last read.
    pub fn limit(&self, quota: &QuotaKey) -> Option<f64> {
        self.limits.get(quota).map(|l| *l)
    }

    /// Sets (or, `None`, removes) an operator's limit for a quota on the fleet's store, where every
    /// sidecar's takes read it, and moves its current window (`window`) with it.
    /// Returns what is left in the window, `None` when no sidecar has used it.
    pub async fn set_limit(
        &self,
        window: &BucketName,
        limit: Option<f64>,
    ) -> Result<Option<f64>, String> {
        let (quota, _) = window.quota().ok_or("a limit is a calendar quota's")?;
        let store = self.store.lock().await.clone();
        let store = store.ok_or("the fleet's state store is not reachable")?;
        let left = timed(store.set_limit(
            &self.limits_key(),
            &quota.field(),
            &store::bucket_key(&self.namespace, window),
            limit,
        ))
        .await
        .map_err(|e| e.to_string())?;
        match limit {
            Some(l) => self.limits.insert(quota.clone(), l),
            None => self.limits.remove(quota).map(|e| e.1),
        };
        Ok(left)
    }

    /// Reads every operator limit of the fleet into `limits`.
    async fn sync_limits(&self, store: &FleetStore) -> redis::RedisResult<()> {
        let all = timed(store.limits(&self.limits_key())).await?;
        let fresh: std::collections::HashSet<QuotaKey> = all
            .into_iter()
            .filter_map(|(field, limit)| {
                let id = QuotaKey::from_field(&field)?;
                self.limits.insert(id.clone(), limit);
                Some(id)
            })
            .collect();
        self.limits.retain(|id, _| fresh.contains(id));
        Ok(())
    }

    /// Every bucket this sidecar holds a lease of: (name, capacity, refill).
    pub fn leased(&self) -> Vec<(BucketName, f64, f64)> {
        self.leases
            .iter()
            .map(|e| (e.key().clone(), e.capacity, e.refill))
            .collect()
    }

    /// The capacity a bucket this sidecar holds a lease of was last used with (`None`: no lease).
    pub fn bucket_shape(&self, name: &BucketName) -> Option<Option<f64>> {
        self.leases.get(name).map(|e| Some(e.capacity))
    }

    /// The store is away: the failure mode decides. What is admitted is charged to the fleet
    /// bucket once the store is back, so the fleet's accounting stays whole.
    fn unavailable(
        &self,
        name: &BucketName,
        capacity: f64,
        refill: f64,
        amount: f64,
        now: Instant,
    ) -> f64 {
        let mut e = self.entry(name, capacity, refill);
        let wait = match self.config.on_unavailable {
            OnUnavailable::Allow => 0.0,
            OnUnavailable::Deny => 1.0,
            OnUnavailable::LocalShare => {
                let live = self.live.load(Ordering::Relaxed).max(1) as f64;
                let (cap, rate) = (capacity / live, refill / live);
                // The share starts from what the fleet bucket held at the last sync, not full: a
                // nearly dry budget stays nearly dry for each sidecar.
                let start = e.level.map_or(cap, |l| (l.max(0.0) / live).min(cap));
                let (level, at) = e.local.unwrap_or((start, now));
                let level =
                    bucket::refilled(level, now.duration_since(at).as_secs_f64(), cap, rate);
                let (level, wait) = bucket::take(level, cap, rate, amount);
                e.local = Some((level, now));
                wait
            }
        };
        if wait == 0.0 {
            e.lease.settle(-amount);
        }
        wait
    }

    fn entry(
        &self,
        name: &BucketName,
        capacity: f64,
        refill: f64,
    ) -> dashmap::mapref::one::RefMut<'_, BucketName, Entry> {
        let mut e = self.leases.entry(name.clone()).or_insert_with(|| {
            let mut lease = Lease::default();
            // A quota's lease holds only what a take needs: the fleet answers exactly as one
            // sidecar would, at the cost of a fetch per take.
            lease.set_scarce(name.quota().is_some());
            Entry {
                lease,
                capacity,
                refill,
                local: None,
                level: None,
                synced: None,
            }
        });
        e.capacity = capacity;
        e.refill = refill;
        e
    }

    /// One lease sync on the blocking connection, within `state.fetch-timeout`. The connection is
    /// made by the background task ([`Fleet::ensure_fetch_conn`]), never here: a connect (above all
    /// a TLS handshake) could take far longer than the timeout. Without one, the take follows the
    /// failure mode, as after a timeout, and the background makes a fresh one within a sync interval.
    /// `None`: no connection yet (the sync stays in flight and the background sends it).
    fn fetch(&self, call: &LeaseCall<'_>) -> Option<redis::RedisResult<(f64, f64)>> {
        let started = Instant::now();
        let mut slot = self.fetch_slot();
        let conn = slot.as_mut()?;
        let result = FleetStore::lease_blocking(conn, call);
        if result.is_err() {
            // A timed-out connection may still deliver the late answer, and a failed one may be to a
            // store that has since restarted: never reuse it. The background makes a new one now.
            *slot = None;
            self.fetch_wanted.notify_one();
        }
        metrics::histogram!(m::STATE_SYNC_SECONDS, "kind" => "fetch")
            .record(started.elapsed().as_secs_f64());
        Some(result)
    }

    /// Makes the connection for synchronous fetches when there is none (at start, after a failed or
    /// timed-out fetch, after a reconnect), off the async workers.
    async fn ensure_fetch_conn(self: &Arc<Self>) -> redis::RedisResult<()> {
        if self.fetch_slot().is_some() {
            return Ok(());
        }
        let me = self.clone();
        let conn = tokio::task::spawn_blocking(move || {
            let conn = me.client.get_connection_with_timeout(CALL_TIMEOUT)?;
            conn.set_read_timeout(Some(me.config.fetch_timeout))?;
            conn.set_write_timeout(Some(me.config.fetch_timeout))?;
            Ok::<_, redis::RedisError>(conn)
        })
        .await
        .map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Io, "connect task", e.to_string()))
        })??;
        *self.fetch_slot() = Some(conn);
        Ok(())
    }

    /// The fetch connection's place (a panic elsewhere while holding it leaves nothing half-done).
    fn fetch_slot(&self) -> std::sync::MutexGuard<'_, Option<redis::Connection>> {
        self.fetch_conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the fetch connection (the store went away: the next one is made fresh).
    fn drop_fetch_conn(&self) {
        *self.fetch_slot() = None;
    }

    fn went_down(&self, kind: &'static str, e: &redis::RedisError) {
        metrics::counter!(m::STATE_ERRORS_TOTAL, "kind" => kind).increment(1);
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(error = %e, on_unavailable = %self.config.on_unavailable, "state store unreachable; budgets follow the failure mode until it is back");
        }
        metrics::gauge!(m::STATE_UP).set(0.0);
    }

    /// The background task: connect (with backoff), heartbeat, sync every lease. Runs until the
    /// process ends.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(100);
        let mut last_beat: Option<Instant> = None;
        loop {
            let connected = self.store.lock().await.is_some();
            if !connected {
                match tokio::time::timeout(
                    Duration::from_secs(1),
                    FleetStore::connect_client(self.client.clone()),
                )
                .await
                {
                    Ok(Ok(store)) => {
                        // A fetch connection from before may be to a store that has restarted.
                        self.drop_fetch_conn();
                        *self.store.lock().await = Some(store);
                        backoff = Duration::from_millis(100);
                    }
                    Ok(Err(e)) => {
                        self.went_down("connect", &e);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                    Err(_) => {
                        metrics::counter!(m::STATE_ERRORS_TOTAL, "kind" => "connect").increment(1);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            let store = self.store.lock().await.clone().expect("connected");
            if let Err(e) = self.ensure_fetch_conn().await {
                self.went_down("connect", &e);
                *self.store.lock().await = None;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            if last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT) {
                let live_key = self.live_key();
                match timed(store.heartbeat(&live_key, &self.id, HEARTBEAT * 3)).await {
                    Ok(live) => {
                        self.live.store(live.max(1), Ordering::Relaxed);
                        last_beat = Some(Instant::now());
                        if let Err(e) = self.sync_limits(&store).await {
                            tracing::debug!(error = %e, "reading the fleet's quota limits failed; tried again at the next heartbeat");
                        }
                    }
                    Err(e) => {
                        self.went_down("heartbeat", &e);
                        self.drop_fetch_conn();
                        *self.store.lock().await = None;
                        tokio::time::sleep(backoff).await;
                        continue;
                    }
                }
            }
            match timed(self.sync_all(&store)).await {
                Ok(()) => {
                    if !self.up.swap(true, Ordering::Relaxed) {
                        tracing::info!(fleet = %self.config.fleet, "state store reachable; fleet budgets enforced");
                    }
                    metrics::gauge!(m::STATE_UP).set(1.0);
                    let now_ms = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    self.last_sync_ms.store(now_ms, Ordering::Relaxed);
                    if let Err(e) = self.sync_keys(&store).await {
                        metrics::counter!(m::STATE_ERRORS_TOTAL, "kind" => "keys").increment(1);
                        tracing::debug!(error = %e, "sharing keys with the fleet failed; tried again at the next sync");
                    }
                }
                Err(e) => {
                    self.went_down("sync", &e);
                    self.drop_fetch_conn();
                    *self.store.lock().await = None;
                    tokio::time::sleep(backoff).await;
                    continue;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(SYNC_INTERVAL) => {}
                _ = self.fetch_wanted.notified() => {}
            }
        }
    }

    /// Tops up, hands back and settles every lease that needs it, and syncs the windows.
    async fn sync_all(&self, store: &FleetStore) -> redis::RedisResult<()> {
        self.sync_windows(store).await?;
        let now = Instant::now();
        let mut work = Vec::new();
        let mut held = 0.0;
        let live = self.live.load(Ordering::Relaxed).max(1) as f64;
        self.leases.retain(|id, e| {
            // Less than a full lease per live sidecar left in the fleet: no reserves, and a lease
            // not in use goes back, so what remains can go where it is asked for.
            // A calendar quota is always scarce: it counts whole requests and tokens exactly,
            // and a reserve held here would be refused to the other sidecars (see `entry`).
            let scarce = id.quota().is_some()
                || e.level
                    .is_some_and(|l| l < e.capacity * self.policy.max_share * live);
            e.lease.set_scarce(scarce);
            if (scarce && e.lease.held() > 0.0 && e.lease.idle_for(now) >= SCARCE_RELEASE)
                || e.lease.is_aged(now, &self.policy)
            {
                e.lease.release();
            }
            if e.lease.is_idle(now, &self.policy) {
                e.lease.retire();
                e.local = None;
                if e.lease.owed() == 0.0 {
                    return false;
                }
            }
            let stale = e
                .synced
                .is_none_or(|t| now.saturating_duration_since(t) >= REFRESH);
            let sync = e
                .lease
                .begin_sync(e.capacity, 0.0, &self.policy)
                .or_else(|| (e.lease.held() > 0.0 && stale).then(|| e.lease.begin_read()));
            if let Some((seq, ask)) = sync {
                work.push((id.clone(), e.capacity, e.refill, seq, ask));
            }
            held += e.lease.held();
            true
        });
        metrics::gauge!(m::STATE_LEASE_TOKENS).set(held);
        for (name, capacity, refill, seq, ask) in work {
            let started = Instant::now();
            let bucket = store::bucket_key(&self.namespace, &name);
            let limits = self.limits_of(&name);
            let (granted, level) = store
                .lease(&LeaseCall {
                    bucket: &bucket,
                    capacity,
                    refill,
                    want: ask.want,
                    settle: ask.settle,
                    sidecar: &self.id,
                    seq,
                    limits: limits.as_ref().map(|(h, f)| (h.as_str(), f.as_str())),
                    expires_ms: store::quota_expiry_ms(&name),
                })
                .await?;
            metrics::histogram!(m::STATE_SYNC_SECONDS, "kind" => "background")
                .record(started.elapsed().as_secs_f64());
            if let Some(mut e) = self.leases.get_mut(&name) {
                e.synced(seq, granted, level);
            }
        }
        Ok(())
    }

    /// Hands every lease back (shutdown), within `timeout`.
    pub async fn release_all(&self, timeout: Duration) {
        for mut e in self.leases.iter_mut() {
            e.lease.release();
        }
        let store = self.store.lock().await.clone();
        if let Some(store) = store {
            let _ = tokio::time::timeout(timeout, self.sync_all(&store)).await;
        }
    }

    /// For `/status`.
    pub fn status(&self) -> serde_json::Value {
        let (mut leases, mut held, mut owed) = (0, 0.0, 0.0);
        for e in self.leases.iter() {
            leases += 1;
            held += e.lease.held();
            owed += e.lease.owed();
        }
        let last = self.last_sync_ms.load(Ordering::Relaxed);
        serde_json::json!({
            "backend": "redis",
            "fleet": self.config.fleet,
            "connected": self.up.load(Ordering::Relaxed),
            "on_unavailable": self.config.on_unavailable.to_string(),
            "fetch_timeout_ms": self.config.fetch_timeout.as_secs_f64() * 1e3,
            "lease": {
                "horizon_ms": self.policy.horizon.as_millis() as u64,
                "max_share": self.policy.max_share,
                "idle_ms": self.policy.idle.as_millis() as u64,
                "max_age_ms": self.policy.max_age.as_millis() as u64,
            },
            "live_sidecars": self.live.load(Ordering::Relaxed),
            "leases": leases,
            "tokens_held": held,
            "tokens_owed": owed,
            "last_sync_unix_ms": (last > 0).then_some(last),
        })
    }
}
