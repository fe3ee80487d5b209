//! ABI v1 (`docs/policy-abi.md`) as an adapter to the one contract the chain speaks: an ABI v1
//! core module behind [`Guest`] (the `impl` below). This room owns everything v1: its JSON both ways (`json.rs`), the
//! byte plumbing into guest memory (`abi.rs`), the host functions a module imports (`host.rs`), the
//! module itself (`module.rs`) and its pre-initialisation with its settings (`snapshot.rs`). No
//! name of it is used outside this room but by `compiled.rs`, which tells the contract of a policy
//! file (`arrows` holds that).

pub mod abi;
mod host;
pub mod json;
mod module;
pub mod snapshot;
#[cfg(test)]
mod tests;

use serde_json::Value;
use slotgate_sdk::Decision;
use wasmtime::Module;

use super::engine::PolicyEngine;
use super::error::{EvalError, LoadError};
use super::guest::{Ask, Contract, Guest, Pending, Tell};
use super::sandbox::{Evaluation, PolicyLimits, Runs, SettingsVerdict};
use super::v2::Isolation;
pub use module::Policy;

pub use module::raw_v1_wat;

/// Compiles `bytes` (wasm or WAT) after the module-size cap. Slow: the result is worth caching.
pub fn compile(
    engine: &PolicyEngine,
    bytes: &[u8],
    limits: PolicyLimits,
) -> Result<Module, LoadError> {
    Policy::compile(engine, bytes, limits)
}

impl Policy {
    /// Calls `export` with `input`, on this thread or on an async worker as `runs` says.
    async fn call_as(
        &self,
        export: &str,
        input: &[u8],
        runs: Runs,
    ) -> Result<Evaluation, EvalError> {
        match runs {
            Runs::Blocking => self.call(export, input),
            Runs::Async => self.call_async(export, input).await,
        }
    }
}

impl Guest for Policy {
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
        Policy::has_validate(self)
    }

    fn has_on_complete(&self) -> bool {
        Policy::has_on_complete(self)
    }

    fn imports_wasi(&self) -> bool {
        false
    }

    fn validate_settings(&self, settings: &Value) -> Result<SettingsVerdict, LoadError> {
        Policy::validate_settings(self, settings)
    }

    fn evaluate<'a>(
        &'a self,
        ask: &'a mut Ask<'_>,
        runs: Runs,
    ) -> Pending<'a, (Decision, Evaluation)> {
        Box::pin(async move {
            let input = json::input(ask)?;
            let mut ev = self.call_as(abi::EXPORT_EVALUATE, input, runs).await?;
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
            if !Policy::has_on_complete(self) {
                return Ok(None);
            }
            let input = json::completion(tell)?;
            self.call_as(abi::EXPORT_ON_COMPLETE, &input, runs)
                .await
                .map(Some)
        })
    }
}
