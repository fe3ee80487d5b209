//! The events policies count (`event`): `slotgate_policy_events_total{policy, event}`, for a
//! bounded number of series.

use std::sync::Arc;

use dashmap::DashMap;

/// Distinct (policy, event) series of `slotgate_policy_events_total`.
const EVENT_SERIES: usize = 256;

/// The counter of each (policy, event) counted.
#[derive(Default)]
pub(super) struct Events {
    counters: DashMap<(Arc<str>, String), metrics::Counter>,
}

impl Events {
    /// Counts `name` for `policy`, for at most [`EVENT_SERIES`] pairs (a policy may name any
    /// number of events): later ones count as `other`.
    pub(super) fn count(&self, policy: &Arc<str>, name: &str) {
        let id = (policy.clone(), name.to_owned());
        if let Some(c) = self.counters.get(&id) {
            c.increment(1);
            return;
        }
        let name = if self.counters.len() < EVENT_SERIES {
            name
        } else {
            "other"
        };
        let c = metrics::counter!(crate::metrics::POLICY_EVENTS_TOTAL,
            "policy" => policy.to_string(), "event" => name.to_owned());
        c.increment(1);
        self.counters.insert(id, c);
    }
}
