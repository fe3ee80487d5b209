//! WebAssembly admission policies (ABI v1, `docs/policy-abi.md`): a sandboxed wasmtime host that
//! evaluates each request in a fresh instance under fuel, wall-clock and memory limits.

mod abi;
pub mod chain;
pub mod complete;
pub mod component;
pub mod engine;
mod error;
pub mod guest;
pub mod module;
pub mod set;
mod snapshot;
pub mod state;

pub use chain::ChainOutcome;
pub use component::{Isolation, KEPT_CALLS};
pub use engine::{EngineLimits, PolicyEngine};
pub use module::{EvalError, Evaluation, LoadError, Policy, PolicyLimits};
pub use set::{Chain, PolicyLoadError, PolicySet, Reload};
pub use state::HostState;
