//! In front of llama-server's router: a pool per model (its slots and KV pool, its own fair queue
//! and Retry-After model), and the loads and evictions that keep every request's model loaded.
//!
//! - A model's pool is made on its first request and starts *paused*: nothing is admitted to it
//!   until its model is loaded. Requests for it queue in its own bounded queue meanwhile, with the
//!   expected load time in their wait estimates (Retry-After, doomed waits).
//! - slotgate loads models itself (`POST /models/load`) and forwards with `?autoload=false`, so the
//!   router never loads (and never evicts) on its own for a request that came through slotgate.
//! - When the router already runs `--models-max` models, slotgate unloads one first, and only one
//!   with nothing in service or waiting here: its pool is paused in the same step that finds it
//!   idle, so no request can start on it while it goes. With every loaded model busy, the load
//!   waits until one is idle; its waiters see that wait in their estimates.
//! - A model that fails to load (`failed`, its exit code) turns its waiters away with 503 naming
//!   it; a new load is tried on the next request after a backoff (1 s, doubling to 60 s).
//! - While the loaded children's threads together exceed the CPUs (`--model-turns auto`), the
//!   models take turns: one model decodes at a time (see `turns`).
//! - A request outside the slots that names a model (`GET /props?model=`, `/tokenize`, the count
//!   endpoints) waits the same way for its model to be loaded, holding no place in the queue, and
//!   is forwarded with `?autoload=false` too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::catalog::{Model, Router};
use super::turns::Turns;
use super::Control;
use crate::admission::{Admission, Fairness, SlotContext};
use crate::config::launch::{KvLayout, Launch};
use crate::config::{ModelOverride, ModelTurns, Slots};
use crate::error::GateError;
use crate::live::schema::{ModelLoad, ModelPool};
use crate::metrics as m;

/// How often a load in progress (or a wait for room) looks at the router's `/models`.
const POLL: Duration = Duration::from_millis(100);
/// Longest wait for a `/models/load` or `/models/unload` answer.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a model may take to load (or be unloaded) before the attempt counts as failed.
const LOAD_LIMIT: Duration = Duration::from_secs(600);
/// The load time assumed before one has been seen.
const INITIAL_LOAD: Duration = Duration::from_secs(5);
/// Backoff after a failed load: first, and at most.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// What every model's pool starts from: the global settings and the per-model overrides.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub slots: Slots,
    pub queue_depth: usize,
    pub queue_timeout: Duration,
    pub fairness: Fairness,
    /// `--tenant-queue-share`, for a model whose queue depth is its own.
    pub tenant_queue_share: f64,
    pub overrides: std::collections::BTreeMap<String, ModelOverride>,
    /// `--model-turns`.
    pub turns: ModelTurns,
    /// Overload bands, the same in every model's pool.
    pub bands: crate::admission::Bands,
}

/// One model's pool.
pub struct Pool {
    pub id: String,
    pub admission: Admission,
    pub queue_timeout: Duration,
    /// `slots` from its `[models."NAME"]` table, or a fixed `--slots`.
    fixed_slots: Option<usize>,
    load: Mutex<Load>,
    /// Requests outside the slots waiting for its model to be loaded (see `Models::wait_loaded`).
    passers: AtomicUsize,
    /// Woken when it starts admitting or its load fails.
    changed: tokio::sync::Notify,
}

/// Where a model's load stands.
#[derive(Debug, Default)]
struct Load {
    /// A load task runs for it.
    task: bool,
    /// What it is doing, for `/status`: `loading`, `waiting for room`, `unloading <model>`.
    doing: Option<String>,
    since: Option<Instant>,
    /// Its last load took this long.
    took: Option<Duration>,
    /// Failed loads in a row, the last one's words, and when the next may be tried.
    failures: u32,
    error: Option<String>,
    retry_at: Option<Instant>,
    /// It is being unloaded to make room: nothing resumes it meanwhile.
    evicting: bool,
    /// Its last request's arrival, for picking the least recently used idle model.
    used: Option<Instant>,
    /// What it was last admitted by: (slots, context, pool), for `/status`.
    shape: Option<(usize, Option<SlotContext>)>,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Load> {
        self.load.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The context its requests are counted against, once its model has been loaded and seen.
    pub fn context(&self) -> Option<SlotContext> {
        self.lock().shape.and_then(|(_, ctx)| ctx)
    }

    /// How it stands, for `/status` and `/live`.
    fn status(&self) -> ModelPool {
        let q = self.admission.stats();
        let l = self.lock();
        let now = Instant::now();
        let secs = |d: Duration| d.as_secs_f64();
        ModelPool {
            model: self.id.clone(),
            admitting: !q.closed && !self.admission.is_paused(),
            load: ModelLoad {
                doing: l.doing.clone(),
                for_seconds: l.since.map(|s| secs(now.saturating_duration_since(s))),
                last_seconds: l.took.map(secs),
                failures: u64::from(l.failures),
                error: l.error.clone(),
                retry_in_seconds: (l.retry_at)
                    .map(|at| secs(at.saturating_duration_since(now)))
                    .filter(|s| *s > 0.0),
            },
            slots: q.slots as u64,
            slots_source: match self.fixed_slots {
                Some(_) => "fixed",
                None => "its child's total_slots",
            }
            .into(),
            busy: q.busy as u64,
            serving: q.serving as u64,
            depth: q.depth as u64,
            capacity: q.capacity as u64,
            queue_timeout_seconds: self.queue_timeout.as_secs_f64(),
            kv_pool_tokens: q.kv_pool,
            kv_reserved_tokens: q.kv_reserved,
            n_ctx_slot: l.shape.and_then(|(_, c)| c).map(|c| c.n_ctx),
            estimated_wait_seconds: q.wait_seconds,
            sheddable: q.sheddable as u64,
            shed_before_first_byte: q.shed_requeued,
            shed_after_first_byte: q.shed_ended,
        }
    }

    /// A request for it arrived: refused at once while a failed load backs off, else noted (for
    /// least-recently-used eviction).
    pub fn arrive(&self) -> Result<(), GateError> {
        self.lock().used = Some(Instant::now());
        self.backoff_refusal()
    }

    /// While a failed load backs off: the 503 its requests get.
    fn backoff_refusal(&self) -> Result<(), GateError> {
        let l = self.lock();
        match l.retry_at {
            Some(at) if at > Instant::now() => Err(GateError::ModelUnavailable {
                model: self.id.clone(),
                reason: l
                    .error
                    .clone()
                    .unwrap_or_else(|| "its last load failed".into()),
                retry_after: at - Instant::now(),
            }),
            _ => Ok(()),
        }
    }

    /// A failed load's backoff has not run out: no new load is tried.
    fn backing_off(&self) -> bool {
        self.backoff_refusal().is_err()
    }

    /// Some request waits for it: queued, in service, or outside the slots for its load.
    fn waited_on(&self) -> bool {
        !self.admission.is_idle() || self.passers.load(Ordering::Acquire) > 0
    }

    /// Whether requests wait for its model to be loaded (and no backoff forbids trying).
    fn wants_load(&self) -> bool {
        self.waited_on() && self.admission.is_paused() && !self.backing_off()
    }

    /// Admits by what the router says of its loaded model: its child's slots (unless fixed), each
    /// slot's context and how the KV pool is laid out (from the child's command line).
    fn apply(&self, model: &Model) {
        let slots = self
            .fixed_slots
            .or(model.slots.map(|n| n as usize))
            .unwrap_or(1);
        let ctx = model.n_ctx.map(|n_ctx| {
            let launch = Launch::parse(&model.args, |_| None);
            let pool = match launch.kv_layout() {
                KvLayout::PerSlot => None,
                KvLayout::Shared(n) => Some(n),
                KvLayout::SharedAsSlot => Some(n_ctx),
            };
            SlotContext {
                n_ctx,
                default_n_predict: None,
                pool,
            }
        });
        let mut l = self.lock();
        if l.shape != Some((slots, ctx)) {
            l.shape = Some((slots, ctx));
            drop(l);
            self.admission.set_slots(slots);
            self.admission.set_pool(ctx.and_then(|c| c.pool));
            metrics::gauge!(m::MODEL_SLOTS_TOTAL, "model" => self.id.clone()).set(slots as f64);
        }
    }

    fn resume(&self, model: &Model) {
        self.apply(model);
        self.admission.resume();
        self.changed.notify_waiters();
        metrics::gauge!(m::MODEL_LOADED, "model" => self.id.clone()).set(1.0);
    }

    fn pause(&self) {
        self.admission.pause();
        metrics::gauge!(m::MODEL_LOADED, "model" => self.id.clone()).set(0.0);
    }
}

/// A pool's load task: whatever way it ends (a panic included), another may start.
struct Task(Arc<Pool>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.lock().task = false;
    }
}

#[derive(Clone)]
pub struct Models {
    inner: Arc<Inner>,
}

struct Inner {
    /// llama-server, for loads and unloads.
    server: Arc<dyn Control>,
    router: Arc<Router>,
    defaults: Defaults,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    /// The last load time seen of any model: the guess for one never loaded.
    typical_load: Mutex<Option<Duration>>,
    /// Threads x models last looked at (warned about, turns switched).
    warned_threads: Mutex<Option<(u64, usize)>>,
    /// The turns the pools take while the children's threads oversubscribe the CPUs.
    turns: Turns,
}

impl Models {
    pub fn new(server: Arc<dyn Control>, router: Arc<Router>, defaults: Defaults) -> Self {
        Models {
            inner: Arc::new(Inner {
                server,
                router,
                defaults,
                pools: Mutex::new(HashMap::new()),
                typical_load: Mutex::new(None),
                warned_threads: Mutex::new(None),
                turns: Turns::new(),
            }),
        }
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Pool>>> {
        self.inner.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool of the model `name` names (an id or alias the router lists), made on first use;
    /// `None` when slotgate is not in front of a router or the router does not list it.
    pub fn pool_for(&self, name: &str) -> Option<Arc<Pool>> {
        let router = &self.inner.router;
        if !router.is_on() {
            return None;
        }
        let id = router.resolve(name)?;
        if let Some(p) = self.pools().get(&id) {
            return Some(p.clone());
        }
        let pool = Arc::new(self.make(&id, name));
        // A model loaded already (by an earlier run, or by the router's own client) serves at once.
        if let Some(model) = router.model(&id).filter(Model::is_ready) {
            pool.resume(&model);
        }
        let mut pools = self.pools();
        Some(pools.entry(id).or_insert(pool).clone())
    }

    fn make(&self, id: &str, name: &str) -> Pool {
        let d = &self.inner.defaults;
        let o = d
            .overrides
            .get(id)
            .or_else(|| d.overrides.get(name))
            .cloned()
            .unwrap_or_default();
        let depth = o.queue_depth.unwrap_or(d.queue_depth);
        let mut fairness = d.fairness;
        if o.queue_depth.is_some() {
            fairness.tenant_limit = (d.tenant_queue_share < 1.0 && depth > 0)
                .then(|| ((d.tenant_queue_share * depth as f64).ceil() as usize).clamp(1, depth));
        }
        let fixed_slots = o.slots.or(match d.slots {
            Slots::Fixed(n) => Some(n),
            Slots::Auto => None,
        });
        metrics::gauge!(m::MODEL_LOADED, "model" => id.to_owned()).set(0.0);
        let admission = Admission::for_model(fixed_slots.unwrap_or(1), depth, fairness, id);
        if d.turns != ModelTurns::Off {
            self.inner.turns.seat(&admission);
        }
        admission.set_bands(d.bands.clone());
        Pool {
            id: id.to_owned(),
            admission,
            queue_timeout: o.queue_timeout.unwrap_or(d.queue_timeout),
            fixed_slots,
            load: Mutex::new(Load::default()),
            passers: AtomicUsize::new(0),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// A request outside the slots (`/props?model=`, `/tokenize`, a count) for `pool`'s model: once
    /// it is loaded, at once; else it waits for slotgate's load until `deadline` (504
    /// `queue_timeout`), or is refused with 503 when the load fails. It holds no place in the queue.
    pub async fn wait_loaded(&self, pool: &Arc<Pool>, deadline: Instant) -> Result<(), GateError> {
        struct Passer<'a>(&'a Pool);
        impl Drop for Passer<'_> {
            fn drop(&mut self) {
                self.0.passers.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let started = Instant::now();
        pool.passers.fetch_add(1, Ordering::AcqRel);
        let _passer = Passer(pool);
        loop {
            let changed = pool.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !pool.admission.is_paused() {
                return Ok(());
            }
            // A load that failed while this one waited turns it away too.
            pool.backoff_refusal()?;
            self.ensure_loaded(pool);
            tokio::select! {
                _ = changed => {}
                // Eviction, or a load task ending just as this one came: look again.
                _ = tokio::time::sleep(POLL * 5) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(GateError::QueueTimeout(started.elapsed()));
                }
            }
        }
    }

    /// A request was queued in `pool`: its model is loaded if it is not (one load task per model).
    pub fn ensure_loaded(&self, pool: &Arc<Pool>) {
        if !pool.admission.is_paused() {
            return;
        }
        {
            let mut l = pool.lock();
            if l.task || l.evicting {
                return;
            }
            l.task = true;
        }
        let (models, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            let task = Task(pool);
            models.load(&task.0).await;
            let pool = task.0.clone();
            drop(task);
            // Someone queued while the task was ending: go on for them.
            if pool.wants_load() {
                models.ensure_loaded(&pool);
            }
        });
    }

    /// Loads `pool`'s model, making room first, until it is loaded, fails, or nobody waits.
    async fn load(&self, pool: &Arc<Pool>) {
        let (router, server) = (&self.inner.router, &*self.inner.server);
        let started = Instant::now();
        let mut asked: Option<Instant> = None;
        loop {
            router.refresh(server).await;
            if pool.lock().evicting {
                tokio::time::sleep(POLL).await;
                continue;
            }
            let Some(model) = router.model(&pool.id) else {
                // Gone from the router's list: its waiters cannot be served.
                self.fail(pool, "the router no longer lists it".into());
                return;
            };
            if model.is_ready() {
                let took = asked.map(|at| at.elapsed());
                if let Some(took) = took {
                    metrics::counter!(m::MODEL_LOADS_TOTAL, "model" => pool.id.clone(), "result" => "loaded").increment(1);
                    metrics::histogram!(m::MODEL_LOAD_SECONDS, "model" => pool.id.clone())
                        .record(took.as_secs_f64());
                    *self
                        .inner
                        .typical_load
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(took);
                    tracing::info!(model = %pool.id, load_ms = took.as_millis() as u64, slots = model.slots, n_ctx_slot = model.n_ctx, "model loaded; its requests are admitted");
                }
                {
                    let mut l = pool.lock();
                    l.doing = None;
                    l.since = None;
                    l.failures = 0;
                    l.error = None;
                    l.retry_at = None;
                    if took.is_some() {
                        l.took = took;
                    }
                }
                pool.resume(&model);
                self.warn_threads();
                return;
            }
            if started.elapsed() > LOAD_LIMIT {
                self.fail(pool, format!("not loaded within {}s", LOAD_LIMIT.as_secs()));
                return;
            }
            match model.status.as_str() {
                "loading" | "downloading" | "downloaded" => {
                    self.doing(pool, "loading", self.load_estimate(pool));
                    tokio::time::sleep(POLL).await;
                    continue;
                }
                _ => {}
            }
            // Unloaded. After slotgate asked, that means its child exited.
            if asked.is_some() {
                let why = match model.exit_code {
                    Some(code) => format!("its llama-server exited with code {code} while loading"),
                    None => "its llama-server stopped while loading".into(),
                };
                self.fail(pool, why);
                return;
            }
            if !pool.waited_on() {
                // Nobody waits for it any more.
                pool.lock().doing = None;
                return;
            }
            if !self.make_room(pool).await {
                tokio::time::sleep(POLL).await;
                continue;
            }
            self.doing(pool, "loading", self.load_estimate(pool));
            let body = json!({ "model": pool.id });
            match server
                .json(Method::POST, "/models/load", Some(&body), CONTROL_TIMEOUT)
                .await
            {
                Ok(_) => {
                    tracing::info!(model = %pool.id, "loading model for its waiting requests");
                    asked = Some(Instant::now());
                }
                // Already running (loaded by someone else meanwhile), or the limit reached by a
                // load slotgate did not make: look again.
                Err(e) => {
                    tracing::debug!(model = %pool.id, error = %e, "POST /models/load refused; looking again");
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }

    /// Below `--models-max`, true at once. At it, unloads the least recently used model that
    /// nothing here uses (its pool paused in the step that finds it idle) and waits until it is
    /// gone: true. With none idle, false (the caller waits and looks again); the waiters' estimate
    /// becomes the soonest a loaded model drains plus a load.
    async fn make_room(&self, pool: &Arc<Pool>) -> bool {
        let (router, server) = (&self.inner.router, &*self.inner.server);
        let Some(max) = router.max_instances() else {
            return true;
        };
        let running: Vec<Model> = router
            .models()
            .into_iter()
            .filter(|m| m.is_running() && m.id != pool.id)
            .collect();
        if (running.len() as u64) < max {
            return true;
        }
        // Idle candidates, least recently used first: a model with no pool here was never used
        // through slotgate.
        let mut candidates: Vec<(Option<Instant>, Model, Option<Arc<Pool>>)> = running
            .into_iter()
            .filter(|m| m.is_ready())
            .map(|m| {
                let p = self.pools().get(&m.id).cloned();
                let used = p.as_ref().and_then(|p| p.lock().used);
                (used, m, p)
            })
            .collect();
        candidates.sort_by_key(|(used, _, _)| *used);
        let victim = candidates.into_iter().find(|(_, _, p)| match p {
            None => true,
            Some(p) => {
                let mut l = p.lock();
                if l.evicting || !p.admission.pause_if_idle() {
                    return false;
                }
                l.evicting = true;
                true
            }
        });
        let Some((_, victim, victim_pool)) = victim else {
            let soonest = self
                .pools()
                .values()
                .filter(|p| p.id != pool.id && !p.admission.is_paused())
                .map(|p| p.admission.stats().wait_seconds)
                .fold(f64::INFINITY, f64::min);
            let drain = Duration::try_from_secs_f64(soonest).unwrap_or(Duration::ZERO);
            self.doing(pool, "waiting for room", drain + self.load_estimate(pool));
            return false;
        };
        self.doing(
            pool,
            &format!("unloading {}", victim.id),
            self.load_estimate(pool),
        );
        if let Some(p) = &victim_pool {
            metrics::gauge!(m::MODEL_LOADED, "model" => p.id.clone()).set(0.0);
        }
        tracing::info!(model = %pool.id, unloading = %victim.id, max_instances = max, "--models-max reached: unloading an idle model to load another");
        let body = json!({ "model": victim.id });
        if let Err(e) = server
            .json(Method::POST, "/models/unload", Some(&body), CONTROL_TIMEOUT)
            .await
        {
            tracing::debug!(model = %victim.id, error = %e, "POST /models/unload refused");
        } else {
            metrics::counter!(m::MODEL_UNLOADS_TOTAL, "model" => victim.id.clone()).increment(1);
        }
        let since = Instant::now();
        loop {
            router.refresh(server).await;
            let gone = router.model(&victim.id).is_none_or(|m| !m.is_running());
            if gone || since.elapsed() > LOAD_LIMIT {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        if let Some(p) = &victim_pool {
            p.lock().evicting = false;
            // Requests that arrived for it meanwhile get it loaded again.
            if p.waited_on() {
                self.ensure_loaded(p);
            }
        }
        true
    }

    /// The load time to expect for `pool`'s model: its own last, else any model's, else 5 s.
    fn load_estimate(&self, pool: &Pool) -> Duration {
        pool.lock()
            .took
            .or(*self
                .inner
                .typical_load
                .lock()
                .unwrap_or_else(|p| p.into_inner()))
            .unwrap_or(INITIAL_LOAD)
    }

    /// Notes what a load is doing and when its pool is expected to serve.
    fn doing(&self, pool: &Pool, what: &str, ready_in: Duration) {
        let mut l = pool.lock();
        if l.doing.as_deref() != Some(what) {
            l.doing = Some(what.to_owned());
            l.since = Some(Instant::now());
            drop(l);
            pool.admission.set_ready_in(Some(ready_in));
        }
    }

    /// The load failed: its waiters get 503 naming it, and the next try waits out a backoff.
    fn fail(&self, pool: &Pool, why: String) {
        let backoff = {
            let mut l = pool.lock();
            l.failures += 1;
            let backoff = BACKOFF_FIRST
                .saturating_mul(1 << (l.failures - 1).min(6))
                .min(BACKOFF_MAX);
            l.retry_at = Some(Instant::now() + backoff);
            l.error = Some(why.clone());
            l.doing = None;
            l.since = None;
            backoff
        };
        metrics::counter!(m::MODEL_LOADS_TOTAL, "model" => pool.id.clone(), "result" => "failed")
            .increment(1);
        tracing::warn!(model = %pool.id, error = %why, retry_in_s = backoff.as_secs(), "model failed to load; its waiting requests get 503");
        pool.admission.set_ready_in(None);
        pool.admission.fail_waiters(&pool.id, &why, backoff);
        pool.changed.notify_waiters();
    }

    /// After the router's list was read (every health check): each pool follows its model. One
    /// loaded by someone else serves; one the router no longer runs (unloaded by hand, or evicted
    /// by a load slotgate did not ask for) stops admitting, and is loaded again for its waiters.
    pub fn follow(&self) {
        let pools: Vec<Arc<Pool>> = self.pools().values().cloned().collect();
        for pool in pools {
            let (task, evicting) = {
                let l = pool.lock();
                (l.task, l.evicting)
            };
            if task || evicting {
                continue;
            }
            match self.inner.router.model(&pool.id) {
                Some(model) if model.is_ready() => {
                    if pool.admission.is_paused() {
                        pool.resume(&model);
                    } else {
                        pool.apply(&model);
                    }
                }
                _ => {
                    if !pool.admission.is_paused() {
                        tracing::info!(model = %pool.id, "the router no longer runs this model: its requests wait for a load");
                        pool.pause();
                    }
                    if pool.wants_load() {
                        self.ensure_loaded(&pool);
                    }
                }
            }
        }
        self.warn_threads();
    }

    /// After each change of what the router runs: the loaded models' decoding threads against the
    /// CPUs. When they exceed them, two models decoding at once run many times slower than one after
    /// the other: warned once per change, and (`--model-turns auto`) the models take turns.
    fn warn_threads(&self) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let loaded: Vec<Model> = self
            .inner
            .router
            .models()
            .into_iter()
            .filter(Model::is_running)
            .collect();
        let threads: u64 = loaded.iter().map(|m| m.threads().unwrap_or(cpus)).sum();
        let over = loaded.len() >= 2 && threads > cpus;
        let turns = match self.inner.defaults.turns {
            ModelTurns::Auto => over,
            ModelTurns::On => loaded.len() >= 2,
            ModelTurns::Off => false,
        };
        let key = (threads, loaded.len());
        let mut warned = self
            .inner
            .warned_threads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *warned == Some(key) {
            return;
        }
        *warned = Some(key);
        let was = self.inner.turns.is_on();
        self.inner.turns.set(turns);
        if over && !turns {
            tracing::warn!(
                models = loaded.len(),
                threads,
                cpus,
                "the router's loaded models decode with more threads than this machine has CPUs and --model-turns is off: two models decoding at once run many times slower than one after the other (docs/router.md); start the router with -t so that threads x --models-max fits the CPUs"
            );
        } else if turns != was {
            match turns {
                true => tracing::info!(
                    models = loaded.len(),
                    threads,
                    cpus,
                    "models take turns: one model decodes at a time while the router's loaded models have more threads than this machine has CPUs (docs/router.md; --model-turns off for children that run on a GPU)"
                ),
                false => tracing::info!(
                    models = loaded.len(),
                    threads,
                    cpus,
                    "models no longer take turns: each decodes on its own slots"
                ),
            }
        }
    }

    /// For `/status` and `/live`: each model's pool.
    pub fn status(&self) -> Vec<ModelPool> {
        self.all().iter().map(|p| p.status()).collect()
    }

    /// For `/status`: `--model-turns` and whether the models take turns now.
    pub fn turns_status(&self) -> Value {
        json!({
            "setting": self.inner.defaults.turns.to_string(),
            "taking_turns": self.inner.turns.is_on(),
        })
    }

    /// Every pool (for the live view's waiters).
    pub fn all(&self) -> Vec<Arc<Pool>> {
        let mut pools: Vec<Arc<Pool>> = self.pools().values().cloned().collect();
        pools.sort_by(|a, b| a.id.cmp(&b.id));
        pools
    }

    /// Turns every model's waiters away (shutting down).
    pub fn close(&self, retry_after: u64) {
        for p in self.pools().values() {
            p.admission.close(retry_after);
        }
    }
}
