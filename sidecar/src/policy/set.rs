//! The loaded policy chain: every module compiled, its settings validated and one canary evaluation
//! run before it may serve; then one call evaluates the whole chain for a request.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use slotgate_sdk::{Completion, EvaluateInput, RequestSummary, Verdict, ABI_VERSION};

use super::chain::{self, ChainOutcome, Mode, OnError, Step};
use super::engine::{EngineLimits, PolicyEngine};
use super::module::{LoadError, Policy, PolicyLimits};
use super::state::SharedState;
use crate::config::{PolicyMode, PolicyOnError, PolicySpec};
use crate::metrics as m;

/// Fuel consumed, in buckets from a trivial policy to the default budget.
pub const FUEL_BUCKETS: &[f64] = &[1e2, 1e3, 1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7, 1e8];

#[derive(Debug, thiserror::Error)]
#[error("policy `{name}` ({path}): {source}")]
pub struct PolicyLoadError {
    pub name: String,
    pub path: String,
    #[source]
    pub source: LoadError,
}

pub struct Loaded {
    pub name: String,
    pub policy: Policy,
    pub settings: Value,
    pub mode: Mode,
    pub on_error: OnError,
}

#[derive(Clone)]
pub struct PolicySet {
    chain: Arc<Vec<Loaded>>,
}

impl PolicySet {
    /// Loads the chain. Slow (compiles modules): call it at start-up or on a reload, never per request.
    pub fn load(specs: &[PolicySpec]) -> Result<PolicySet, PolicyLoadError> {
        if specs.is_empty() {
            return Ok(PolicySet {
                chain: Arc::new(Vec::new()),
            });
        }
        let engine = PolicyEngine::new(EngineLimits::default()).map_err(|e| PolicyLoadError {
            name: "-".into(),
            path: "-".into(),
            source: LoadError::Compile(format!("starting wasmtime: {e:#}")),
        })?;
        let shared = Arc::new(SharedState::default());
        let mut chain = Vec::new();
        for spec in specs {
            let name = spec.display_name();
            let fail = |source| PolicyLoadError {
                name: name.clone(),
                path: spec.path.display().to_string(),
                source,
            };
            chain.push(load_one(&engine, &shared, spec, &name).map_err(fail)?);
        }
        Ok(PolicySet {
            chain: Arc::new(chain),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.chain.is_empty()
    }

    /// Evaluates every policy on `request` and folds the decisions. Synchronous and CPU-bound
    /// (bounded by each policy's fuel and deadline): run it off the async workers.
    pub fn evaluate(&self, request: &RequestSummary) -> ChainOutcome {
        let now = unix_ms();
        let steps: Vec<Step<'_>> = self
            .chain
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
                Step { policy: &p.name, mode: p.mode, on_error: p.on_error, result: result.map(|(d, _)| d) }
            })
            .collect();
        chain::fold(steps)
    }
}

impl PolicySet {
    /// Runs every exported `on_complete` with the request's real outcome, so budgets can be settled.
    /// Synchronous: run it off the async workers.
    pub fn complete(&self, completion: &Completion) {
        for p in self.chain.iter().filter(|p| p.policy.has_on_complete()) {
            let mine = Completion {
                settings: p.settings.clone(),
                ..completion.clone()
            };
            if let Err(e) = p.policy.on_complete(&mine) {
                metrics::counter!(m::POLICY_ERRORS_TOTAL, "policy" => p.name.clone(), "kind" => e.kind()).increment(1);
                tracing::warn!(policy = %p.name, kind = e.kind(), error = %e, "policy on_complete failed");
            }
        }
    }

    pub fn wants_completions(&self) -> bool {
        self.chain.iter().any(|p| p.policy.has_on_complete())
    }
}

fn load_one(
    engine: &PolicyEngine,
    shared: &Arc<SharedState>,
    spec: &PolicySpec,
    name: &str,
) -> Result<Loaded, LoadError> {
    let bytes = std::fs::read(&spec.path)
        .map_err(|e| LoadError::Compile(format!("reading the module: {e}")))?;
    let d = PolicyLimits::default();
    let limits = PolicyLimits {
        fuel: spec.fuel.unwrap_or(d.fuel),
        deadline: spec.deadline.map_or(d.deadline, |x| x.0),
        memory_bytes: spec.memory.map_or(d.memory_bytes, |x| x.0),
        ..d
    };
    let policy = Policy::load(engine, shared.clone(), name, &bytes, limits)?;
    let settings = settings_of(spec)?;
    policy.validate_settings(&settings)?;
    // One canary evaluation off the request path: a module that cannot answer a plain request
    // never serves.
    let canary = EvaluateInput {
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
    };
    policy.evaluate(&canary)?;
    Ok(Loaded {
        name: name.to_owned(),
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
    })
}

fn settings_of(spec: &PolicySpec) -> Result<Value, LoadError> {
    if let Some(inline) = &spec.settings {
        return serde_json::to_value(inline).map_err(|e| LoadError::Settings(e.to_string()));
    }
    crate::policy_cli::read_settings(spec.settings_file.as_deref())
        .map_err(|e| LoadError::Settings(format!("{e:#}")))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}
