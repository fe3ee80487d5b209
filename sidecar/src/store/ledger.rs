//! The usage ledger: requests served and tokens in and out, per UTC day, tenant and model, kept for
//! `state.usage-retention-days` (`GET /usage`, `slotgate usage`). A request adds to a row in memory
//! (a lock and a map entry, no disk); with a store the rows that changed are added to disk with the
//! budgets, a batch every `state.flush-interval`, and reads merge disk and what is not written yet.
//! Without one (`state.dir off`) the ledger lives in memory only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use redb::{ReadableTable, TableDefinition};

use super::{Store, StoreError};

/// (day since the Unix epoch, tenant, model) → (requests, prompt tokens, completion tokens).
pub(super) const USAGE: TableDefinition<(u32, &str, &str), (u64, u64, u64)> =
    TableDefinition::new("usage");

/// Distinct (tenant, model) rows one day may hold; past it, further pairs count as tenant `other`,
/// model `other`. (Counted in memory: a restart counts afresh.)
pub const ROWS_PER_DAY: usize = 100_000;
/// Distinct models one tenant's rows of a day may name; past it, its further models count as
/// model `other`, so one tenant cannot fill the day for the others.
pub const ROWS_PER_TENANT_PER_DAY: usize = 256;
/// Longest tenant or model name kept (longer ones are cut).
const MAX_NAME: usize = 256;

/// One row: what a tenant used of a model on a day.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    fn add(&mut self, o: &Usage) {
        self.requests += o.requests;
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
    }
}

type Key = (u32, Arc<str>, Arc<str>);
/// A day, its distinct (tenant, model) pairs, and how many of them each tenant has.
type Day = (u32, HashSet<(Arc<str>, Arc<str>)>, HashMap<Arc<str>, usize>);

pub struct Ledger {
    /// Not on disk yet (with a store), or every row kept (without).
    rows: Mutex<HashMap<Key, Usage>>,
    /// The latest day recorded and its distinct (tenant, model) rows, to hold `ROWS_PER_DAY`.
    today: Mutex<Day>,
    store: OnceLock<Arc<Store>>,
    retention_days: u32,
    /// The day old rows were last dropped from the store: once a day is enough.
    pruned: Mutex<u32>,
    /// The model llama-server serves (not a router), once known.
    served: Mutex<Option<Arc<str>>>,
}

impl Ledger {
    pub fn new(retention_days: u32) -> Ledger {
        Ledger {
            rows: Mutex::default(),
            today: Mutex::default(),
            store: OnceLock::new(),
            retention_days: retention_days.max(1),
            pruned: Mutex::new(0),
            served: Mutex::new(None),
        }
    }

    /// Keeps the ledger in `store` from now on (once, at start-up).
    pub fn use_store(&self, store: Arc<Store>) {
        let _ = self.store.set(store);
    }

    /// The model llama-server serves, when it is not a router (its `/props` `model_alias`): the
    /// model a request is booked under without a router's.
    pub fn set_served_model(&self, model: &str) {
        let mut served = lock(&self.served);
        if served.as_deref() != Some(model) {
            *served = Some(cut(model));
        }
    }

    /// The model to book a request under: the router's model it was queued for, else the one
    /// llama-server serves, else `-` (never a name the client chose).
    pub fn served(&self, router_model: Option<&str>) -> Arc<str> {
        match router_model {
            Some(m) => cut(m),
            None => lock(&self.served).clone().unwrap_or_else(|| Arc::from("-")),
        }
    }

    /// Adds one request that reached llama-server.
    pub fn record(&self, unix_ms: i64, tenant: &str, model: &str, usage: &Usage) {
        let day = day_of(unix_ms);
        let mut rows = lock(&self.rows);
        let key = (day, cut(tenant), cut(model));
        if let Some(row) = rows.get_mut(&key) {
            row.add(usage);
            return;
        }
        let key = {
            let mut today = lock(&self.today);
            if day > today.0 {
                *today = (day, HashSet::new(), HashMap::new());
            }
            let pair = (key.1.clone(), key.2.clone());
            if day < today.0 || today.1.contains(&pair) {
                key
            } else if today.1.len() >= ROWS_PER_DAY {
                crate::metrics::state_evicted("ledger_rows", 1);
                (day, Arc::from("other"), Arc::from("other"))
            } else if today.2.get(&key.1).copied().unwrap_or(0) >= ROWS_PER_TENANT_PER_DAY {
                crate::metrics::state_evicted("ledger_rows", 1);
                let folded = (key.1.clone(), Arc::from("other"));
                if today.1.insert(folded.clone()) {
                    *today.2.entry(key.1.clone()).or_default() += 1;
                }
                (day, folded.0, folded.1)
            } else {
                today.1.insert(pair);
                *today.2.entry(key.1.clone()).or_default() += 1;
                key
            }
        };
        rows.entry(key).or_default().add(usage);
    }

    /// Adds what changed to the store, in one commit; returns how many rows. On failure they stay
    /// to be written. Days past the retention are dropped, from the store and from memory.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once per batch, off the request path"
    )]
    pub fn persist(&self, now_ms: i64) -> Result<usize, StoreError> {
        // `retention_days` days are kept, today included.
        let today = day_of(now_ms);
        let oldest = today.saturating_sub(self.retention_days - 1);
        let Some(store) = self.store.get() else {
            lock(&self.rows).retain(|k, _| k.0 >= oldest);
            return Ok(0);
        };
        let due = std::mem::take(&mut *lock(&self.rows));
        let prune = *lock(&self.pruned) != today;
        if due.is_empty() && !prune {
            return Ok(0);
        }
        let written = store.with_write(|tx| {
            let mut t = tx.open_table(USAGE)?;
            for ((day, tenant, model), u) in &due {
                let key = (*day, &**tenant, &**model);
                let mut row = t
                    .get(key)?
                    .map(|v| {
                        let (requests, prompt_tokens, completion_tokens) = v.value();
                        Usage {
                            requests,
                            prompt_tokens,
                            completion_tokens,
                        }
                    })
                    .unwrap_or_default();
                row.add(u);
                t.insert(
                    key,
                    (row.requests, row.prompt_tokens, row.completion_tokens),
                )?;
            }
            if prune {
                t.retain(|(day, _, _), _| day >= oldest)?;
            }
            Ok(due.len())
        });
        if prune && written.is_ok() {
            *lock(&self.pruned) = today;
        }
        if written.is_err() {
            let mut rows = lock(&self.rows);
            for (k, u) in due {
                rows.entry(k).or_default().add(&u);
            }
        }
        written
    }

    /// Every row of days `from..=to` (days since the epoch), optionally of one tenant or model,
    /// by day, tenant and model.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once per batch, off the request path"
    )]
    pub fn read(
        &self,
        from: u32,
        to: u32,
        tenant: Option<&str>,
        model: Option<&str>,
    ) -> Result<Vec<(u32, String, String, Usage)>, StoreError> {
        let mut all: BTreeMap<(u32, String, String), Usage> = BTreeMap::new();
        let wanted =
            |t: &str, m: &str| tenant.is_none_or(|w| w == t) && model.is_none_or(|w| w == m);
        if let Some(store) = self.store.get() {
            store.with_read(|tx| {
                let t = tx.open_table(USAGE)?;
                for row in t.range((from, "", "")..)? {
                    let (k, v) = row?;
                    let (day, t, m) = k.value();
                    if day > to {
                        break;
                    }
                    if wanted(t, m) {
                        let (requests, prompt_tokens, completion_tokens) = v.value();
                        all.entry((day, t.to_owned(), m.to_owned()))
                            .or_default()
                            .add(&Usage {
                                requests,
                                prompt_tokens,
                                completion_tokens,
                            });
                    }
                }
                Ok(())
            })?;
        }
        for ((day, t, m), u) in lock(&self.rows).iter() {
            if (from..=to).contains(day) && wanted(t, m) {
                all.entry((*day, t.to_string(), m.to_string()))
                    .or_default()
                    .add(u);
            }
        }
        Ok(all.into_iter().map(|((d, t, m), u)| (d, t, m, u)).collect())
    }
}

/// The UTC day (since the Unix epoch) of `unix_ms`.
pub fn day_of(unix_ms: i64) -> u32 {
    unix_ms.div_euclid(86_400_000).clamp(0, u32::MAX as i64) as u32
}

fn cut(s: &str) -> Arc<str> {
    match s.char_indices().nth(MAX_NAME) {
        Some((at, _)) => Arc::from(&s[..at]),
        None => Arc::from(s),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(requests: u64, p: u64, c: u64) -> Usage {
        Usage {
            requests,
            prompt_tokens: p,
            completion_tokens: c,
        }
    }

    const DAY: i64 = 86_400_000;

    #[test]
    fn rows_add_up_per_day_tenant_and_model_in_memory_and_on_disk() {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-ledger-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let l = Ledger::new(400);
        l.use_store(Arc::new(Store::open(&dir).unwrap()));
        let t0 = 20_000 * DAY;
        l.record(t0, "a", "m", &used(1, 10, 5));
        l.record(t0 + 1000, "a", "m", &used(1, 20, 5));
        l.record(t0 + DAY, "a", "m", &used(1, 1, 1));
        l.record(t0, "b", "m", &used(1, 7, 7));
        assert_eq!(l.persist(t0).unwrap(), 3);
        l.record(t0, "a", "m", &used(1, 100, 0));
        let rows = l.read(20_000, 20_000, None, None).unwrap();
        assert_eq!(
            rows,
            [
                (20_000, "a".into(), "m".into(), used(3, 130, 10)),
                (20_000, "b".into(), "m".into(), used(1, 7, 7)),
            ],
            "disk and memory merged"
        );
        assert_eq!(l.read(20_000, 20_001, Some("a"), None).unwrap().len(), 2);
        l.persist(t0).unwrap();
        drop(l);

        // Reopened: the same; past the retention, gone.
        let l = Ledger::new(1);
        l.use_store(Arc::new(Store::open(&dir).unwrap()));
        assert_eq!(l.read(0, u32::MAX, Some("a"), None).unwrap().len(), 2);
        l.record(t0 + 5 * DAY, "c", "m", &used(1, 1, 1));
        l.persist(t0 + 5 * DAY).unwrap();
        let rows = l.read(0, u32::MAX, None, None).unwrap();
        assert_eq!(rows.len(), 1, "only the last day is kept: {rows:?}");
    }

    #[test]
    fn a_day_holds_a_bounded_number_of_rows() {
        let l = Ledger::new(400);
        for i in 0..ROWS_PER_DAY + 10 {
            l.record(0, &format!("t{i}"), "m", &used(1, 1, 1));
        }
        let rows = l.read(0, 0, Some("other"), None).unwrap();
        assert_eq!(
            rows,
            [(0, "other".into(), "other".into(), used(10, 10, 10))]
        );
        assert_eq!(l.read(0, 0, None, None).unwrap().len(), ROWS_PER_DAY + 1);
    }

    #[test]
    fn one_tenant_cannot_fill_the_day_for_the_others() {
        let l = Ledger::new(400);
        for i in 0..ROWS_PER_TENANT_PER_DAY + 50 {
            l.record(0, "flood", &format!("m{i}"), &used(1, 1, 1));
        }
        l.record(0, "bob", "real", &used(1, 2, 3));
        let flood = l.read(0, 0, Some("flood"), None).unwrap();
        assert_eq!(
            flood.len(),
            ROWS_PER_TENANT_PER_DAY + 1,
            "its own models, then `other`"
        );
        assert!(flood.contains(&(0, "flood".into(), "other".into(), used(50, 50, 50))));
        assert_eq!(
            l.read(0, 0, Some("bob"), None).unwrap(),
            [(0, "bob".into(), "real".into(), used(1, 2, 3))]
        );
    }

    #[test]
    fn a_request_is_booked_under_the_served_model_never_the_asked_one() {
        let l = Ledger::new(1);
        assert_eq!(&*l.served(None), "-");
        l.set_served_model("tiny.gguf");
        assert_eq!(&*l.served(None), "tiny.gguf");
        assert_eq!(&*l.served(Some("router-model")), "router-model");
    }
}
