//! Budgets kept across restarts (`state.dir`): what changed is marked, written behind the request
//! path in one commit each `persist`, and read back at start (`crate::store` holds the rows).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::store::{BucketRow, Store, StoreError, WindowRow};

use super::buckets::Bucket;
use super::clock::{instant_of, wall_ms_of};
use super::windows::Window;
use super::{lock, BucketName, BudgetKey, Budgets};

/// Window events persisted within this much of each other are kept as one, at the later time: a
/// window then forgets them a little later, never sooner.
const WINDOW_GRAIN_MS: u64 = 100;

/// The disk behind the maps, and what changed since it was last written.
pub(super) struct Durable {
    pub(super) store: Arc<Store>,
    dirty_buckets: Mutex<HashSet<BucketName>>,
    dirty_windows: Mutex<HashSet<BudgetKey>>,
}

impl Durable {
    fn new(store: Arc<Store>) -> Durable {
        Durable {
            store,
            dirty_buckets: Mutex::default(),
            dirty_windows: Mutex::default(),
        }
    }
}

impl Budgets {
    /// Marks a bucket to be written (or, when it is gone, removed) at the next `persist`.
    pub(super) fn changed_bucket(&self, name: &BucketName) {
        if let Some(d) = self.durable.get() {
            lock(&d.dirty_buckets).insert(name.clone());
        }
    }

    /// Marks a window to be written at the next `persist`.
    pub(super) fn changed_window(&self, name: BudgetKey) {
        if let Some(d) = self.durable.get() {
            lock(&d.dirty_windows).insert(name);
        }
    }

    /// Keeps the buckets and windows in `store` from now on, starting from what it holds (once, at
    /// start-up, before any evaluation). Returns how many buckets and windows it held.
    pub fn use_store(&self, store: Arc<Store>) -> Result<(usize, usize), StoreError> {
        for (quota, limit) in store.load_limits()? {
            self.limits.operator.insert(quota, limit);
        }
        for (quota, grant) in store.load_grants()? {
            self.limits.grants.insert(quota, grant);
        }
        if self.fleet.get().is_some() {
            // The fleet's store holds the budgets: this one keeps the operator's limits only.
            let _ = self.durable.set(Durable::new(store));
            return Ok((0, 0));
        }
        let (buckets, windows) = store.load()?;
        let (now, wall) = self.clock.both();
        let counts = (buckets.len(), windows.len());
        for b in buckets {
            let bucket = Bucket {
                level: b.level,
                updated: instant_of(b.updated_ms, now, wall),
                shape: None,
            };
            self.buckets.load(b.name, bucket);
        }
        for w in windows {
            let events: VecDeque<(Instant, i64)> = w
                .events
                .iter()
                .map(|&(at, n)| (instant_of(at, now, wall), n))
                .collect();
            let total = events.iter().map(|e| e.1).sum();
            self.windows.load(w.name, Window { events, total });
        }
        let _ = self.durable.set(Durable::new(store));
        Ok(counts)
    }

    /// The file budgets are kept in, if any.
    pub fn store_file(&self) -> Option<std::path::PathBuf> {
        self.durable.get().map(|d| d.store.file().to_owned())
    }

    /// Writes what changed since the last call, in one durable commit; returns how many buckets and
    /// windows. On failure what was to be written stays to be written.
    pub fn persist(&self) -> Result<usize, StoreError> {
        let Some(d) = self.durable.get() else {
            return Ok(0);
        };
        let buckets_due = std::mem::take(&mut *lock(&d.dirty_buckets));
        let windows_due = std::mem::take(&mut *lock(&d.dirty_windows));
        if buckets_due.is_empty() && windows_due.is_empty() {
            return Ok(0);
        }
        let (now, wall) = self.clock.both();
        let mut gone = Vec::new();
        let buckets: Vec<BucketRow> = buckets_due
            .iter()
            .filter_map(|name| {
                let Some(b) = self.buckets.map.get(name) else {
                    gone.push(name.clone());
                    return None;
                };
                Some(BucketRow {
                    name: name.clone(),
                    level: b.level,
                    updated_ms: wall_ms_of(b.updated, now, wall),
                })
            })
            .collect();
        let windows: Vec<WindowRow> = windows_due
            .iter()
            .filter_map(|name| {
                let w = self.windows.map.get(name)?;
                let mut events: Vec<(u64, i64)> = Vec::new();
                for &(at, n) in &w.events {
                    let ms = wall_ms_of(at, now, wall).div_ceil(WINDOW_GRAIN_MS) * WINDOW_GRAIN_MS;
                    match events.last_mut() {
                        Some(last) if last.0 == ms => last.1 += n,
                        _ => events.push((ms, n)),
                    }
                }
                Some(WindowRow {
                    name: name.clone(),
                    events,
                })
            })
            .collect();
        match d.store.write(&buckets, &windows, &gone) {
            Ok(()) => Ok(buckets.len() + windows.len() + gone.len()),
            Err(e) => {
                lock(&d.dirty_buckets).extend(buckets_due);
                lock(&d.dirty_windows).extend(windows_due);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "slotgate-state-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ))
    }

    #[test]
    fn budgets_kept_in_a_store_are_there_after_a_restart() {
        let dir = dir();
        let p: Arc<str> = Arc::from("budget");
        let s = Budgets::default();
        s.use_store(Arc::new(Store::open(&dir).unwrap())).unwrap();
        // A fixed quota of 100, 70 taken; a window of 5.
        assert_eq!(s.bucket_take(&p, "t", 100.0, 0.0, 70.0), 0.0);
        assert_eq!(s.window_add(&p, "w", 60_000, 5), 5);
        assert_eq!(s.persist().unwrap(), 2);
        assert_eq!(s.persist().unwrap(), 0, "nothing changed since");
        drop(s);

        let s = Budgets::default();
        assert_eq!(
            s.use_store(Arc::new(Store::open(&dir).unwrap())).unwrap(),
            (1, 1)
        );
        assert!(
            s.bucket_take(&p, "t", 100.0, 0.0, 40.0).is_infinite(),
            "30 left, never refilled"
        );
        assert_eq!(s.bucket_take(&p, "t", 100.0, 0.0, 30.0), 0.0);
        assert_eq!(s.window_add(&p, "w", 60_000, 1), 6);
    }

    #[test]
    fn a_quota_window_kept_by_an_earlier_version_is_read_back() {
        let dir = dir();
        let s = Budgets::default();
        let p: Arc<str> = Arc::from("quota");
        let window = s
            .quota_window_now("quota", "tokens:alice", "day@Europe/Paris")
            .unwrap();
        let (_, start) = window.quota().unwrap();
        // The row as versions before typed names wrote it: the window in the key column.
        let store = Store::open(&dir).unwrap();
        let old_key = format!("\u{1}quota\u{1}day@Europe/Paris\u{1}{start}\u{1}tokens:alice");
        store.write_raw_bucket("quota", &old_key, 400.0, 0).unwrap();
        assert_eq!(s.use_store(Arc::new(store)).unwrap(), (1, 0));
        assert_eq!(
            s.quota_level(&p, "tokens:alice", "day@Europe/Paris", 1000.0)
                .unwrap(),
            400.0,
            "600 of 1000 used before the restart"
        );
        assert_eq!(
            s.quota_take(&p, "tokens:alice", "day@Europe/Paris", 1000.0, 100.0),
            Ok(0.0)
        );
        assert_eq!(s.persist().unwrap(), 1);
        let (rows, _) = s.durable.get().unwrap().store.load().unwrap();
        assert_eq!(rows.len(), 1, "written back over the same row");
        assert_eq!(rows[0].name, window);
        assert_eq!(rows[0].level, 300.0);
    }
}
