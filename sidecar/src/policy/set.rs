//! The policy chain and its lifecycle. Every module is compiled, its settings validated and one canary
//! evaluation run before it may serve. A request evaluates one [`Chain`] snapshot from start to end;
//! a reload builds a whole new chain off the request path and swaps it in atomically, or, if any
//! policy in it is broken, keeps serving the old one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use slotgate_sdk::{
    Completion, Decision, Earlier, EvaluateInput, RequestSummary, Verdict, ABI_VERSION,
};

use super::chain::{self, ChainOutcome, Mode, OnError, Step};
use super::component::{self, t, Isolation};
use super::engine::{EngineLimits, PolicyEngine};
use super::guest::{Compiled, Guest};
use super::module::{EvalError, Evaluation, LoadError, PolicyLimits, Runs, LOAD_DEADLINE};
use super::snapshot;
use super::state::SharedState;
use crate::config::{PolicyIsolation, PolicyMode, PolicyOnError, PolicySpec};
use crate::metrics as m;

/// Policy calls running at once; well under the engine's instance pool, which also holds the
/// instances of loads and reloads.
pub const MAX_RUNNING: usize = 64;
const _: () = assert!(MAX_RUNNING * 2 <= EngineLimits::DEFAULT_INSTANCES as usize);

#[derive(Debug, thiserror::Error)]
#[error("policy `{name}` ({path}): {error}")]
pub struct PolicyLoadError {
    pub name: String,
    pub path: String,
    pub error: LoadError,
}

/// One policy ready to serve, and what it was built from.
pub struct Loaded {
    pub name: String,
    /// Whose budgets its host state is: `name` when the operator set it, else the name the module
    /// declares (so renaming its file keeps them), else the file's.
    pub state_key: String,
    pub spec: PolicySpec,
    /// SHA-256 of the module file.
    pub sha256: [u8; 32],
    pub policy: Guest,
    pub settings: Value,
    pub mode: Mode,
    pub on_error: OnError,
    /// Its `validate_settings` asked for the exact prompt count before it decides.
    pub needs_prompt_tokens: bool,
    /// `settings` as JSON text, serialised once: every evaluation's input carries it as it is (a
    /// component's calls take it as their `settings`). `None` when the policy serves from a
    /// snapshot that holds them parsed (see `policy::snapshot`).
    settings_json: Option<Box<RawValue>>,
    /// The keys in the module cache of the compiled modules it was built from: the file's, and for
    /// a snapshot the instrumented module's and the snapshot's (SHA-256 of each).
    module_keys: Vec<[u8; 32]>,
    /// Its metric series, looked up once rather than by name on every evaluation.
    metrics: PolicyMetrics,
}

impl Loaded {
    /// Whether it serves from a snapshot that holds its settings parsed (see `policy::snapshot`).
    pub fn preinitialised(&self) -> bool {
        self.settings_json.is_none()
    }

    /// Its settings as JSON text (`null` when it holds them already).
    fn settings_text(&self) -> &str {
        self.settings_json.as_deref().map_or("null", RawValue::get)
    }
}

/// The handles of one policy's series in the metrics registry.
struct PolicyMetrics {
    eval_seconds: metrics::Histogram,
    fuel: metrics::Histogram,
    allow: metrics::Counter,
    deny: metrics::Counter,
    error: metrics::Counter,
}

impl PolicyMetrics {
    fn register(policy: &str) -> PolicyMetrics {
        let decision = |d: &'static str| metrics::counter!(m::POLICY_DECISIONS_TOTAL, "policy" => policy.to_owned(), "decision" => d);
        PolicyMetrics {
            eval_seconds: metrics::histogram!(m::POLICY_EVAL_SECONDS, "policy" => policy.to_owned()),
            fuel: metrics::histogram!(m::POLICY_FUEL_CONSUMED, "policy" => policy.to_owned()),
            allow: decision("allow"),
            deny: decision("deny"),
            error: decision("error"),
        }
    }
}

/// An [`EvaluateInput`] as JSON, for each policy of a chain in turn: the request is serialised once,
/// and each policy's settings (already JSON text) put in beside it.
struct InputJson {
    buf: Vec<u8>,
    /// `buf[..head]` is `{"abi":1,"request":{...}`: what every policy of the chain gets.
    head: usize,
}

impl InputJson {
    fn new(request: &RequestSummary) -> Result<InputJson, EvalError> {
        let mut buf = Vec::with_capacity(1024);
        buf.extend_from_slice(format!("{{\"abi\":{ABI_VERSION},\"request\":").as_bytes());
        serde_json::to_writer(&mut buf, request).map_err(|e| EvalError::Abi(e.to_string()))?;
        let head = buf.len();
        Ok(InputJson { buf, head })
    }

    /// The whole input for a policy with `settings` (`None`: it holds its own), at `now_unix_ms`,
    /// after the policies that decided `earlier`.
    fn with(&mut self, settings: Option<&RawValue>, now_unix_ms: u64, earlier: &Earlier) -> &[u8] {
        use std::io::Write;
        self.buf.truncate(self.head);
        if let Some(s) = settings {
            self.buf.extend_from_slice(b",\"settings\":");
            self.buf.extend_from_slice(s.get().as_bytes());
        }
        if !earlier.is_empty() {
            self.buf.extend_from_slice(b",\"earlier\":");
            // An `Earlier` always serialises.
            let _ = serde_json::to_writer(&mut self.buf, earlier);
        }
        // Writing to a Vec cannot fail.
        let _ = write!(self.buf, ",\"now_unix_ms\":{now_unix_ms}}}");
        &self.buf
    }
}

/// One version of the whole chain. Requests hold it for as long as they run, so a reload never
/// changes the policies of a request already in progress.
pub struct Chain {
    policies: Vec<Arc<Loaded>>,
    generation: u64,
    /// Set once an evaluation of this version took longer than [`INLINE_LIMIT`] or failed by fuel or
    /// deadline: from then on it runs on the blocking pool (see [`Chain::runs_inline`]).
    offloaded: AtomicBool,
}

/// Most CPU time one evaluation of a whole chain may take and the chain still run inline on an async
/// worker. The example policies take 10-50 us (a debug build several times that), the default
/// deadline is 20 ms.
pub const INLINE_LIMIT: Duration = Duration::from_millis(3);

/// The live policy chain: cheap to clone, shared by every connection.
#[derive(Clone)]
pub struct PolicySet {
    inner: Arc<Inner>,
}

struct Inner {
    cache_dir: Option<PathBuf>,
    /// Buckets and windows outlive every chain version: a reload keeps each tenant's budget.
    shared: Arc<SharedState>,
    /// Created with the first policy; every version of every policy shares it.
    engine: Mutex<Option<PolicyEngine>>,
    /// Compiled modules by the SHA-256 of their bytes (one engine, so the hash is the whole key):
    /// a reload recompiles only what changed.
    modules: Mutex<HashMap<[u8; 32], Compiled>>,
    current: RwLock<Arc<Chain>>,
    /// One reload at a time.
    reloading: Mutex<()>,
    /// Evaluations (and `on_complete` calls) running at once, at most [`MAX_RUNNING`]: a flood of
    /// runaway evaluations cannot exhaust the instance pool or the blocking threads; further requests
    /// wait their turn rather than fail. Below that, the OS shares the cores, and deadlines count
    /// only the time each evaluation ran.
    running: Arc<tokio::sync::Semaphore>,
    /// `on_complete` runs fired and not finished (see [`PolicySet::completions_done`]).
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

/// What a reload did.
#[derive(Debug)]
pub enum Reload {
    /// Every module, settings and option is as it was: nothing swapped.
    Unchanged,
    /// A new chain serves from now on.
    Swapped {
        generation: u64,
        changed: Vec<String>,
        removed: Vec<String>,
    },
    /// Something in the new chain is broken; the old chain keeps serving.
    Rejected(Vec<PolicyLoadError>),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PolicySet {
    /// Loads the chain. Slow (compiles modules): call it at start-up, never per request.
    /// `cache_dir` keeps compiled modules on disk across restarts.
    pub fn load(
        specs: &[PolicySpec],
        cache_dir: Option<PathBuf>,
    ) -> Result<PolicySet, PolicyLoadError> {
        let set = PolicySet {
            inner: Arc::new(Inner {
                cache_dir,
                shared: Arc::new(SharedState::default()),
                engine: Mutex::new(None),
                modules: Mutex::new(HashMap::new()),
                current: RwLock::new(Arc::new(Chain::new(Vec::new(), 0))),
                reloading: Mutex::new(()),
                running: Arc::new(tokio::sync::Semaphore::new(MAX_RUNNING)),
                pending: Arc::default(),
            }),
        };
        match set.build(specs) {
            Ok(built) => {
                set.swap(built.policies);
                Ok(set)
            }
            Err(mut errors) => Err(errors.swap_remove(0)),
        }
    }

    /// The chain serving now. Hold it for the whole request.
    pub fn current(&self) -> Arc<Chain> {
        self.inner
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    /// A turn to run policy code; hold it for the whole call.
    pub async fn turn(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.inner
            .running
            .clone()
            .acquire_owned()
            .await
            .expect("the policy semaphore is never closed")
    }

    /// Counts one `on_complete` run until the guard drops.
    pub fn completion_started(&self) -> PendingCompletion {
        use std::sync::atomic::Ordering;
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        PendingCompletion(self.inner.pending.clone())
    }

    /// Waits, for at most `timeout`, until every `on_complete` fired so far has run: at shutdown,
    /// so that the last settlements are in the state written on the way out. Returns how many
    /// were still running.
    pub async fn completions_done(&self, timeout: std::time::Duration) -> usize {
        use std::sync::atomic::Ordering;
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let left = self.inner.pending.load(Ordering::SeqCst);
            if left == 0 || tokio::time::Instant::now() >= until {
                return left;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Evaluates the current chain (see [`Chain::evaluate`]).
    pub fn evaluate(&self, request: &RequestSummary) -> ChainOutcome {
        self.current().evaluate(request)
    }

    /// Rebuilds the chain from `specs` (re-reading every module and settings file), off the request
    /// path: slow and blocking. Unchanged policies are kept as they are (with their compiled module);
    /// changed or new ones are compiled, validated and canaried. Only if every policy is ready does the
    /// new chain replace the old one, in one atomic swap. Counted in `slotgate_policy_reloads_total`.
    pub fn reload(&self, specs: &[PolicySpec]) -> Reload {
        let _one = lock(&self.inner.reloading);
        let old = self.current();
        let outcome = match self.build(specs) {
            Err(errors) => {
                for e in &errors {
                    metrics::counter!(m::POLICY_RELOADS_TOTAL, "policy" => e.name.clone(), "result" => "error")
                        .increment(1);
                }
                Reload::Rejected(errors)
            }
            Ok(built) => {
                let names: Vec<&str> = built.policies.iter().map(|p| p.name.as_str()).collect();
                let removed: Vec<String> = old
                    .policies
                    .iter()
                    .filter(|p| !names.contains(&p.name.as_str()))
                    .map(|p| p.name.clone())
                    .collect();
                let same_order = old.policies.len() == built.policies.len()
                    && old
                        .policies
                        .iter()
                        .zip(&built.policies)
                        .all(|(a, b)| Arc::ptr_eq(a, b));
                if same_order {
                    Reload::Unchanged
                } else {
                    for name in &built.changed {
                        metrics::counter!(m::POLICY_RELOADS_TOTAL, "policy" => name.clone(), "result" => "ok")
                            .increment(1);
                    }
                    let generation = self.swap(built.policies);
                    Reload::Swapped {
                        generation,
                        changed: built.changed,
                        removed,
                    }
                }
            }
        };
        self.prune_modules();
        outcome
    }

    fn swap(&self, policies: Vec<Arc<Loaded>>) -> u64 {
        let mut current = self
            .inner
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let generation = current.generation + 1;
        *current = Arc::new(Chain::new(policies, generation));
        generation
    }

    /// Builds every policy of `specs`, reusing the current version of those that did not change.
    fn build(&self, specs: &[PolicySpec]) -> Result<Built, Vec<PolicyLoadError>> {
        let old = self.current();
        let mut built = Built {
            policies: Vec::new(),
            changed: Vec::new(),
        };
        let mut errors = Vec::new();
        let mut keys: HashMap<String, String> = HashMap::new();
        for spec in specs {
            let name = spec.display_name();
            let built_one =
                self.build_one(spec, &name, &old)
                    .and_then(|(loaded, fresh)| {
                        match keys.insert(loaded.state_key.clone(), name.clone()) {
                            Some(other) => Err(LoadError::SharedState {
                                key: loaded.state_key.clone(),
                                other,
                            }),
                            None => Ok((loaded, fresh)),
                        }
                    });
            match built_one {
                Ok((loaded, fresh)) => {
                    if fresh {
                        built.changed.push(name);
                    }
                    built.policies.push(loaded);
                }
                Err(error) => errors.push(PolicyLoadError {
                    name,
                    path: spec.path.display().to_string(),
                    error,
                }),
            }
        }
        if errors.is_empty() {
            Ok(built)
        } else {
            Err(errors)
        }
    }

    /// The policy for `spec`: the one serving now if nothing about it changed (`false`), else a
    /// freshly compiled, validated and canaried one (`true`).
    fn build_one(
        &self,
        spec: &PolicySpec,
        name: &str,
        old: &Chain,
    ) -> Result<(Arc<Loaded>, bool), LoadError> {
        let bytes = std::fs::read(&spec.path).map_err(LoadError::Read)?;
        let sha256: [u8; 32] = Sha256::digest(&bytes).into();
        let state_key = spec
            .name
            .clone()
            .or_else(|| super::abi::declared_name(&bytes))
            .unwrap_or_else(|| name.to_owned());
        let settings = settings_of(spec)?;
        if let Some(same) = old.policies.iter().find(|p| {
            p.name == name && p.spec == *spec && p.sha256 == sha256 && p.settings == settings
        }) {
            return Ok((same.clone(), false));
        }
        let engine = self.engine()?;
        let limits = spec_limits(spec);
        let compiled = self.module(&engine, sha256, &bytes, limits)?;
        // Settings check and one canary evaluation, off the request path: a module that cannot answer
        // a plain request never serves. Both run against scratch state, so the canary charges no
        // tenant's real bucket.
        let scratch = Arc::new(SharedState::default());
        let lenient = PolicyLimits {
            deadline: limits.deadline.max(LOAD_DEADLINE),
            ..limits
        };
        let probe = Guest::link(&engine, scratch.clone(), name, &compiled, lenient)?;
        let verdict = probe.validate_settings(&settings)?;
        // A policy that keeps its parsed settings serves from a snapshot taken after it parsed
        // them; one that cannot be snapshotted still serves, parsing them on every call.
        let snapshot = if verdict.keeps_settings {
            match self.snapshot(&engine, name, &bytes, &settings, lenient) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(policy = name, error = %e, "cannot pre-initialise the policy: it parses its settings on every call");
                    None
                }
            }
        } else {
            None
        };
        let (compiled, module_keys, settings_json) = match snapshot {
            Some(([instrumented, snapshot], module)) => (
                Compiled::Core(module),
                vec![sha256, instrumented, snapshot],
                None,
            ),
            None => {
                let json = serde_json::value::to_raw_value(&settings)
                    .map_err(|e| LoadError::Settings(e.to_string()))?;
                (compiled, vec![sha256], Some(json))
            }
        };
        let probe = Guest::link(&engine, scratch, name, &compiled, lenient)?;
        let canary_settings = match settings_json {
            Some(_) => settings.clone(),
            None => Value::Null,
        };
        probe.evaluate(&canary_input(&canary_settings))?;
        let policy = Guest::link(&engine, self.inner.shared.clone(), name, &compiled, limits)?
            .keyed(&state_key, &verdict)
            .isolated(spec.isolation.map(|i| match i {
                PolicyIsolation::Call => Isolation::Call,
                PolicyIsolation::Caller => Isolation::Caller,
            }))?;
        Ok((
            Arc::new(Loaded {
                name: name.to_owned(),
                state_key,
                spec: spec.clone(),
                sha256,
                policy,
                settings,
                mode: match spec.mode {
                    PolicyMode::Enforce => Mode::Enforce,
                    PolicyMode::Monitor => Mode::Monitor,
                },
                on_error: match spec.on_error {
                    PolicyOnError::Deny => OnError::Deny,
                    PolicyOnError::Allow => OnError::Allow,
                },
                needs_prompt_tokens: verdict.needs_prompt_tokens,
                settings_json,
                module_keys,
                metrics: PolicyMetrics::register(name),
            }),
            true,
        ))
    }

    fn engine(&self) -> Result<PolicyEngine, LoadError> {
        let mut engine = lock(&self.inner.engine);
        if let Some(e) = engine.as_ref() {
            return Ok(e.clone());
        }
        let e =
            PolicyEngine::with_disk_cache(EngineLimits::default(), self.inner.cache_dir.as_deref())
                .map_err(|e| LoadError::Compile(format!("starting wasmtime: {e:#}")))?;
        *engine = Some(e.clone());
        Ok(e)
    }

    /// The compiled module for these bytes: from the cache, or compiled now (outside the lock).
    fn module(
        &self,
        engine: &PolicyEngine,
        sha256: [u8; 32],
        bytes: &[u8],
        limits: PolicyLimits,
    ) -> Result<Compiled, LoadError> {
        if let Some(m) = lock(&self.inner.modules).get(&sha256) {
            tracing::debug!(sha256 = %hex(&sha256), "policy module from the memory cache");
            return Ok(m.clone());
        }
        let hits = engine.disk_cache_stats().map_or(0, |(h, _)| h);
        let started = std::time::Instant::now();
        let module = Compiled::new(engine, bytes, limits)?;
        let from_disk = engine.disk_cache_stats().is_some_and(|(h, _)| h > hits);
        tracing::info!(
            sha256 = %hex(&sha256),
            source = if from_disk { "disk-cache" } else { "compiled" },
            ms = started.elapsed().as_millis() as u64,
            "policy module ready"
        );
        lock(&self.inner.modules).insert(sha256, module.clone());
        Ok(module)
    }

    /// The pre-initialised module of the module `sha256` (`bytes`) with `settings`, and the keys in
    /// the module cache of the instrumented module and of the snapshot. Both compiles go through
    /// the caches: a change of settings compiles only the new snapshot.
    fn snapshot(
        &self,
        engine: &PolicyEngine,
        name: &str,
        bytes: &[u8],
        settings: &Value,
        limits: PolicyLimits,
    ) -> Result<([[u8; 32]; 2], wasmtime::Module), LoadError> {
        let started = std::time::Instant::now();
        let wasm = wat::parse_bytes(bytes).map_err(|e| LoadError::Compile(format!("{e}")))?;
        let (cx, instrumented) = snapshot::instrument(&wasm)?;
        let instrumented_key: [u8; 32] = Sha256::digest(&instrumented).into();
        let core = |c: Compiled| match c {
            Compiled::Core(m) => Ok(m),
            Compiled::Component(_) => Err(LoadError::Compile("not a core module".into())),
        };
        let instrumented = core(self.module(engine, instrumented_key, &instrumented, limits)?)?;
        let wasm = snapshot::take(engine, name, &cx, &instrumented, settings, limits)?;
        let key: [u8; 32] = Sha256::digest(&wasm).into();
        let module = core(self.module(engine, key, &wasm, limits)?)?;
        tracing::info!(
            policy = name,
            ms = started.elapsed().as_millis() as u64,
            snapshot_bytes = wasm.len(),
            "policy pre-initialised with its settings"
        );
        Ok(([instrumented_key, key], module))
    }

    /// Keeps only the compiled modules the serving chain uses.
    fn prune_modules(&self) {
        let chain = self.current();
        lock(&self.inner.modules)
            .retain(|k, _| chain.policies.iter().any(|p| p.module_keys.contains(k)));
    }

    /// The state every serving policy shares (buckets, windows).
    pub fn shared(&self) -> &Arc<SharedState> {
        &self.inner.shared
    }

    /// The compile caches, for `/status`: modules held in memory, and the disk cache's directory,
    /// hits and misses.
    pub fn cache_status(&self) -> serde_json::Value {
        let disk = lock(&self.inner.engine)
            .as_ref()
            .and_then(|e| e.disk_cache_stats());
        serde_json::json!({
            "memory_modules": lock(&self.inner.modules).len(),
            "disk": self.inner.cache_dir.as_ref().map(|dir| serde_json::json!({
                "dir": dir.display().to_string(),
                "hits": disk.map_or(0, |d| d.0),
                "misses": disk.map_or(0, |d| d.1),
            })),
        })
    }
}

struct Built {
    policies: Vec<Arc<Loaded>>,
    changed: Vec<String>,
}

impl Chain {
    fn new(policies: Vec<Arc<Loaded>>, generation: u64) -> Chain {
        Chain {
            policies,
            generation,
            offloaded: AtomicBool::new(false),
        }
    }

    /// Whether evaluations of this version run on the async worker that serves the request (on a
    /// fiber that yields at every epoch tick, see [`Chain::evaluate_each_async`]), saving the
    /// hand-off to the blocking pool (~30-50 us). True until one evaluation used more than
    /// [`INLINE_LIMIT`] of CPU or ran out of fuel or time: such a chain (a slow or runaway policy)
    /// is evaluated on the blocking pool from then on. A new version (a reload) starts inline again.
    pub fn runs_inline(&self) -> bool {
        !self.offloaded.load(Ordering::Relaxed)
    }

    /// Moves this version to the blocking pool for good, saying why once.
    fn offload(&self, why: &str) {
        if !self.offloaded.swap(true, Ordering::Relaxed) {
            tracing::info!(
                generation = self.generation,
                reason = why,
                "policy chain now evaluated on the blocking pool"
            );
        }
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// Counts versions: 1 after start-up, +1 on every swap.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn policies(&self) -> impl Iterator<Item = &Loaded> {
        self.policies.iter().map(|p| &**p)
    }

    /// Whether a policy of this chain decides on the exact prompt count: then every request is
    /// counted before the chain runs, not only those that wait for a slot.
    pub fn needs_prompt_tokens(&self) -> bool {
        self.policies.iter().any(|p| p.needs_prompt_tokens)
    }

    /// Evaluates every policy on `request` and folds the decisions. Synchronous and CPU-bound
    /// (bounded by each policy's fuel and deadline): run it off the async workers, or use
    /// [`Chain::evaluate_each_async`].
    pub fn evaluate(&self, request: &RequestSummary) -> ChainOutcome {
        self.evaluate_each(request).0
    }

    /// [`Chain::evaluate`], and also each policy's own decision (`None` where it failed), in chain
    /// order, for [`Chain::complete`].
    pub fn evaluate_each(&self, request: &RequestSummary) -> (ChainOutcome, Vec<Option<Decision>>) {
        self.evaluate_each_at(request, unix_ms())
    }

    /// [`Chain::evaluate_each`] with `now_unix_ms` given: the time the request's `on_complete`
    /// will say it was evaluated at (`evaluated_unix_ms`).
    pub fn evaluate_each_at(
        &self,
        request: &RequestSummary,
        now_unix_ms: u64,
    ) -> (ChainOutcome, Vec<Option<Decision>>) {
        let mut run = Run::new(self, request, now_unix_ms);
        for p in &self.policies {
            let result = match &p.policy {
                Guest::Core(core) => run.json(p).and_then(|input| core.evaluate_json(input)),
                Guest::Component(c) => c.evaluate(p.settings_text(), run.wit()),
            };
            run.record(p, result);
        }
        run.finish()
    }

    /// [`Chain::evaluate_each`] on an async worker: each evaluation yields to the worker's other
    /// tasks at every epoch tick, so not even a runaway policy holds up another connection for more
    /// than a tick (see `Runs` in module.rs). What it costs is only the evaluations themselves: no
    /// hand-off to another thread.
    pub async fn evaluate_each_async(
        &self,
        request: &RequestSummary,
    ) -> (ChainOutcome, Vec<Option<Decision>>) {
        self.evaluate_each_async_at(request, unix_ms()).await
    }

    /// [`Chain::evaluate_each_async`] with `now_unix_ms` given (see [`Chain::evaluate_each_at`]).
    pub async fn evaluate_each_async_at(
        &self,
        request: &RequestSummary,
        now_unix_ms: u64,
    ) -> (ChainOutcome, Vec<Option<Decision>>) {
        let mut run = Run::new(self, request, now_unix_ms);
        for p in &self.policies {
            let result = match &p.policy {
                Guest::Core(core) => match run.json(p) {
                    Ok(input) => core.evaluate_json_async(input).await,
                    Err(e) => Err(e),
                },
                Guest::Component(c) => {
                    c.evaluate_async(p.settings_text(), run.wit(), Runs::Async)
                        .await
                }
            };
            run.record(p, result);
        }
        run.finish()
    }

    /// Runs the `on_complete` of every policy that allowed the request (`own`: each policy's decision,
    /// from [`Chain::evaluate_each`]) with the request's real outcome, so what it took from a budget
    /// can be settled, also when a later policy denied the request. `completion.decision` is the
    /// chain's; each policy gets its own as `decision`. Synchronous: run it off the async workers, or
    /// use [`Chain::complete_async`].
    pub fn complete(&self, completion: &Completion, own: &[Option<Decision>]) {
        let mut told = Told::new(completion);
        for (p, decision) in self.policies.iter().zip(own) {
            let Some(mine) = allowed(p, decision) else {
                continue;
            };
            let result = match &p.policy {
                Guest::Core(core) => core.on_complete(&told.json(p, mine)),
                Guest::Component(c) => c.on_complete(p.settings_text(), told.wit(mine)).map(Some),
            };
            report_completion(p, result);
        }
    }

    /// [`Chain::complete`] on an async worker, as [`Chain::evaluate_each_async`].
    pub async fn complete_async(&self, completion: &Completion, own: &[Option<Decision>]) {
        let mut told = Told::new(completion);
        for (p, decision) in self.policies.iter().zip(own) {
            let Some(mine) = allowed(p, decision) else {
                continue;
            };
            let result = match &p.policy {
                Guest::Core(core) => core.on_complete_async(&told.json(p, mine)).await,
                Guest::Component(c) => c
                    .on_complete_async(p.settings_text(), told.wit(mine), Runs::Async)
                    .await
                    .map(Some),
            };
            report_completion(p, result);
        }
    }

    /// Whether any policy that allowed the request (see [`Chain::complete`]) exports `on_complete`.
    pub fn wants_completion(&self, own: &[Option<Decision>]) -> bool {
        self.policies.iter().zip(own).any(|(p, d)| {
            p.policy.has_on_complete() && d.as_ref().is_some_and(|d| d.verdict == Verdict::Allow)
        })
    }
}

/// `p`'s own decision, if it allowed the request and wants to hear how it ended.
fn allowed<'d>(p: &Loaded, decision: &'d Option<Decision>) -> Option<&'d Decision> {
    let decision = decision.as_ref()?;
    (decision.verdict == Verdict::Allow && p.policy.has_on_complete()).then_some(decision)
}

/// How a request ended, as each policy of the chain is told it: the v2 record is made once for all
/// the chain's components (only its `decision` differs between them).
struct Told<'a> {
    completion: &'a Completion,
    wit: Option<t::Completion>,
}

impl<'a> Told<'a> {
    fn new(completion: &'a Completion) -> Told<'a> {
        Told {
            completion,
            wit: None,
        }
    }

    /// What the v1 module `p` gets: the completion with its own decision, and its settings
    /// unless it holds them.
    fn json(&self, p: &Loaded, mine: &Decision) -> Completion {
        let completion = self.completion;
        Completion {
            // A snapshotted policy holds its settings already.
            settings: match p.settings_json {
                Some(_) => p.settings.clone(),
                None => Value::Null,
            },
            decision: mine.clone(),
            chain_decision: completion.decision.clone(),
            ..completion.clone()
        }
    }

    /// What a component gets: the shared record with its own decision.
    fn wit(&mut self, mine: &Decision) -> &t::Completion {
        let completion = self.completion;
        match &mut self.wit {
            Some(wit) => wit.decision = component::allow_of(mine),
            None => self.wit = Some(component::completion_of(completion, mine)),
        }
        self.wit.as_ref().expect("made above")
    }
}

fn report_completion(p: &Loaded, result: Result<Option<Evaluation>, EvalError>) {
    if let Err(e) = result {
        metrics::counter!(m::POLICY_ERRORS_TOTAL, "policy" => p.name.clone(), "kind" => e.kind())
            .increment(1);
        tracing::warn!(policy = %p.name, kind = e.kind(), error = %e, "policy on_complete failed");
    }
}

/// One evaluation of a chain in progress: the input, each policy's step, and the CPU time counted.
struct Run<'a> {
    chain: &'a Chain,
    request: &'a RequestSummary,
    /// The request as JSON, for v1 modules; made on first use.
    input: Option<Result<InputJson, EvalError>>,
    /// The request as the v2 contract carries it, for components; made on first use.
    wit: Option<t::Evaluation>,
    /// What the enforced policies so far allowed with, for the next one.
    earlier: Earlier,
    now: u64,
    steps: Vec<Step<'a>>,
    own: Vec<Option<Decision>>,
    cpu: Duration,
}

impl<'a> Run<'a> {
    fn new(chain: &'a Chain, request: &'a RequestSummary, now: u64) -> Run<'a> {
        Run {
            chain,
            request,
            input: None,
            wit: None,
            earlier: Earlier::default(),
            now,
            steps: Vec::with_capacity(chain.policies.len()),
            own: Vec::with_capacity(chain.policies.len()),
            cpu: Duration::ZERO,
        }
    }

    /// The JSON input for the v1 module `p`: the request, its settings unless it holds them, and
    /// what earlier policies decided.
    fn json(&mut self, p: &Loaded) -> Result<&[u8], EvalError> {
        let request = self.request;
        match self.input.get_or_insert_with(|| InputJson::new(request)) {
            Ok(input) => Ok(input.with(p.settings_json.as_deref(), self.now, &self.earlier)),
            Err(e) => Err(e.clone()),
        }
    }

    /// The input of the component next in the chain.
    fn wit(&mut self) -> &t::Evaluation {
        let (request, now) = (self.request, self.now);
        let wit = self.wit.get_or_insert_with(|| t::Evaluation {
            request: component::request_of(request),
            earlier: component::earlier_of(&Earlier::default()),
            now_unix_ms: now,
        });
        wit.earlier = component::earlier_of(&self.earlier);
        wit
    }

    /// Counts `p`'s result in the metrics and keeps it for the fold.
    fn record(&mut self, p: &'a Loaded, result: Result<(Decision, Evaluation), EvalError>) {
        let pm = &p.metrics;
        match &result {
            Ok((decision, ev)) => {
                self.cpu += ev.cpu;
                pm.eval_seconds.record(ev.elapsed.as_secs_f64());
                pm.fuel.record(ev.fuel_used as f64);
                if decision.verdict == Verdict::Deny {
                    pm.deny.increment(1);
                } else {
                    pm.allow.increment(1);
                }
            }
            Err(e) => {
                if matches!(e, EvalError::Timeout | EvalError::Fuel) {
                    self.chain
                        .offload(&format!("policy `{}` failed: {e}", p.name));
                }
                metrics::counter!(m::POLICY_ERRORS_TOTAL, "policy" => p.name.clone(), "kind" => e.kind())
                    .increment(1);
                pm.error.increment(1);
                tracing::warn!(policy = %p.name, kind = e.kind(), error = %e, "policy evaluation failed");
            }
        }
        if p.mode == Mode::Monitor {
            if let Ok((d, _)) = &result {
                // Enough to find the request and see what would have happened to whom.
                let r = self.request;
                let id = r.headers.get("x-request-id").map_or("-", String::as_str);
                let tenant = d.tenant.clone().unwrap_or_else(|| r.tenant_key(None));
                let verdict = match d.verdict {
                    Verdict::Allow => "allow",
                    Verdict::Deny => "deny",
                };
                tracing::info!(policy = %p.name, request_id = %id, tenant = %tenant, verdict, status = d.status, reason = d.reason.as_deref(), said = d.message.as_deref(), cost = d.cost, priority = d.priority, "monitor-mode decision (not enforced)");
            }
        }
        let result = result.map(|(d, _)| d);
        if let (Mode::Enforce, Ok(d)) = (p.mode, &result) {
            if d.verdict == Verdict::Allow {
                self.earlier.add(d);
            }
        }
        self.own.push(result.as_ref().ok().cloned());
        self.steps.push(Step {
            policy: &p.name,
            mode: p.mode,
            on_error: p.on_error,
            result,
        });
    }

    /// The folded outcome and each policy's decision. A chain whose evaluations the deadline checks
    /// counted more than [`INLINE_LIMIT`] of CPU for moves to the blocking pool: CPU time decides,
    /// not wall-clock, so a busy machine that preempts a fast evaluation does not make it slow; and
    /// the clock is only read in those checks, from the first epoch tick of a call on, so a fast
    /// evaluation never pays for it.
    fn finish(self) -> (ChainOutcome, Vec<Option<Decision>>) {
        if self.cpu > INLINE_LIMIT {
            self.chain.offload(&format!(
                "an evaluation took {:?} of CPU, over {INLINE_LIMIT:?}",
                self.cpu
            ));
        }
        (chain::fold(self.steps), self.own)
    }
}

/// A `[[policy]]` entry's limits, defaults filled in.
pub fn spec_limits(spec: &PolicySpec) -> PolicyLimits {
    let d = PolicyLimits::default();
    PolicyLimits {
        fuel: spec.fuel.unwrap_or(d.fuel),
        deadline: spec.deadline.map_or(d.deadline, |x| x.0),
        memory_bytes: spec.memory.map_or(d.memory_bytes, |x| x.0),
        ..d
    }
}

/// The request every new policy version must answer before it may serve.
pub fn canary_input(settings: &Value) -> EvaluateInput {
    EvaluateInput {
        abi: ABI_VERSION,
        request: RequestSummary {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            prompt_chars: 16,
            prompt_tokens_estimate: 4,
            caller: Some("anonymous".into()),
            ..RequestSummary::default()
        },
        settings: settings.clone(),
        now_unix_ms: unix_ms(),
        earlier: Default::default(),
    }
}

/// Lower-case hex of a digest, for logs and `/status`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn settings_of(spec: &PolicySpec) -> Result<Value, LoadError> {
    if let Some(inline) = &spec.settings {
        return serde_json::to_value(inline).map_err(|e| LoadError::Settings(e.to_string()));
    }
    read_settings(spec.settings_file.as_deref()).map_err(|e| LoadError::Settings(format!("{e:#}")))
}

/// Settings from a JSON or TOML file; `null` when none.
pub fn read_settings(path: Option<&Path>) -> anyhow::Result<Value> {
    let Some(path) = path else {
        return Ok(Value::Null);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "toml") {
        let t: toml::Value =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        return Ok(serde_json::to_value(t)?);
    }
    serde_json::from_str(&text).with_context(|| format!("parsing {} as JSON", path.display()))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}

/// One `on_complete` run in progress (see [`PolicySet::completion_started`]).
pub struct PendingCompletion(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for PendingCompletion {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn policy_code_takes_turns() {
        let set = PolicySet::load(&[], None).unwrap();
        let turns: Vec<_> = take_turns(&set, MAX_RUNNING).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), set.turn())
                .await
                .is_err(),
            "a turn beyond {MAX_RUNNING} must wait"
        );
        drop(turns);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), set.turn())
                .await
                .is_ok(),
            "a finished turn lets the next one run"
        );
    }

    async fn take_turns(set: &PolicySet, n: usize) -> Vec<tokio::sync::OwnedSemaphorePermit> {
        let mut turns = Vec::new();
        for _ in 0..n {
            turns.push(set.turn().await);
        }
        turns
    }

    /// A policy that keeps the settings' text it was validated with and answers it as its tenant,
    /// with how many evaluations its instance has seen as the priority; it denies any input that
    /// carries settings. `keeps`: whether its `validate_settings` says it keeps them.
    fn keeping_policy(keeps: bool) -> String {
        let answer = if keeps {
            r#"{"valid":true,"keeps_settings":true}"#
        } else {
            r#"{"valid":true}"#
        };
        r#"(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 100) "{\"tenant\":")
  (data (i32.const 120) ",\"priority\":")
  (data (i32.const 140) "ANSWER")
  (data (i32.const 200) "\"settings\"")
  (data (i32.const 220) "{\"verdict\":\"deny\",\"status\":403,\"message\":\"settings in input\"}")
  (func (export "slotgate_abi_version") (result i32) (i32.const 1))
  (func (export "slotgate_alloc") (param $len i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $len)))
    (local.get $p))
  (func $pack (param $p i32) (param $l i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32)) (i64.extend_i32_u (local.get $l))))
  ;; Keeps the settings' JSON text at 512 (its length at 508).
  (func (export "slotgate_validate_settings") (param $p i32) (param $l i32) (result i64)
    (i32.store (i32.const 508) (local.get $l))
    (memory.copy (i32.const 512) (local.get $p) (local.get $l))
    (call $pack (i32.const 140) (i32.const ANSWER_LEN)))
  ;; Whether the input holds the text "settings" (quoted).
  (func $has_settings (param $p i32) (param $l i32) (result i32)
    (local $i i32) (local $j i32)
    (block $none
      (loop $outer
        (br_if $none (i32.gt_s (i32.add (local.get $i) (i32.const 10)) (local.get $l)))
        (local.set $j (i32.const 0))
        (block $miss
          (loop $inner
            (br_if $miss (i32.ne
              (i32.load8_u (i32.add (i32.add (local.get $p) (local.get $i)) (local.get $j)))
              (i32.load8_u (i32.add (i32.const 200) (local.get $j)))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br_if $inner (i32.lt_u (local.get $j) (i32.const 10))))
          (return (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $outer)))
    (i32.const 0))
  ;; {"tenant":<kept settings>,"priority":<evaluations this instance has seen>}
  (func (export "slotgate_evaluate") (param $p i32) (param $l i32) (result i64)
    (local $o i32) (local $k i32)
    (if (call $has_settings (local.get $p) (local.get $l))
      (then (return (call $pack (i32.const 220) (i32.const 61)))))
    (i32.store (i32.const 500) (i32.add (i32.load (i32.const 500)) (i32.const 1)))
    (local.set $k (i32.load (i32.const 508)))
    (memory.copy (i32.const 2048) (i32.const 100) (i32.const 10))
    (memory.copy (i32.const 2058) (i32.const 512) (local.get $k))
    (local.set $o (i32.add (i32.const 2058) (local.get $k)))
    (memory.copy (local.get $o) (i32.const 120) (i32.const 12))
    (i32.store8 (i32.add (local.get $o) (i32.const 12)) (i32.add (i32.const 48) (i32.load (i32.const 500))))
    (i32.store8 (i32.add (local.get $o) (i32.const 13)) (i32.const 125))
    (call $pack (i32.const 2048) (i32.sub (i32.add (local.get $o) (i32.const 14)) (i32.const 2048)))))"#
            .replace("ANSWER_LEN", &answer.len().to_string())
            .replace("ANSWER", &answer.replace('"', "\\\""))
    }

    fn load_inline(wat: &str, settings: &str, tag: &str) -> PolicySet {
        let dir = std::env::temp_dir().join(format!("slotgate-keep-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keep.wat");
        std::fs::write(&path, wat).unwrap();
        let settings_path = dir.join("settings.json");
        std::fs::write(&settings_path, settings).unwrap();
        let set = PolicySet::load(&[PolicySpec::from_path(path, Some(settings_path))], None)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let _ = std::fs::remove_dir_all(&dir);
        set
    }

    #[test]
    fn a_policy_that_keeps_its_settings_serves_from_a_snapshot_and_still_fresh_instances() {
        let set = load_inline(&keeping_policy(true), r#""gold""#, "keeps");
        let chain = set.current();
        assert!(chain.policies().all(Loaded::preinitialised));
        let request = canary_input(&Value::Null).request;
        for _ in 0..3 {
            let (outcome, own) = chain.evaluate_each(&request);
            let d = own[0].clone().expect("a decision");
            // The settings it kept in `validate_settings`, and no settings in its input (it would
            // deny): every instance starts from the snapshot.
            assert_eq!(d.verdict, Verdict::Allow, "{d:?}");
            assert_eq!(d.tenant.as_deref(), Some("gold"), "{outcome:?}");
            // Each evaluation in a fresh instance: nothing counted by the one before survives.
            assert_eq!(d.priority, Some(1));
        }
    }

    #[test]
    fn a_policy_that_does_not_keep_its_settings_gets_them_in_every_input() {
        let set = load_inline(&keeping_policy(false), r#""gold""#, "plain");
        let chain = set.current();
        assert!(!chain.policies().any(Loaded::preinitialised));
        let (_, own) = chain.evaluate_each(&canary_input(&Value::Null).request);
        let d = own[0].clone().expect("a decision");
        assert_eq!(d.verdict, Verdict::Deny, "settings in its input: {d:?}");
        assert_eq!(d.message.as_deref(), Some("settings in input"));
    }
}
