//! ABI v1 (`docs/policy-abi.md`) as an adapter to the one contract the chain speaks: an ABI v1
//! core module behind [`Guest`]. This room owns everything v1: its JSON both ways (`json.rs`), the
//! byte plumbing into guest memory (`abi.rs`), the host functions a module imports (`host.rs`), the
//! module itself (`module.rs`) and its pre-initialisation with its settings (`snapshot.rs`). No
//! name of it is used outside this room but by `compiled.rs`, which tells the contract of a policy
//! file (`arrows` holds that).

pub mod abi;
mod host;
pub mod json;
mod module;
mod snapshot;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use serde_json::Value;
use slotgate_sdk::Decision;
use wasmtime::Module;

use super::engine::PolicyEngine;
use super::error::{EvalError, LoadError};
use super::guest::{Ask, Contract, Guest, Pending, Tell};
use super::sandbox::{Evaluation, PolicyLimits, Runs, SettingsVerdict};
use super::v2::Isolation;
use crate::budgets::Budgets;
use module::Policy;

pub use module::raw_v1_wat;

/// Compiles `bytes` (wasm or WAT) after the module-size cap. Slow: the result is worth caching.
pub fn compile(
    engine: &PolicyEngine,
    bytes: &[u8],
    limits: PolicyLimits,
) -> Result<Module, LoadError> {
    Policy::compile(engine, bytes, limits)
}

/// A v1 module serving through the contract the chain speaks.
pub struct Adapter(Policy);

impl Adapter {
    /// Checks a compiled module against ABI v1 and links the host's functions.
    pub fn link(
        engine: &PolicyEngine,
        shared: Arc<Budgets>,
        name: &str,
        module: &Module,
        limits: PolicyLimits,
    ) -> Result<Adapter, LoadError> {
        Policy::link(engine, shared, name, module, limits).map(Adapter)
    }

    /// The same policy keeping its budgets under `key` instead of its name.
    pub fn keyed(self, key: &str) -> Adapter {
        Adapter(self.0.keyed(key))
    }

    async fn call(&self, export: &str, input: &[u8], runs: Runs) -> Result<Evaluation, EvalError> {
        match runs {
            Runs::Blocking => self.0.call(export, input),
            Runs::Async => self.0.call_async(export, input).await,
        }
    }
}

impl Guest for Adapter {
    fn contract(&self) -> Contract {
        Contract::V1
    }

    fn isolation(&self) -> Isolation {
        Isolation::Call
    }

    fn instances_kept(&self) -> usize {
        0
    }

    fn has_validate(&self) -> bool {
        self.0.has_validate()
    }

    fn has_on_complete(&self) -> bool {
        self.0.has_on_complete()
    }

    fn imports_wasi(&self) -> bool {
        false
    }

    fn validate_settings(&self, settings: &Value) -> Result<SettingsVerdict, LoadError> {
        self.0.validate_settings(settings)
    }

    fn evaluate<'a>(
        &'a self,
        ask: &'a mut Ask<'_>,
        runs: Runs,
    ) -> Pending<'a, (Decision, Evaluation)> {
        Box::pin(async move {
            let input = json::input(ask)?;
            let mut ev = self.call(abi::EXPORT_EVALUATE, input, runs).await?;
            let out = ev
                .output
                .take()
                .ok_or_else(|| EvalError::InvalidOutput("evaluate returned nothing".into()))?;
            Ok((json::parse_decision(&out)?, ev))
        })
    }

    fn on_complete<'a>(
        &'a self,
        tell: &'a mut Tell<'_>,
        runs: Runs,
    ) -> Pending<'a, Option<Evaluation>> {
        Box::pin(async move {
            if !self.0.has_on_complete() {
                return Ok(None);
            }
            let input = json::completion(tell)?;
            self.call(abi::EXPORT_ON_COMPLETE, &input, runs)
                .await
                .map(Some)
        })
    }
}

/// The module `bytes` pre-initialised with `settings` (see `snapshot.rs`), and the keys of the
/// instrumented module and of the snapshot: both compiled through `compile` (a cache), so a change
/// of settings compiles only the new snapshot.
pub fn preinitialise(
    engine: &PolicyEngine,
    name: &str,
    bytes: &[u8],
    settings: &Value,
    limits: PolicyLimits,
    mut compile: impl FnMut([u8; 32], &[u8]) -> Result<Module, LoadError>,
) -> Result<([[u8; 32]; 2], Module), LoadError> {
    use sha2::{Digest, Sha256};
    let started = std::time::Instant::now();
    let wasm = wat::parse_bytes(bytes).map_err(|e| LoadError::Compile(format!("{e}")))?;
    let (cx, instrumented) = snapshot::instrument(&wasm)?;
    let instrumented_key: [u8; 32] = Sha256::digest(&instrumented).into();
    let instrumented = compile(instrumented_key, &instrumented)?;
    let wasm = snapshot::take(engine, name, &cx, &instrumented, settings, limits)?;
    let key: [u8; 32] = Sha256::digest(&wasm).into();
    let module = compile(key, &wasm)?;
    tracing::info!(
        policy = name,
        ms = started.elapsed().as_millis() as u64,
        snapshot_bytes = wasm.len(),
        "policy pre-initialised with its settings"
    );
    Ok(([instrumented_key, key], module))
}
