//! The policy chain and its lifecycle. Every module is compiled, its settings validated and one canary
//! evaluation run before it may serve. A request evaluates one [`Chain`] snapshot from start to end;
//! a reload builds a whole new chain off the request path and swaps it in atomically, or, if any
//! policy in it is broken, keeps serving the old one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use slotgate_sdk::RequestSummary;

use super::chain::{Chain, Loaded};
use super::compiled::Compiled;
use super::engine::{EngineLimits, PolicyEngine};
use super::error::LoadError;
use super::fold::ChainOutcome;
use crate::budgets::Budgets;
use crate::config::PolicySpec;
use crate::metrics as m;

mod build;

pub use build::{canary_input, hex, read_settings, spec_limits};

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

/// One `on_complete` run in progress (see [`PolicySet::completion_started`]).
pub struct PendingCompletion(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for PendingCompletion {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests;
