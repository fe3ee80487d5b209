//! Admission: who may use one of the upstream's slots now, who waits, and who is turned away.

mod queue;

pub use queue::{Admission, QueueStats, SlotGuard};
