//! Policy budgets on disk: the memory backend's token buckets and sliding windows, kept in an
//! embedded database (redb: copy-on-write pages, checksums, a crash-safe commit) in `state.dir`, so
//! a restart or a crash does not hand every tenant a full budget again. This room only reads and
//! writes rows; `budgets` decides what to write and when (behind the request path, a batch every
//! `state.flush-interval`). A budget's name is typed ([`name`]); a row's key column holds its one
//! string form.

use std::path::{Path, PathBuf};

pub mod ledger;
pub mod name;

/// redb's page cache: its default (1 GiB) let a state of 100k rows hold 40 MiB resident; what
/// slotgate reads back is read once, at start (scripts/bench/store-choice/RESULTS.md).
const CACHE_BYTES: usize = 4 << 20;

/// Opens (or creates, 0600) the database file, never through a link (see `owner_only`).
fn open_file(file: &Path) -> Result<std::fs::File, FileError> {
    owner_only::open(
        file,
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
    )
}

/// The database in `file`, with slotgate's cache size.
fn open_db(file: std::fs::File) -> Result<Database, redb::DatabaseError> {
    redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create_file(file)
}

use redb::{Database, ReadableTable, TableDefinition};

use crate::owner_only::{self, FileError};
use name::{BucketName, BudgetKey, QuotaKey};

/// The database file in `state.dir`.
pub const FILE: &str = "state.redb";
/// The rows' format; a file of another is refused rather than misread.
const FORMAT: u64 = 1;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// (policy, key) → (level, last refill as Unix milliseconds); the key is a bucket's
/// [`BucketName::stored_key`].
const BUCKETS: TableDefinition<(&str, &str), (f64, u64)> = TableDefinition::new("buckets");
/// (policy, key) → events, each 16 bytes: Unix milliseconds (u64 LE), amount (i64 LE).
const WINDOWS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("windows");
/// A grant above a quota's limit: (the start of its window, Unix ms; the amount).
pub type Grant = (i64, f64);
/// Quota limits an operator set: (policy, key, period) → limit.
const LIMITS: TableDefinition<(&str, &str, &str), f64> = TableDefinition::new("quota_limits");
/// One-off grants above a quota's limit: (policy, key, period) → (its window's start, Unix ms; the
/// amount granted in that window).
const GRANTS: TableDefinition<(&str, &str, &str), (i64, f64)> =
    TableDefinition::new("quota_grants");
/// Keys slotgate issued: id → the record as JSON (`keys::Record`: a digest, never a secret).
const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state.dir {dir}: {reason}")]
    Dir { dir: PathBuf, reason: String },
    /// Another user could read or replace it.
    #[error("state.dir: {0}")]
    File(FileError),
    #[error("{0} is open in another slotgate: give each its own state.dir")]
    InUse(PathBuf),
    #[error(
        "{file} cannot be read as slotgate's state ({reason}); nothing was changed: move it away to \
         start with full budgets, or point state.dir elsewhere"
    )]
    Unreadable { file: PathBuf, reason: String },
    #[error("writing {file}: {reason}")]
    Write { file: PathBuf, reason: String },
}

/// One token bucket as kept.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketRow {
    pub name: BucketName,
    pub level: f64,
    /// When it was last refilled, in Unix milliseconds.
    pub updated_ms: u64,
}

/// One sliding window as kept: its events, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRow {
    pub name: BudgetKey,
    /// (Unix milliseconds, amount).
    pub events: Vec<(u64, i64)>,
}

/// The open database. One process at a time: redb locks the file.
pub struct Store {
    /// `None` while it is being opened again: after a failed write (a full disk, say) redb refuses
    /// every later operation until the file is opened anew.
    db: std::sync::Mutex<Option<Database>>,
    file: PathBuf,
    /// The last write failed: open the file again before the next.
    stale: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("file", &self.file).finish()
    }
}

impl Store {
    /// Opens (or creates, owner-only) the database in `dir`, checking it is slotgate's: the
    /// directory and the file another user could read or replace are refused (`owner_only`).
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let dir_err = |reason: String| StoreError::Dir {
            dir: dir.to_owned(),
            reason,
        };
        owner_only::dir(dir).map_err(|e| match e {
            FileError::Io { error, .. } => dir_err(format!("cannot create it: {error}")),
            e => StoreError::File(e),
        })?;
        let file = dir.join(FILE);
        let unreadable = |reason: String| StoreError::Unreadable {
            file: file.clone(),
            reason,
        };
        let opened = open_file(&file).map_err(|e| match e {
            FileError::Io { error, .. } => dir_err(format!("cannot open {FILE}: {error}")),
            e => StoreError::File(e),
        })?;
        let db = match open_db(opened) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(StoreError::InUse(file)),
            // redb says of a file that is not one of its databases: invalid data.
            Err(redb::DatabaseError::Storage(redb::StorageError::Io(e)))
                if e.kind() != std::io::ErrorKind::InvalidData =>
            {
                return Err(dir_err(format!("cannot open {FILE}: {e}")))
            }
            Err(e) => return Err(unreadable(e.to_string())),
        };
        let store = Store {
            db: std::sync::Mutex::new(Some(db)),
            file,
            stale: std::sync::atomic::AtomicBool::new(false),
        };
        store.check_format()?;
        Ok(store)
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Stamps a new file with the format, and refuses one of another.
    fn check_format(&self) -> Result<(), StoreError> {
        let guard = self.db();
        let db = guard.as_ref().ok_or_else(|| self.write_err("not open"))?;
        let tx = db.begin_write().map_err(|e| self.write_err(e))?;
        {
            let mut meta = tx.open_table(META).map_err(|e| self.write_err(e))?;
            let found = meta
                .get("format")
                .map_err(|e| self.write_err(e))?
                .map(|v| v.value());
            match found {
                Some(FORMAT) => {}
                Some(other) => {
                    return Err(StoreError::Unreadable {
                        file: self.file.clone(),
                        reason: format!("format {other}, this slotgate reads {FORMAT}"),
                    })
                }
                None => {
                    meta.insert("format", FORMAT)
                        .map_err(|e| self.write_err(e))?;
                }
            }
            tx.open_table(BUCKETS).map_err(|e| self.write_err(e))?;
            tx.open_table(WINDOWS).map_err(|e| self.write_err(e))?;
            tx.open_table(LIMITS).map_err(|e| self.write_err(e))?;
            tx.open_table(KEYS).map_err(|e| self.write_err(e))?;
            tx.open_table(GRANTS).map_err(|e| self.write_err(e))?;
            tx.open_table(ledger::USAGE)
                .map_err(|e| self.write_err(e))?;
            tx.open_table(ledger::USAGE2)
                .map_err(|e| self.write_err(e))?;
        }
        tx.commit().map_err(|e| self.write_err(e))
    }

    fn write_err(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Write {
            file: self.file.clone(),
            reason: e.to_string(),
        }
    }

    /// Every bucket and window kept.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once, at start"
    )]
    pub fn load(&self) -> Result<(Vec<BucketRow>, Vec<WindowRow>), StoreError> {
        self.with_read(|tx| {
            let buckets = read_all(tx, BUCKETS, |(policy, key), (level, updated_ms)| {
                BucketRow {
                    name: BucketName::from_stored(policy, key),
                    level,
                    updated_ms,
                }
            })?;
            let windows = read_all(tx, WINDOWS, |(policy, key), events| WindowRow {
                name: BudgetKey {
                    policy: policy.into(),
                    key: key.to_owned(),
                },
                events: decode_events(events),
            })?;
            Ok((buckets, windows))
        })
    }

    /// Writes `buckets` and `windows` (a window with no event is removed) and removes the `gone`
    /// buckets, in one durable commit.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once per batch, off the request path"
    )]
    pub fn write(
        &self,
        buckets: &[BucketRow],
        windows: &[WindowRow],
        gone: &[BucketName],
    ) -> Result<(), StoreError> {
        self.with_write(|tx| {
            let mut t = tx.open_table(BUCKETS)?;
            for b in buckets {
                let key = b.name.stored_key();
                t.insert((&**b.name.policy(), key.as_str()), (b.level, b.updated_ms))?;
            }
            for name in gone {
                t.remove((&**name.policy(), name.stored_key().as_str()))?;
            }
            let mut t = tx.open_table(WINDOWS)?;
            for w in windows {
                let key = (&*w.name.policy, w.name.key.as_str());
                if w.events.is_empty() {
                    t.remove(key)?;
                } else {
                    t.insert(key, encode_events(&w.events).as_slice())?;
                }
            }
            Ok(())
        })
    }

    /// Runs `f` in one durable write transaction, opening the file again first after a failed
    /// write.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once per batch, off the request path"
    )]
    fn with_write<T>(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        use std::sync::atomic::Ordering;
        let mut guard = self.db();
        if self.stale.load(Ordering::Relaxed) || guard.is_none() {
            // Closed first: redb allows one open handle to a file.
            drop(guard.take());
            let file = open_file(&self.file).map_err(|e| self.write_err(e))?;
            *guard = Some(open_db(file).map_err(|e| self.write_err(e))?);
            self.stale.store(false, Ordering::Relaxed);
        }
        let db = guard.as_ref().ok_or_else(|| self.write_err("not open"))?;
        let done = (|| {
            let tx = db.begin_write()?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok::<T, redb::Error>(out)
        })();
        if done.is_err() {
            self.stale.store(true, Ordering::Relaxed);
        }
        done.map_err(|e| self.write_err(e))
    }

    /// Runs `f` in a read transaction.
    fn with_read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let bad = |e: &dyn std::fmt::Display| StoreError::Unreadable {
            file: self.file.clone(),
            reason: e.to_string(),
        };
        let guard = self.db();
        let db = guard.as_ref().ok_or_else(|| bad(&"not open"))?;
        let tx = db.begin_read().map_err(|e| bad(&e))?;
        f(&tx).map_err(|e| bad(&e))
    }

    /// The quota limits an operator set: (policy, key, period) → limit.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once per batch, off the request path"
    )]
    pub fn load_limits(&self) -> Result<Vec<(QuotaKey, f64)>, StoreError> {
        self.with_read(|tx| {
            read_all(tx, LIMITS, |(policy, key, period), limit| {
                (quota(policy, key, period), limit)
            })
        })
    }

    /// Sets (or, `None`, removes) an operator's quota limit, durably, now.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, in a closure run once per batch, off the request path"
    )]
    pub fn put_limit(&self, quota: &QuotaKey, limit: Option<f64>) -> Result<(), StoreError> {
        let row = (&*quota.policy, quota.key.as_str(), quota.period.as_str());
        self.with_write(|tx| {
            let mut t = tx.open_table(LIMITS)?;
            match limit {
                Some(l) => t.insert(row, l).map(drop)?,
                None => t.remove(row).map(drop)?,
            }
            Ok(())
        })
    }

    /// The grants above quotas' limits: ((policy, key, period), (window start, amount)).
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, read once, at start"
    )]
    pub fn load_grants(&self) -> Result<Vec<(QuotaKey, Grant)>, StoreError> {
        self.with_read(|tx| {
            read_all(tx, GRANTS, |(policy, key, period), grant| {
                (quota(policy, key, period), grant)
            })
        })
    }

    /// Keeps a quota's grant in its window, durably, now.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, at an operator's change, off the request path"
    )]
    pub fn put_grant(&self, quota: &QuotaKey, grant: Grant) -> Result<(), StoreError> {
        self.with_write(|tx| {
            tx.open_table(GRANTS)?.insert(
                (&*quota.policy, quota.key.as_str(), quota.period.as_str()),
                grant,
            )?;
            Ok(())
        })
    }

    /// Every key slotgate issued, as `keys` wrote it.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, read once, at start"
    )]
    pub fn load_keys(&self) -> Result<Vec<Vec<u8>>, StoreError> {
        self.with_read(|tx| read_all(tx, KEYS, |_, row| row.to_vec()))
    }

    /// Keeps each (id, row), replacing the id's, durably, now.
    #[allow(
        clippy::result_large_err,
        reason = "redb's own error, at a key's change, off the request path"
    )]
    pub fn put_keys(&self, rows: &[(&str, Vec<u8>)]) -> Result<(), StoreError> {
        self.with_write(|tx| {
            let mut t = tx.open_table(KEYS)?;
            for (id, row) in rows {
                t.insert(*id, row.as_slice())?;
            }
            Ok(())
        })
    }

    /// Writes a bucket's row as it stands, its key column in any form (an earlier version's).
    #[cfg(test)]
    #[allow(clippy::result_large_err, reason = "redb's own error, in a test")]
    pub(crate) fn write_raw_bucket(
        &self,
        policy: &str,
        key: &str,
        level: f64,
        updated_ms: u64,
    ) -> Result<(), StoreError> {
        self.with_write(|tx| {
            tx.open_table(BUCKETS)?
                .insert((policy, key), (level, updated_ms))?;
            Ok(())
        })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Option<Database>> {
        self.db
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every row of `table`, each as `row` makes it of its key and value.
#[allow(
    clippy::result_large_err,
    reason = "redb's own error, read once per table, off the request path"
)]
fn read_all<K: redb::Key + 'static, V: redb::Value + 'static, T>(
    tx: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
    row: impl for<'a> Fn(K::SelfType<'a>, V::SelfType<'a>) -> T,
) -> Result<Vec<T>, redb::Error> {
    let mut rows = Vec::new();
    for r in tx.open_table(table)?.iter()? {
        let (k, v) = r?;
        rows.push(row(k.value(), v.value()));
    }
    Ok(rows)
}

/// A quota as its limit's and its grant's rows name it (the period as it was written: canonical).
fn quota(policy: &str, key: &str, period: &str) -> QuotaKey {
    QuotaKey {
        policy: policy.into(),
        key: key.to_owned(),
        period: period.to_owned(),
    }
}

fn encode_events(events: &[(u64, i64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(events.len() * 16);
    for (at, n) in events {
        out.extend_from_slice(&at.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

fn decode_events(bytes: &[u8]) -> Vec<(u64, i64)> {
    bytes
        .chunks_exact(16)
        .map(|c| {
            let (at, n) = c.split_at(8);
            (
                u64::from_le_bytes(at.try_into().unwrap_or_default()),
                i64::from_le_bytes(n.try_into().unwrap_or_default()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        std::env::temp_dir().join(format!(
            "slotgate-store-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ))
    }

    #[test]
    fn rows_written_are_read_back_after_reopening() {
        let d = dir();
        let s = Store::open(&d).unwrap();
        let p: std::sync::Arc<str> = "budget".into();
        let b = BucketRow {
            name: BucketName::bucket(&p, "sha256:ab"),
            level: 12.5,
            updated_ms: 1_700_000_000_000,
        };
        let w = WindowRow {
            name: BudgetKey::new(&p, "t"),
            events: vec![(1, 2), (3, -4)],
        };
        s.write(std::slice::from_ref(&b), std::slice::from_ref(&w), &[])
            .unwrap();
        drop(s);
        let s = Store::open(&d).unwrap();
        assert_eq!(s.load().unwrap(), (vec![b], vec![w.clone()]));
        let emptied = WindowRow {
            events: vec![],
            ..w
        };
        s.write(&[], &[emptied], &[]).unwrap();
        assert!(s.load().unwrap().1.is_empty(), "an empty window is removed");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn a_second_opener_and_a_foreign_file_are_refused() {
        let d = dir();
        let _first = Store::open(&d).unwrap();
        assert!(matches!(Store::open(&d), Err(StoreError::InUse(_))));
        let other = dir();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join(FILE), b"not a database at all, just some text").unwrap();
        let err = Store::open(&other).unwrap_err();
        assert!(matches!(err, StoreError::Unreadable { .. }), "{err}");
        assert!(err.to_string().contains("move it away"), "{err}");
    }
}
