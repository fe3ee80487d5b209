//! Building one policy of the chain from its `[[policy]]` entry, off the request path: the module
//! compiled (or found in the caches), its settings checked, a snapshot taken where it keeps them,
//! and one canary evaluation, before it may serve.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde_json::Value;
use sha2::{Digest, Sha256};
use slotgate_sdk::RequestSummary;

use super::{lock, PolicySet};
use crate::budgets::Budgets;
use crate::config::{PolicyIsolation, PolicyMode, PolicyOnError, PolicySpec};
use crate::policy::chain::{Chain, Loaded, PolicyMetrics};
use crate::policy::compiled::{declared_name, Compiled, Linking};
use crate::policy::engine::{EngineLimits, PolicyEngine};
use crate::policy::error::LoadError;
use crate::policy::fold::{Mode, OnError};
use crate::policy::sandbox::{PolicyLimits, LOAD_DEADLINE};
use crate::policy::v2::Isolation;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

impl PolicySet {
    /// The policy for `spec`: the one serving now if nothing about it changed (`false`), else a
    /// freshly compiled, validated and canaried one (`true`).
    pub(super) fn build_one(
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
