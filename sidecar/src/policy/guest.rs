//! A loaded policy of either contract: an ABI v1 core module or a v2 component. A chain may mix
//! them; everything outside `policy/` sees one type.

use std::sync::Arc;

use slotgate_sdk::{Decision, EvaluateInput};
use wasmtime::component::Component;
use wasmtime::Module;

use super::component::{self, ComponentPolicy, Isolation};
use super::engine::PolicyEngine;
use super::module::{Evaluation, Policy, PolicyLimits, SettingsVerdict};
use super::state::SharedState;
use super::{EvalError, LoadError};

/// A compiled policy, before it is linked.
#[derive(Clone)]
pub enum Compiled {
    Core(Module),
    Component(Component),
}

/// What a policy file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// An ABI v1 core module (JSON in and out).
    V1,
    /// A `slotgate:policy@2.0.0` component.
    V2,
    /// A core module built with wit-bindgen against the v2 contract: made a component on load.
    V2Embedded,
}

impl Contract {
    pub fn of(bytes: &[u8]) -> Contract {
        if component::is_component(bytes) {
            Contract::V2
        } else if component::embeds_contract(bytes) {
            Contract::V2Embedded
        } else {
            Contract::V1
        }
    }

    /// For `/status` and `slotgate policy check`.
    pub fn label(self) -> &'static str {
        match self {
            Contract::V1 => "v1",
            Contract::V2 | Contract::V2Embedded => "v2",
        }
    }
}

impl Compiled {
    /// Compiles a policy file's bytes: a component, a core module carrying the v2 contract (made a
    /// component first), or a v1 module (binary or WAT).
    pub fn new(
        engine: &PolicyEngine,
        bytes: &[u8],
        limits: PolicyLimits,
    ) -> Result<Compiled, LoadError> {
        match Contract::of(bytes) {
            Contract::V2 => ComponentPolicy::compile(engine, bytes, component_limits(limits))
                .map(Compiled::Component),
            Contract::V2Embedded => {
                if bytes.len() > limits.max_module_bytes {
                    return Err(LoadError::TooLarge {
                        size: bytes.len(),
                        limit: limits.max_module_bytes,
                    });
                }
                let wrapped = component::componentize(bytes)?;
                ComponentPolicy::compile(engine, &wrapped, limits).map(Compiled::Component)
            }
            Contract::V1 => Policy::compile(engine, bytes, limits).map(Compiled::Core),
        }
    }
}

/// The largest component: a guest language's runtime comes inside it (a Python policy built with
/// componentize-py is about 18 MB, a JavaScript one with componentize-js about 12 MB).
pub const MAX_COMPONENT_BYTES: usize = 48 << 20;

fn component_limits(limits: PolicyLimits) -> PolicyLimits {
    PolicyLimits {
        max_module_bytes: limits.max_module_bytes.max(MAX_COMPONENT_BYTES),
        ..limits
    }
}

/// A policy ready to serve.
pub enum Guest {
    Core(Policy),
    Component(ComponentPolicy),
}

impl Guest {
    pub fn link(
        engine: &PolicyEngine,
        shared: Arc<SharedState>,
        name: &str,
        compiled: &Compiled,
        limits: PolicyLimits,
    ) -> Result<Guest, LoadError> {
        Ok(match compiled {
            Compiled::Core(m) => Guest::Core(Policy::link(engine, shared, name, m, limits)?),
            Compiled::Component(c) => {
                Guest::Component(ComponentPolicy::link(engine, shared, name, c, limits)?)
            }
        })
    }

    /// The same policy keeping its budgets under `key`, and (a component) told whether its
    /// `on-complete` is wanted.
    pub fn keyed(self, key: &str, verdict: &SettingsVerdict) -> Guest {
        match self {
            Guest::Core(p) => Guest::Core(p.keyed(key)),
            Guest::Component(c) => {
                Guest::Component(c.keyed(key).completing(verdict.wants_completions))
            }
        }
    }

    /// The same policy, its instances living as `isolation` says (`None`: a component's default,
    /// [`Isolation::Caller`]). A v1 module runs every call in a fresh instance and takes no other.
    pub fn isolated(self, isolation: Option<Isolation>) -> Result<Guest, LoadError> {
        match (self, isolation) {
            (Guest::Core(_), Some(Isolation::Caller)) => Err(LoadError::Settings(
                "isolation = \"caller\" is for v2 components: an ABI v1 module runs every call in a fresh instance (docs/policies.md, \"Isolation\")".into(),
            )),
            (Guest::Core(p), _) => Ok(Guest::Core(p)),
            (Guest::Component(c), i) => {
                Ok(Guest::Component(c.isolated(i.unwrap_or(Isolation::Caller))))
            }
        }
    }

    /// How long its instances live.
    pub fn isolation(&self) -> Isolation {
        match self {
            Guest::Core(_) => Isolation::Call,
            Guest::Component(c) => c.isolation(),
        }
    }

    /// Instances kept idle for their callers now.
    pub fn instances_kept(&self) -> usize {
        match self {
            Guest::Core(_) => 0,
            Guest::Component(c) => c.kept_idle(),
        }
    }

    pub fn contract(&self) -> Contract {
        match self {
            Guest::Core(_) => Contract::V1,
            Guest::Component(_) => Contract::V2,
        }
    }

    pub fn has_validate(&self) -> bool {
        match self {
            Guest::Core(p) => p.has_validate(),
            Guest::Component(_) => true,
        }
    }

    /// Whether `on_complete` runs after the requests it allowed.
    pub fn has_on_complete(&self) -> bool {
        match self {
            Guest::Core(p) => p.has_on_complete(),
            Guest::Component(c) => c.wants_completions(),
        }
    }

    pub fn validate_settings(
        &self,
        settings: &serde_json::Value,
    ) -> Result<SettingsVerdict, LoadError> {
        match self {
            Guest::Core(p) => p.validate_settings(settings),
            Guest::Component(c) => c.validate_settings(settings),
        }
    }

    /// Evaluates `input` on this thread (the canary, the CLI): settings from the input.
    pub fn evaluate(&self, input: &EvaluateInput) -> Result<(Decision, Evaluation), EvalError> {
        match self {
            Guest::Core(p) => p.evaluate(input),
            Guest::Component(c) => {
                let settings = serde_json::to_string(&input.settings)
                    .map_err(|e| EvalError::Abi(e.to_string()))?;
                c.evaluate(&settings, &evaluation_of(input))
            }
        }
    }
}

/// An [`EvaluateInput`] as the v2 contract carries it.
pub fn evaluation_of(input: &EvaluateInput) -> component::t::Evaluation {
    component::t::Evaluation {
        request: component::request_of(&input.request),
        earlier: component::earlier_of(&input.earlier),
        now_unix_ms: input.now_unix_ms,
    }
}
