//! Policies in the real host and on the request path: the Rust example policies (as ABI v1 modules
//! and as v2 components), hand-written WAT (chains, hostile modules, hot reload), `on_complete` and
//! usage accounting, on the fake upstream.
//!
//! Needs only Rust: the built `slotgate` binary and the Rust example policies
//! (`scripts/build-policies.sh`). The AssemblyScript ports are in `polyglot/`. Part of the fast tier.

mod components;
mod denial_line;
mod durable_budgets;
mod example_policies;
mod made_up_keys;
mod money_quotas;
mod named_tenants;
mod policy_chain;
mod policy_complete;
mod policy_hostile;
mod policy_reload;
mod quota_operations;
mod quotas;
mod usage_accounting;
