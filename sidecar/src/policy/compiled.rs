//! Where a policy file's contract is told from its bytes, and where it is compiled and linked:
//! the one place outside `v1/` that names ABI v1 (`arrows` holds that).

use std::sync::Arc;

use serde_json::Value;
use wasmtime::component::Component;
use wasmtime::Module;

use super::engine::PolicyEngine;
use super::error::LoadError;
use super::guest::{Contract, Guest};
use super::sandbox::{PolicyLimits, SettingsVerdict};
use super::v1;
use super::v2::{self, ComponentPolicy, Isolation};
use crate::budgets::Budgets;

/// A compiled policy, before it is linked.
#[derive(Clone)]
pub enum Compiled {
    V1(Module),
    V2(Component),
}

/// How a linked policy serves (see [`Compiled::link`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Linking<'a> {
    /// Whose budgets its host state is (`None`: its name's).
    pub state_key: Option<&'a str>,
    /// How long its instances live (`None`: the contract's default).
    pub isolation: Option<Isolation>,
    /// What its settings check asked for (a component's `on-complete` is run only when wanted).
    pub verdict: SettingsVerdict,
}

/// The largest component: a guest language's runtime comes inside it (a Python policy built with
/// componentize-py is about 18 MB, a JavaScript one with componentize-js about 12 MB).
pub const MAX_COMPONENT_BYTES: usize = 48 << 20;

impl Compiled {
    /// Compiles a policy file's bytes: a component, a core module carrying the v2 contract (made a
    /// component first), or a v1 module (binary or WAT).
    pub fn new(
        engine: &PolicyEngine,
        bytes: &[u8],
        limits: PolicyLimits,
    ) -> Result<Compiled, LoadError> {
        let component_limits = PolicyLimits {
            max_module_bytes: limits.max_module_bytes.max(MAX_COMPONENT_BYTES),
            ..limits
        };
        match Contract::of(bytes) {
            Contract::V2 => {
                ComponentPolicy::compile(engine, bytes, component_limits).map(Compiled::V2)
            }
            Contract::V2Embedded => {
                limits.check_size(bytes)?;
                let wrapped = v2::componentize(bytes)?;
                ComponentPolicy::compile(engine, &wrapped, limits).map(Compiled::V2)
            }
            Contract::V1 => v1::compile(engine, bytes, limits).map(Compiled::V1),
        }
    }

    /// A policy ready to serve, named `name`, its budgets in `shared`.
    pub fn link(
        &self,
        engine: &PolicyEngine,
        shared: Arc<Budgets>,
        name: &str,
        limits: PolicyLimits,
        how: Linking<'_>,
    ) -> Result<Box<dyn Guest>, LoadError> {
        let key = how.state_key.unwrap_or(name);
        Ok(match self {
            Compiled::V1(m) => {
                if how.isolation == Some(Isolation::Caller) {
                    return Err(LoadError::Settings(
                        "isolation = \"caller\" is for v2 components: an ABI v1 module runs every call in a fresh instance (docs/policies.md, \"Isolation\")".into(),
                    ));
                }
                Box::new(v1::Policy::link(engine, shared, name, m, limits)?.keyed(key))
            }
            Compiled::V2(c) => Box::new(
                ComponentPolicy::link(engine, shared, name, c, limits)?
                    .keyed(key)
                    .completing(how.verdict.wants_completions)
                    .isolated(how.isolation.unwrap_or(Isolation::Caller)),
            ),
        })
    }

    /// The module of an ABI v1 policy pre-initialised with `settings` (see `v1/snapshot.rs`), and
    /// the keys of the instrumented module and of the snapshot: both compiled through `compile` (a
    /// cache), so a change of settings compiles only the new snapshot.
    pub fn preinitialise(
        engine: &PolicyEngine,
        name: &str,
        bytes: &[u8],
        settings: &Value,
        limits: PolicyLimits,
        mut compile: impl FnMut([u8; 32], &[u8]) -> Result<Compiled, LoadError>,
    ) -> Result<([[u8; 32]; 2], Compiled), LoadError> {
        use sha2::{Digest, Sha256};
        let started = std::time::Instant::now();
        let wasm = wat::parse_bytes(bytes).map_err(|e| LoadError::Compile(format!("{e}")))?;
        let (cx, instrumented) = v1::snapshot::instrument(&wasm)?;
        let instrumented_key: [u8; 32] = Sha256::digest(&instrumented).into();
        let instrumented = compile(instrumented_key, &instrumented)?.core()?;
        let wasm = v1::snapshot::take(engine, name, &cx, &instrumented, settings, limits)?;
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

    /// The core module, for an ABI v1 policy.
    pub fn core(self) -> Result<Module, LoadError> {
        match self {
            Compiled::V1(m) => Ok(m),
            Compiled::V2(_) => Err(LoadError::Compile("not a core module".into())),
        }
    }
}

/// The name a module gives itself in its `slotgate.policy` custom section, when it has one.
pub fn declared_name(bytes: &[u8]) -> Option<String> {
    v1::abi::declared_name(bytes)
}
