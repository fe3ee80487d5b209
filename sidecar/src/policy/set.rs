//! The policy chain and its lifecycle. Every module is compiled, its settings validated and one canary
//! evaluation run before it may serve. A request evaluates one [`Chain`] snapshot from start to end;
//! a reload builds a whole new chain off the request path and swaps it in atomically, or, if any
//! policy in it is broken, keeps serving the old one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value;
use sha2::{Digest, Sha256};
use slotgate_sdk::RequestSummary;

use super::chain::{Chain, Loaded, PolicyMetrics};
use super::compiled::{declared_name, Compiled, Linking};
use super::engine::{EngineLimits, PolicyEngine};
use super::error::LoadError;
use super::fold::{ChainOutcome, Mode, OnError};
use super::sandbox::{PolicyLimits, LOAD_DEADLINE};
use super::v2::Isolation;
use crate::budgets::Budgets;
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

/// The live policy chain: cheap to clone, shared by every connection.
#[derive(Clone)]
pub struct PolicySet {
    inner: Arc<Inner>,
}

struct Inner {
    cache_dir: Option<PathBuf>,
    /// Buckets and windows outlive every chain version: a reload keeps each tenant's budget.
    shared: Arc<Budgets>,
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
                shared: Arc::new(Budgets::default()),
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
        let generation = current.generation() + 1;
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
            .or_else(|| declared_name(&bytes))
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
        let scratch = Arc::new(Budgets::default());
        let lenient = PolicyLimits {
            deadline: limits.deadline.max(LOAD_DEADLINE),
            ..limits
        };
        let probe = compiled.link(&engine, scratch.clone(), name, lenient, Linking::default())?;
        let verdict = probe.validate_settings(&settings)?;
        // A policy that keeps its parsed settings serves from a snapshot taken after it parsed
        // them; one that cannot be snapshotted still serves, parsing them on every call.
        let snapshot = if verdict.keeps_settings {
            let compile = |key, bytes: &[u8]| self.module(&engine, key, bytes, limits);
            match Compiled::preinitialise(&engine, name, &bytes, &settings, lenient, compile) {
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
            Some(([instrumented, snapshot], module)) => {
                (module, vec![sha256, instrumented, snapshot], None)
            }
            None => {
                let json = serde_json::value::to_raw_value(&settings)
                    .map_err(|e| LoadError::Settings(e.to_string()))?;
                (compiled, vec![sha256], Some(json))
            }
        };
        let probe = compiled.link(&engine, scratch, name, lenient, Linking::default())?;
        let canary_settings = match settings_json {
            Some(_) => settings.clone(),
            None => Value::Null,
        };
        probe.evaluate_input(&canary_input(&canary_settings))?;
        let how = Linking {
            state_key: Some(&state_key),
            isolation: spec.isolation.map(|i| match i {
                PolicyIsolation::Call => Isolation::Call,
                PolicyIsolation::Caller => Isolation::Caller,
            }),
            verdict,
        };
        let policy = compiled.link(&engine, self.inner.shared.clone(), name, limits, how)?;
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

    /// Keeps only the compiled modules the serving chain uses.
    fn prune_modules(&self) {
        let chain = self.current();
        lock(&self.inner.modules)
            .retain(|k, _| chain.policies.iter().any(|p| p.module_keys.contains(k)));
    }

    /// The state every serving policy shares (buckets, windows).
    pub fn shared(&self) -> &Arc<Budgets> {
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
pub fn canary_input(settings: &Value) -> slotgate_sdk::EvaluateInput {
    slotgate_sdk::EvaluateInput {
        abi: slotgate_sdk::ABI_VERSION,
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
    use slotgate_sdk::Verdict;

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
