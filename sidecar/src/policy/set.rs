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

use serde_json::Value;
use sha2::{Digest, Sha256};
use slotgate_sdk::{Completion, Decision, EvaluateInput, RequestSummary, Verdict, ABI_VERSION};
use wasmtime::Module;

use super::chain::{self, ChainOutcome, Mode, OnError, Step};
use super::engine::{EngineLimits, PolicyEngine};
use super::module::{thread_cpu, EvalError, LoadError, Policy, PolicyLimits, LOAD_DEADLINE};
use super::state::SharedState;
use crate::config::{PolicyMode, PolicyOnError, PolicySpec};
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
    pub spec: PolicySpec,
    /// SHA-256 of the module file.
    pub sha256: [u8; 32],
    pub policy: Policy,
    pub settings: Value,
    pub mode: Mode,
    pub on_error: OnError,
    /// Its `validate_settings` asked for the exact prompt count before it decides.
    pub needs_prompt_tokens: bool,
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
    modules: Mutex<HashMap<[u8; 32], Module>>,
    current: RwLock<Arc<Chain>>,
    /// One reload at a time.
    reloading: Mutex<()>,
    /// Evaluations (and `on_complete` calls) running at once, at most [`MAX_RUNNING`]: a flood of
    /// runaway evaluations cannot exhaust the instance pool or the blocking threads; further requests
    /// wait their turn rather than fail. Below that, the OS shares the cores, and deadlines count
    /// only the time each evaluation ran.
    running: Arc<tokio::sync::Semaphore>,
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
        for spec in specs {
            let name = spec.display_name();
            match self.build_one(spec, &name, &old) {
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
        let bytes = std::fs::read(&spec.path)
            .map_err(|e| LoadError::Compile(format!("reading the module: {e}")))?;
        let sha256: [u8; 32] = Sha256::digest(&bytes).into();
        let settings = settings_of(spec)?;
        if let Some(same) = old.policies.iter().find(|p| {
            p.name == name && p.spec == *spec && p.sha256 == sha256 && p.settings == settings
        }) {
            return Ok((same.clone(), false));
        }
        let engine = self.engine()?;
        let limits = spec_limits(spec);
        let module = self.module(&engine, sha256, &bytes, limits)?;
        // Settings check and one canary evaluation, off the request path: a module that cannot answer
        // a plain request never serves. Both run against scratch state, so the canary charges no
        // tenant's real bucket.
        let scratch = Arc::new(SharedState::default());
        let lenient = PolicyLimits {
            deadline: limits.deadline.max(LOAD_DEADLINE),
            ..limits
        };
        let probe = Policy::link(&engine, scratch, name, &module, lenient)?;
        let needs_prompt_tokens = probe.validate_settings(&settings)?;
        probe.evaluate(&canary_input(&settings))?;
        let policy = Policy::link(&engine, self.inner.shared.clone(), name, &module, limits)?;
        Ok((
            Arc::new(Loaded {
                name: name.to_owned(),
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
                needs_prompt_tokens,
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
    ) -> Result<Module, LoadError> {
        if let Some(m) = lock(&self.inner.modules).get(&sha256) {
            tracing::debug!(sha256 = %hex(&sha256), "policy module from the memory cache");
            return Ok(m.clone());
        }
        let hits = engine.disk_cache_stats().map_or(0, |(h, _)| h);
        let started = std::time::Instant::now();
        let module = Policy::compile(engine, bytes, limits)?;
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

    /// Keeps only the compiled modules the serving chain uses.
    fn prune_modules(&self) {
        let chain = self.current();
        lock(&self.inner.modules).retain(|k, _| chain.policies.iter().any(|p| &p.sha256 == k));
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

    /// Whether evaluations of this version may run inline on the async worker that serves the
    /// request, saving the hand-off to the blocking pool (~40-50 us). True until one evaluation took
    /// longer than [`INLINE_LIMIT`] or ran out of fuel or time: such a chain (a slow or runaway
    /// policy) is evaluated on the blocking pool from then on, so it cannot hold up the connections
    /// of a worker again. A new version (a reload) starts inline again.
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
    /// (bounded by each policy's fuel and deadline): run it off the async workers.
    pub fn evaluate(&self, request: &RequestSummary) -> ChainOutcome {
        self.evaluate_each(request).0
    }

    /// [`Chain::evaluate`], and also each policy's own decision (`None` where it failed), in chain
    /// order, for [`Chain::complete`].
    pub fn evaluate_each(&self, request: &RequestSummary) -> (ChainOutcome, Vec<Option<Decision>>) {
        // CPU time, not wall-clock: a busy machine that preempts a fast evaluation does not make it slow.
        let cpu0 = thread_cpu();
        let evaluated = self.evaluate_steps(request);
        let took = thread_cpu().saturating_sub(cpu0);
        if took > INLINE_LIMIT {
            self.offload(&format!(
                "an evaluation took {took:?} of CPU, over {INLINE_LIMIT:?}"
            ));
        }
        evaluated
    }

    fn evaluate_steps(&self, request: &RequestSummary) -> (ChainOutcome, Vec<Option<Decision>>) {
        let now = unix_ms();
        let mut own = Vec::with_capacity(self.policies.len());
        let steps: Vec<Step<'_>> = self
            .policies
            .iter()
            .map(|p| {
                let input = EvaluateInput {
                    abi: ABI_VERSION,
                    request: request.clone(),
                    settings: p.settings.clone(),
                    now_unix_ms: now,
                };
                let result = p.policy.evaluate(&input);
                let label = p.name.clone();
                match &result {
                    Ok((decision, ev)) => {
                        metrics::histogram!(m::POLICY_EVAL_SECONDS, "policy" => label.clone())
                            .record(ev.elapsed.as_secs_f64());
                        metrics::histogram!(m::POLICY_FUEL_CONSUMED, "policy" => label.clone())
                            .record(ev.fuel_used as f64);
                        let verdict = if decision.verdict == Verdict::Deny { "deny" } else { "allow" };
                        metrics::counter!(m::POLICY_DECISIONS_TOTAL, "policy" => label, "decision" => verdict)
                            .increment(1);
                    }
                    Err(e) => {
                        if matches!(e, EvalError::Timeout | EvalError::Fuel) {
                            self.offload(&format!("policy `{}` failed: {e}", p.name));
                        }
                        metrics::counter!(m::POLICY_ERRORS_TOTAL, "policy" => label.clone(), "kind" => e.kind())
                            .increment(1);
                        metrics::counter!(m::POLICY_DECISIONS_TOTAL, "policy" => label, "decision" => "error")
                            .increment(1);
                        tracing::warn!(policy = %p.name, kind = e.kind(), error = %e, "policy evaluation failed");
                    }
                }
                if p.mode == Mode::Monitor {
                    if let Ok((d, _)) = &result {
                        tracing::info!(policy = %p.name, verdict = ?d.verdict, cost = ?d.cost, priority = ?d.priority, tenant = ?d.tenant, "monitor-mode decision (not enforced)");
                    }
                }
                let result = result.map(|(d, _)| d);
                own.push(result.as_ref().ok().cloned());
                Step { policy: &p.name, mode: p.mode, on_error: p.on_error, result }
            })
            .collect();
        (chain::fold(steps), own)
    }

    /// Runs the `on_complete` of every policy that allowed the request (`own`: each policy's decision,
    /// from [`Chain::evaluate_each`]) with the request's real outcome, so what it took from a budget
    /// can be settled, also when a later policy denied the request. `completion.decision` is the
    /// chain's; each policy gets its own as `decision`. Synchronous: run it off the async workers.
    pub fn complete(&self, completion: &Completion, own: &[Option<Decision>]) {
        for (p, decision) in self.policies.iter().zip(own) {
            let Some(decision) = decision else { continue };
            if decision.verdict != Verdict::Allow || !p.policy.has_on_complete() {
                continue;
            }
            let mine = Completion {
                settings: p.settings.clone(),
                decision: decision.clone(),
                chain_decision: completion.decision.clone(),
                ..completion.clone()
            };
            if let Err(e) = p.policy.on_complete(&mine) {
                metrics::counter!(m::POLICY_ERRORS_TOTAL, "policy" => p.name.clone(), "kind" => e.kind()).increment(1);
                tracing::warn!(policy = %p.name, kind = e.kind(), error = %e, "policy on_complete failed");
            }
        }
    }

    /// Whether any policy that allowed the request (see [`Chain::complete`]) exports `on_complete`.
    pub fn wants_completion(&self, own: &[Option<Decision>]) -> bool {
        self.policies.iter().zip(own).any(|(p, d)| {
            p.policy.has_on_complete() && d.as_ref().is_some_and(|d| d.verdict == Verdict::Allow)
        })
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
            ..RequestSummary::default()
        },
        settings: settings.clone(),
        now_unix_ms: unix_ms(),
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
}
