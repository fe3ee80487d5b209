//! The policies' budgets, in plain Rust (no wasmtime here: the policy host calls in): token
//! buckets and sliding windows keyed by the names policies choose, calendar quotas with the
//! operators' limits and grants, and their levels for `/status` and `/quotas`. On the `redis`
//! backend the buckets and windows are the fleet's (`crate::fleet`); with `state.dir` what changed
//! is written behind, a batch each `persist`, and read back at start (`crate::store`); the request
//! path never waits for the disk.

use std::sync::{Arc, Mutex, OnceLock};

use crate::fleet::Fleet;

mod bounded;
mod buckets;
mod clock;
mod events;
mod levels;
mod limits;
mod persist;
mod quotas;
mod windows;

pub use crate::store::name::{canonical, BucketName, BudgetKey, QuotaKey};
pub use clock::{wall_ms, Clock};
pub use levels::{BucketLevel, QuotaLevel};

/// Buckets (quota windows among them) and sliding windows each kept in memory; past it the oldest
/// made is forgotten (counted in `slotgate_state_evicted_total`), so callers with keys of their own
/// choosing cannot grow the state without bound.
pub const MAX_ENTRIES: usize = 100_000;

/// The budgets of every policy, shared by all their evaluations.
#[derive(Default)]
pub struct Budgets {
    buckets: bounded::Bounded<BucketName, buckets::Bucket>,
    windows: bounded::Bounded<BudgetKey, windows::Window>,
    /// The current window of each quota period in use.
    calendar: quotas::Calendar,
    /// Operators' limits and grants, and the limits the policies ask for.
    limits: limits::Limits,
    /// The counter of each (policy, event) counted.
    events: events::Events,
    /// With `state.backend = redis`: the fleet buckets and windows, which then take the place of
    /// `buckets` and `windows`.
    fleet: OnceLock<Arc<Fleet>>,
    /// With `state.dir`: where `buckets` and `windows` are kept across restarts.
    durable: OnceLock<persist::Durable>,
    /// The time budgets are kept by: the machine's, or a fixture's (`slotgate policy test`).
    clock: Clock,
}

impl Budgets {
    /// Puts the buckets on the fleet's store from now on (once, at start-up).
    pub fn use_fleet(&self, fleet: Arc<Fleet>) {
        let _ = self.fleet.set(fleet);
    }

    /// The clock the buckets, windows and quotas read (and a policy's clocks).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The fleet backend, when budgets are on it.
    pub fn fleet(&self) -> Option<&Arc<Fleet>> {
        self.fleet.get()
    }

    /// `event`: counts it in `slotgate_policy_events_total{policy, event}`.
    pub fn event(&self, policy: &Arc<str>, name: &str) {
        self.events.count(policy, name);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
