//! Overload bands: a range of priorities (a class of work, e.g. background batches at 10 and up)
//! with an optional limit on the share of the slots and of the queue places it may hold, so a flood
//! of one class can never take the slots or fill the queue that another needs.
//!
//! - **Queue**: a request of a band already holding its share of the queue places is refused at
//!   arrival with 429 `band_queue_full`, while places are left for the other bands.
//! - **Slots**: a band holding its share of the slots starts no more; its waiters wait without
//!   holding back the waiters of other bands behind them.
//!
//! A request belongs to the first band whose range holds its priority (as the chain set it, before
//! aging); one in no band is limited by nothing but the queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One band.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub name: Arc<str>,
    /// Its priorities, both ends included (lower is more urgent).
    pub priorities: (i64, i64),
    /// The most of the slots it may hold, a share in (0, 1]: at least one slot.
    pub slots: Option<f64>,
    /// The most of the queue places it may hold, a share in (0, 1]: at least one place.
    pub queue: Option<f64>,
}

/// Every band, in the order the configuration gives them, and how many requests each has had
/// refused (shared by every pool: one count per band).
#[derive(Debug, Clone, Default)]
pub struct Bands(Arc<[Band]>, Arc<[AtomicU64]>);

impl Bands {
    pub fn new(bands: Vec<Band>) -> Self {
        let refused = bands.iter().map(|_| AtomicU64::new(0)).collect();
        Bands(bands.into(), refused)
    }

    /// Band `i` refused a request (its share of the queue was full).
    pub fn refused(&self, i: usize) {
        self.1[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests band `i` has refused since start.
    pub fn refused_total(&self, i: usize) -> u64 {
        self.1[i].load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn get(&self, i: usize) -> &Band {
        &self.0[i]
    }

    /// The band of a request at `priority`.
    pub fn of(&self, priority: i64) -> Option<usize> {
        self.0
            .iter()
            .position(|b| (b.priorities.0..=b.priorities.1).contains(&priority))
    }

    /// The slots band `i` may hold out of `slots`: its share, rounded down, at least one.
    pub fn slot_limit(&self, i: usize, slots: usize) -> Option<usize> {
        let share = self.0[i].slots?;
        Some(((share * slots as f64).floor() as usize).max(1))
    }

    /// The queue places band `i` may hold out of `capacity`: its share, rounded down, at least one.
    pub fn queue_limit(&self, i: usize, capacity: usize) -> Option<usize> {
        let share = self.0[i].queue?;
        Some(((share * capacity as f64).floor() as usize).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_priority_falls_in_the_first_band_that_holds_it_and_limits_round_down() {
        let b = Bands::new(vec![
            Band {
                name: "background".into(),
                priorities: (10, i64::MAX),
                slots: Some(0.5),
                queue: Some(0.25),
            },
            Band {
                name: "batch".into(),
                priorities: (1, 9),
                slots: None,
                queue: Some(0.5),
            },
        ]);
        assert_eq!(
            [b.of(0), b.of(3), b.of(10), b.of(99)],
            [None, Some(1), Some(0), Some(0)]
        );
        assert_eq!(b.slot_limit(0, 4), Some(2));
        assert_eq!(b.slot_limit(0, 1), Some(1), "at least one slot");
        assert_eq!(b.slot_limit(1, 4), None);
        assert_eq!(b.queue_limit(0, 8), Some(2));
        assert_eq!(b.queue_limit(0, 2), Some(1), "at least one place");
    }
}
