//! A map of budgets that holds at most [`MAX_ENTRIES`]: before one is made past it, the oldest
//! made are forgotten, so callers with keys of their own choosing cannot grow it without bound.

use std::collections::VecDeque;
use std::hash::Hash;
use std::sync::Mutex;

use dashmap::DashMap;

use super::{lock, MAX_ENTRIES};

pub(super) struct Bounded<K: Eq + Hash, V> {
    pub(super) map: DashMap<K, V>,
    /// The names in the order they were made (a name forgotten since may still be here).
    made: Mutex<VecDeque<K>>,
}

impl<K: Eq + Hash, V> Default for Bounded<K, V> {
    fn default() -> Self {
        Bounded {
            map: DashMap::new(),
            made: Mutex::default(),
        }
    }
}

impl<K: Eq + Hash + Clone, V> Bounded<K, V> {
    /// Before `name` is looked up that may be made: when it is new and the map is full, the oldest
    /// made are forgotten first (counted under `kind`); returns those forgotten.
    pub(super) fn room_for(&self, name: &K, kind: &'static str) -> Vec<K> {
        if self.map.contains_key(name) {
            return Vec::new();
        }
        let mut len = self.map.len();
        let mut order = lock(&self.made);
        let mut gone = Vec::new();
        while len >= MAX_ENTRIES {
            let Some(old) = order.pop_front() else { break };
            if self.map.remove(&old).is_some() {
                len -= 1;
                gone.push(old);
            }
        }
        order.push_back(name.clone());
        if order.len() > 2 * MAX_ENTRIES {
            order.retain(|n| self.map.contains_key(n));
        }
        drop(order);
        crate::metrics::state_evicted(kind, gone.len());
        gone
    }

    /// Puts one read back from the disk, as made now (at start).
    pub(super) fn load(&self, name: K, value: V) {
        lock(&self.made).push_back(name.clone());
        self.map.insert(name, value);
    }
}
