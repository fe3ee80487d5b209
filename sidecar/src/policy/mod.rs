//! WebAssembly admission policies: a sandboxed wasmtime host that asks each request's policies,
//! in chain order, what to do with it.
//!
//! - `guest.rs`: the one contract the chain speaks (`Guest`, asked with an `Ask`, told with a
//!   `Tell`), and where a policy file's contract is told, compiled and linked.
//! - `v2/`: `slotgate:policy@2.0.0` components (`sdk/wit/policy.wit`), the contract itself.
//! - `v1/`: ABI v1 modules (`docs/policy-abi.md`) behind an adapter to it; it owns v1's JSON.
//! - `sandbox.rs`: what every call runs in: limits, fuel, the CPU deadline, the memory limiter.
//! - `engine.rs`: the wasmtime engine, its instance pool, epoch ticker and compile cache.
//! - `set.rs`: loading, checking and reloading the chain; `chain.rs`: one version of it serving;
//!   `fold.rs`: folding its decisions into one; `complete.rs`: `on_complete` once a request ends.
//!
//! The budgets policies keep in the host (buckets, windows, quotas) are `crate::budgets`, plain
//! Rust; the host functions call into it with the policy's state key.

pub mod chain;
pub mod compiled;
pub mod complete;
pub mod engine;
mod error;
pub mod fold;
pub mod guest;
pub mod sandbox;
pub mod set;
pub mod v1;
pub mod v2;

pub use chain::Chain;
pub use engine::{EngineLimits, PolicyEngine};
pub use error::{EvalError, LoadError};
pub use fold::ChainOutcome;
pub use sandbox::HostState;
pub use sandbox::{Evaluation, PolicyLimits};
pub use set::{PolicyLoadError, PolicySet, Reload};
pub use v2::{Isolation, KEPT_CALLS};
