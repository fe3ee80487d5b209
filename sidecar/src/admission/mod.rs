//! Admission: who may use one of the upstream's slots now, who waits, in what order, and who is
//! turned away.

mod bands;
mod cap;
mod claim;
mod demand;
mod fair;
mod owners;
mod queue;
mod stops;

pub use bands::{Band, Bands};
pub use cap::TenantCap;
pub use claim::{estimated_cost, Claim, DEFAULT_MAX_TOKENS};
pub use demand::{demand, Demand, SlotContext, Want};
pub use owners::{Caller, Owners, MAX_OWNED, MAX_OWNED_PER_CALLER};
pub use queue::{
    Admission, BandStats, CachedWeight, Entry, Fairness, QueueStats, Shed, SlotGuard, TenantStats,
    Ticket, Turn, WaiterView, WeakAdmission, MAX_REQUEUES, SHED_GUARD,
};
pub use stops::{Stops, Waiting};
