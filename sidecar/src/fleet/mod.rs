//! Fleet state (issue 10): token buckets that hold across every sidecar of one model,
//! on Redis or Valkey, without a store round trip on the hot path. Each sidecar holds a **lease** of
//! tokens per bucket ([`lease::Lease`]), spends it in process, and tops it up, hands unused tokens
//! back and settles refunds and debt against the fleet bucket with one atomic script
//! ([`store::FleetStore::lease`], `lease.lua`), refilled by the store's own clock.
//!
//! The bound: the tokens a tenant is admitted across the fleet exceed its budget by at most the sum
//! of the leases outstanding, each at most `max_share` of the bucket's capacity.
//!
//! `bucket_take`, `bucket_refund` and `window_add` of every policy use the fleet's buckets and
//! windows when `state.backend` is `redis` ([`runtime::Fleet`]). Windows are pushed in batches
//! (`window.lua`, every 100 ms) and answered from the last fleet total plus the local adds since.

pub mod lease;
pub mod runtime;
pub mod store;

pub use lease::{Lease, LeasePolicy};
pub use runtime::{Fleet, KeyCopy, SharedKeys};
pub use store::{FleetStore, LeaseCall};
