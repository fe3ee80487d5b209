//! Sliding windows (`window_add`): the total of what was added in the last so many milliseconds,
//! in this sidecar or, on a fleet, the fleet's.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{BudgetKey, Budgets};

pub(super) struct Window {
    /// What was added, and when, oldest first.
    pub(super) events: VecDeque<(Instant, i64)>,
    pub(super) total: i64,
}

impl Budgets {
    /// Adds `amount` now and returns the total of the last `window_ms` milliseconds.
    pub fn window_add(&self, policy: &Arc<str>, key: &str, window_ms: i64, amount: i64) -> i64 {
        let name = BudgetKey::new(policy, key);
        if let Some(fleet) = self.fleet.get() {
            return fleet.window_add(&name, window_ms, amount);
        }
        let now = self.clock.now();
        let span = Duration::from_millis(window_ms.max(0) as u64);
        for gone in self.windows.room_for(&name, "windows") {
            // Forgotten on disk too, at the next write (see `persist`).
            self.changed_window(gone);
        }
        let mut w = self
            .windows
            .map
            .entry(name.clone())
            .or_insert_with(|| Window {
                events: VecDeque::new(),
                total: 0,
            });
        while let Some(&(at, n)) = w.events.front() {
            if now.duration_since(at) < span {
                break;
            }
            w.total -= n;
            w.events.pop_front();
        }
        let changed = amount != 0;
        if changed {
            w.events.push_back((now, amount));
            w.total += amount;
        }
        let total = w.total;
        drop(w);
        if changed {
            self.changed_window(name);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_counts_recent_events() {
        let s = Budgets::default();
        let p: Arc<str> = Arc::from("p");
        assert_eq!(s.window_add(&p, "k", 60_000, 2), 2);
        assert_eq!(s.window_add(&p, "k", 60_000, 3), 5);
        assert_eq!(
            s.window_add(&p, "k", 0, 0),
            0,
            "a zero window forgets everything"
        );
    }
}
