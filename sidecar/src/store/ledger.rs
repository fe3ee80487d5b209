//! The usage ledger: requests served, prompt tokens processed and read from llama-server's cache,
//! tokens generated, and their cost, per day in the ledger's zone (`state.usage-zone`, UTC by
//! default), tenant, team, key and model, kept for `state.usage-retention-days` (`GET /usage`,
//! `slotgate usage`). A request adds to a row in memory (a lock and a map entry, no disk); with a
//! store the rows that changed are added to disk with the budgets, a batch every
//! `state.flush-interval`, and reads merge disk and what is not written yet. Without one
//! (`state.dir off`) the ledger lives in memory only.
//!
//! Rows written before teams, keys, cached tokens and cost were booked (the `usage` table, per UTC
//! day, tenant and model) are read as they are: no team or key, nothing cached, no cost.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use redb::{ReadableTable, TableDefinition};

use super::{Store, StoreError};

/// A row's key in the store: (day, tenant, team, key id, model). No team or key: `""`.
type RowKey<'a> = (u32, &'a str, &'a str, &'a str, &'a str);
/// A row's counts in the store: (requests, prompt tokens, of them cached, completion tokens, cost
/// in billionths of the currency).
type Counts = (u64, u64, u64, u64, u64);
/// The ledger's rows.
pub(super) const USAGE2: TableDefinition<RowKey<'static>, Counts> = TableDefinition::new("usage2");
/// The first ledger's rows: (UTC day, tenant, model) → (requests, prompt, completion tokens).
pub(super) const USAGE: TableDefinition<(u32, &str, &str), (u64, u64, u64)> =
    TableDefinition::new("usage");

/// Distinct (tenant, team, key, model) rows one day may hold; past it, further ones count as
/// tenant `other`, model `other`. (Counted in memory: a restart counts afresh.)
pub const ROWS_PER_DAY: usize = 100_000;
/// Distinct rows one tenant's usage of a day may fill; past it, its further ones count as model
/// `other` under no key, so one tenant cannot fill the day for the others.
pub const ROWS_PER_TENANT_PER_DAY: usize = 256;
/// Longest tenant or model name kept (longer ones are cut).
const MAX_NAME: usize = 256;

/// One row: what a tenant used of a model on a day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub requests: u64,
    /// The whole prompt, cached part included.
    pub prompt_tokens: u64,
    /// Of `prompt_tokens`, those read from llama-server's prompt cache.
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// Billionths of the currency (`config::prices::nanos`).
    pub cost_nanos: u64,
}

impl Usage {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &Usage) {
        self.requests += o.requests;
        self.prompt_tokens += o.prompt_tokens;
        self.cached_tokens += o.cached_tokens;
        self.completion_tokens += o.completion_tokens;
        self.cost_nanos += o.cost_nanos;
    }

    fn value(&self) -> Counts {
        (
            self.requests,
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            self.cost_nanos,
        )
    }

    fn of(
        (requests, prompt_tokens, cached_tokens, completion_tokens, cost_nanos): Counts,
    ) -> Usage {
        Usage {
            requests,
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            cost_nanos,
        }
    }
}

/// Whose a row is: a tenant, its key's team and id (`""` when none), the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Who {
    pub tenant: Arc<str>,
    pub team: Arc<str>,
    pub key: Arc<str>,
    pub model: Arc<str>,
}

impl Who {
    pub fn new(tenant: &str, team: Option<&str>, key: Option<&str>, model: &str) -> Who {
        Who {
            tenant: cut(tenant),
            team: cut(team.unwrap_or("")),
            key: cut(key.unwrap_or("")),
            model: cut(model),
        }
    }

    fn other() -> Who {
        Who::new("other", None, None, "other")
    }
}

/// One row as read: its day, whose, and what was used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub day: u32,
    pub who: Who,
    pub usage: Usage,
}

type Key = (u32, Who);
/// A day, its distinct rows, and how many of them each tenant has.
type Day = (u32, HashSet<Who>, HashMap<Arc<str>, usize>);

pub struct Ledger {
    /// Not on disk yet (with a store), or every row kept (without).
    rows: Mutex<HashMap<Key, Usage>>,
    /// The latest day recorded and its distinct rows, to hold `ROWS_PER_DAY`.
    today: Mutex<Day>,
    store: OnceLock<Arc<Store>>,
    retention_days: u32,
    /// The zone whose days the rows are of.
    zone: jiff::tz::TimeZone,
    /// The day old rows were last dropped from the store: once a day is enough.
    pruned: Mutex<u32>,
    /// The model llama-server serves (not a router), once known.
    served: Mutex<Option<Arc<str>>>,
    /// What tokens cost (`[prices]`); empty: nothing is priced.
    prices: crate::config::prices::Prices,
}

impl Ledger {
    /// A ledger keeping `retention_days` days, each a day of `zone`.
    pub fn new(retention_days: u32, zone: jiff::tz::TimeZone) -> Ledger {
        Ledger::priced(retention_days, zone, Default::default())
    }

    /// [`Ledger::new`], pricing each request by `prices`.
    pub fn priced(
        retention_days: u32,
        zone: jiff::tz::TimeZone,
        prices: crate::config::prices::Prices,
    ) -> Ledger {
        Ledger {
            rows: Mutex::default(),
            today: Mutex::default(),
            store: OnceLock::new(),
            retention_days: retention_days.max(1),
            zone,
            pruned: Mutex::new(0),
            served: Mutex::new(None),
            prices,
        }
    }

    /// What `usage` of `model` costs, in billionths of the currency: `None` when `[prices]` has
    /// no price for it.
    pub fn cost(&self, model: &str, usage: &crate::dialect::usage::Usage) -> Option<u64> {
        let p = self.prices.of(model)?;
        Some(crate::config::prices::nanos(p.cost(
            usage.uncached_tokens(),
            usage.cached_tokens,
            usage.completion_tokens,
        )))
    }

    /// Keeps the ledger in `store` from now on (once, at start-up).
    pub fn use_store(&self, store: Arc<Store>) {
        let _ = self.store.set(store);
    }

    /// The day (since the epoch, in the ledger's zone) of `unix_ms`.
    pub fn day_of(&self, unix_ms: i64) -> u32 {
        day_in(unix_ms, &self.zone)
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
    pub fn record(&self, unix_ms: i64, who: Who, usage: &Usage) {
        let day = self.day_of(unix_ms);
        let mut rows = lock(&self.rows);
        let key = (day, who);
        if let Some(row) = rows.get_mut(&key) {
            row.add(usage);
            return;
        }
        let key = {
            let mut today = lock(&self.today);
            if day > today.0 {
                *today = (day, HashSet::new(), HashMap::new());
            }
            let (day, who) = key;
            if day < today.0 || today.1.contains(&who) {
                (day, who)
            } else if today.1.len() >= ROWS_PER_DAY {
                crate::metrics::state_evicted("ledger_rows", 1);
                (day, Who::other())
            } else if today.2.get(&who.tenant).copied().unwrap_or(0) >= ROWS_PER_TENANT_PER_DAY {
                crate::metrics::state_evicted("ledger_rows", 1);
                let folded = Who {
                    model: Arc::from("other"),
                    key: Arc::from(""),
                    ..who
                };
                if today.1.insert(folded.clone()) {
                    *today.2.entry(folded.tenant.clone()).or_default() += 1;
                }
                (day, folded)
            } else {
                today.1.insert(who.clone());
                *today.2.entry(who.tenant.clone()).or_default() += 1;
                (day, who)
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
            let mut t = tx.open_table(USAGE2)?;
            for ((day, w), u) in &due {
                let key = (*day, &*w.tenant, &*w.team, &*w.key, &*w.model);
                let mut row = t
                    .get(key)?
                    .map(|v| Usage::of(v.value()))
                    .unwrap_or_default();
                row.add(u);
                t.insert(key, row.value())?;
            }
            if prune {
                t.retain(|(day, ..), _| day >= oldest)?;
                tx.open_table(USAGE)?
                    .retain(|(day, _, _), _| day >= oldest)?;
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

    /// Every row of days `from..=to` (days since the epoch) that `wanted` keeps, by day and whose.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once per read, off the request path"
    )]
    pub fn read(
        &self,
        from: u32,
        to: u32,
        wanted: impl Fn(&Who) -> bool,
    ) -> Result<Vec<Row>, StoreError> {
        let mut all: BTreeMap<(u32, Who), Usage> = BTreeMap::new();
        if let Some(store) = self.store.get() {
            store.with_read(|tx| {
                let t = tx.open_table(USAGE2)?;
                for row in t.range((from, "", "", "", "")..)? {
                    let (k, v) = row?;
                    let (day, tenant, team, key, model) = k.value();
                    if day > to {
                        break;
                    }
                    let who = Who::new(tenant, Some(team), Some(key), model);
                    if wanted(&who) {
                        all.entry((day, who))
                            .or_default()
                            .add(&Usage::of(v.value()));
                    }
                }
                let old = tx.open_table(USAGE)?;
                for row in old.range((from, "", "")..)? {
                    let (k, v) = row?;
                    let (day, tenant, model) = k.value();
                    if day > to {
                        break;
                    }
                    let who = Who::new(tenant, None, None, model);
                    if wanted(&who) {
                        let (requests, prompt_tokens, completion_tokens) = v.value();
                        all.entry((day, who)).or_default().add(&Usage {
                            requests,
                            prompt_tokens,
                            completion_tokens,
                            ..Usage::default()
                        });
                    }
                }
                Ok(())
            })?;
        }
        for ((day, who), u) in lock(&self.rows).iter() {
            if (from..=to).contains(day) && wanted(who) {
                all.entry((*day, who.clone())).or_default().add(u);
            }
        }
        Ok(all
            .into_iter()
            .map(|((day, who), usage)| Row { day, who, usage })
            .collect())
    }
}

/// The day (since the Unix epoch) of `unix_ms` in `zone`: its civil date there.
pub fn day_in(unix_ms: i64, zone: &jiff::tz::TimeZone) -> u32 {
    let Ok(ts) = jiff::Timestamp::from_millisecond(unix_ms) else {
        return day_of(unix_ms);
    };
    day_number(ts.to_zoned(zone.clone()).date()).unwrap_or_else(|| day_of(unix_ms))
}

/// A civil date as the ledger numbers its days: days since 1970-01-01 (0 before it).
pub fn day_number(date: jiff::civil::Date) -> Option<u32> {
    jiff::civil::date(1970, 1, 1)
        .until(date)
        .ok()
        .map(|span| span.get_days().clamp(0, i32::MAX) as u32)
}

/// The civil date of the ledger's day `day`, when the calendar holds it.
pub fn date_of(day: u32) -> Option<jiff::civil::Date> {
    jiff::civil::date(1970, 1, 1)
        .checked_add(jiff::Span::new().days(i64::from(day)))
        .ok()
}

/// The UTC day (since the Unix epoch) of `unix_ms`.
pub fn day_of(unix_ms: i64) -> u32 {
    unix_ms.div_euclid(86_400_000).clamp(0, u32::MAX as i64) as u32
}

fn cut(s: &str) -> Arc<str> {
    // No team or key, on every request outside `--client-auth keys`: one shared empty name, no
    // allocation.
    static EMPTY: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
    if s.is_empty() {
        return EMPTY.clone();
    }
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
            ..Usage::default()
        }
    }

    fn who(tenant: &str, model: &str) -> Who {
        Who::new(tenant, None, None, model)
    }

    fn utc(days: u32) -> Ledger {
        Ledger::new(days, jiff::tz::TimeZone::UTC)
    }

    fn all(l: &Ledger, from: u32, to: u32) -> Vec<(u32, String, String, Usage)> {
        l.read(from, to, |_| true)
            .unwrap()
            .into_iter()
            .map(|r| {
                (
                    r.day,
                    r.who.tenant.to_string(),
                    r.who.model.to_string(),
                    r.usage,
                )
            })
            .collect()
    }

    const DAY: i64 = 86_400_000;

    #[test]
    fn rows_add_up_per_day_tenant_and_model_in_memory_and_on_disk() {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-ledger-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let l = utc(400);
        l.use_store(Arc::new(Store::open(&dir).unwrap()));
        let t0 = 20_000 * DAY;
        l.record(t0, who("a", "m"), &used(1, 10, 5));
        l.record(t0 + 1000, who("a", "m"), &used(1, 20, 5));
        l.record(t0 + DAY, who("a", "m"), &used(1, 1, 1));
        l.record(t0, who("b", "m"), &used(1, 7, 7));
        assert_eq!(l.persist(t0).unwrap(), 3);
        l.record(t0, who("a", "m"), &used(1, 100, 0));
        assert_eq!(
            all(&l, 20_000, 20_000),
            [
                (20_000, "a".into(), "m".into(), used(3, 130, 10)),
                (20_000, "b".into(), "m".into(), used(1, 7, 7)),
            ],
            "disk and memory merged"
        );
        assert_eq!(
            l.read(20_000, 20_001, |w| &*w.tenant == "a").unwrap().len(),
            2
        );
        l.persist(t0).unwrap();
        drop(l);

        // Reopened: the same; past the retention, gone.
        let l = utc(1);
        l.use_store(Arc::new(Store::open(&dir).unwrap()));
        assert_eq!(l.read(0, u32::MAX, |w| &*w.tenant == "a").unwrap().len(), 2);
        l.record(t0 + 5 * DAY, who("c", "m"), &used(1, 1, 1));
        l.persist(t0 + 5 * DAY).unwrap();
        let rows = all(&l, 0, u32::MAX);
        assert_eq!(rows.len(), 1, "only the last day is kept: {rows:?}");
    }

    #[test]
    #[allow(clippy::result_large_err, reason = "redb's own error, in a test")]
    fn teams_keys_cached_tokens_and_cost_are_rows_of_their_own_and_old_rows_still_read() {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-ledger2-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let store = Arc::new(Store::open(&dir).unwrap());
        // A row the first ledger wrote.
        store
            .with_write(|tx| {
                tx.open_table(USAGE)?
                    .insert((20_000, "alice", "m"), (2, 30, 4))?;
                Ok(())
            })
            .unwrap();
        let l = utc(400);
        l.use_store(store);
        let t0 = 20_000 * DAY;
        let spent = Usage {
            requests: 1,
            prompt_tokens: 1_000,
            cached_tokens: 900,
            completion_tokens: 10,
            cost_nanos: 123_456,
        };
        l.record(
            t0,
            Who::new("alice", Some("research"), Some("3f9c0a1b2c4d"), "m"),
            &spent,
        );
        l.record(
            t0,
            Who::new("alice", Some("research"), Some("3f9c0a1b2c4d"), "m"),
            &spent,
        );
        l.persist(t0).unwrap();
        let rows = l.read(20_000, 20_000, |_| true).unwrap();
        assert_eq!(rows.len(), 2, "{rows:?}");
        let keyed = rows.iter().find(|r| &*r.who.key == "3f9c0a1b2c4d").unwrap();
        assert_eq!(&*keyed.who.team, "research");
        assert_eq!(
            keyed.usage,
            Usage {
                requests: 2,
                prompt_tokens: 2_000,
                cached_tokens: 1_800,
                completion_tokens: 20,
                cost_nanos: 246_912,
            }
        );
        let old = rows.iter().find(|r| r.who.key.is_empty()).unwrap();
        assert_eq!(
            old.usage,
            used(2, 30, 4),
            "the first ledger's row, as it was"
        );
    }

    #[test]
    fn a_day_is_the_zones() {
        let berlin = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
        // 2026-12-07T23:30Z is the 8th in Berlin.
        let ms = "2026-12-07T23:30:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_millisecond();
        assert_eq!(day_in(ms, &berlin), day_of(ms) + 1);
        assert_eq!(day_in(ms, &jiff::tz::TimeZone::UTC), day_of(ms));
        let l = Ledger::new(400, berlin);
        l.record(ms, who("a", "m"), &used(1, 1, 1));
        assert_eq!(
            l.read(day_of(ms) + 1, day_of(ms) + 1, |_| true)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_day_holds_a_bounded_number_of_rows() {
        let l = utc(400);
        for i in 0..ROWS_PER_DAY + 10 {
            l.record(0, who(&format!("t{i}"), "m"), &used(1, 1, 1));
        }
        let rows = l.read(0, 0, |w| &*w.tenant == "other").unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].usage, used(10, 10, 10));
        assert_eq!(all(&l, 0, 0).len(), ROWS_PER_DAY + 1);
    }

    #[test]
    fn one_tenant_cannot_fill_the_day_for_the_others() {
        let l = utc(400);
        for i in 0..ROWS_PER_TENANT_PER_DAY + 50 {
            l.record(0, who("flood", &format!("m{i}")), &used(1, 1, 1));
        }
        l.record(0, who("bob", "real"), &used(1, 2, 3));
        let flood = l.read(0, 0, |w| &*w.tenant == "flood").unwrap();
        assert_eq!(
            flood.len(),
            ROWS_PER_TENANT_PER_DAY + 1,
            "its own models, then `other`"
        );
        assert!(flood
            .iter()
            .any(|r| &*r.who.model == "other" && r.usage == used(50, 50, 50)));
        assert_eq!(
            all(&l, 0, 0)
                .into_iter()
                .filter(|r| r.1 == "bob")
                .collect::<Vec<_>>(),
            [(0, "bob".into(), "real".into(), used(1, 2, 3))]
        );
    }

    #[test]
    fn a_request_is_booked_under_the_served_model_never_the_asked_one() {
        let l = utc(1);
        assert_eq!(&*l.served(None), "-");
        l.set_served_model("tiny.gguf");
        assert_eq!(&*l.served(None), "tiny.gguf");
        assert_eq!(&*l.served(Some("router-model")), "router-model");
    }
}
