//! Which embedded database should slotgate keep `state.dir` in? redb 2.6 (the current choice),
//! SQLite through rusqlite (bundled, WAL, synchronous=FULL and =NORMAL) and fjall 3, measured on
//! slotgate's write pattern: one durable commit of the rows that changed every `state.flush-interval`
//! (100 ms), token buckets keyed (policy, tenant key) plus a usage ledger keyed (day, tenant, model).
//!
//! `store-choice all` runs every case (each in a child process of its own, 3 times, median) and
//! prints the tables; the other subcommands are the single cases it runs. See run.sh and RESULTS.md.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// The data: 25,000 tenants x 4 policies = 100,000 buckets; 25,000 tenants x 4 days = 100,000
// ledger rows. A request of a tenant touches its 4 buckets and its ledger row of today, so a batch
// of K changed buckets carries ceil(K/4) changed ledger rows.

const TENANTS: usize = 25_000;
const POLICIES: [&str; 4] = ["token-budget", "tenant-prio", "req-guard-rl", "embed-quota"];
const MODELS: [&str; 4] = ["llama-3.1-8b", "qwen2.5-7b-i", "mistral-7b-v", "phi-3-mini-4"];
const DAYS: u32 = 4;
const TODAY: u32 = 20_427; // days since the epoch (2025-12-05)

#[derive(Debug, Clone, PartialEq)]
struct Bucket {
    policy: String,
    key: String,
    level: f64,
    updated_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Ledger {
    day: u32,
    tenant: String,
    model: String,
    input: u64,
    output: u64,
    requests: u64,
}

fn tenant(i: usize) -> String {
    // ~20 bytes, like slotgate's hashed tenant keys cut short.
    format!("tenant:{i:013}")
}

struct Gen {
    rng: fastrand::Rng,
    tenants: Vec<String>,
    now_ms: u64,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: fastrand::Rng::with_seed(seed),
            tenants: (0..TENANTS).map(tenant).collect(),
            now_ms: 1_764_892_800_000,
        }
    }

    /// Every row, for the initial fill.
    fn all(&mut self) -> (Vec<Bucket>, Vec<Ledger>) {
        let mut b = Vec::with_capacity(TENANTS * POLICIES.len());
        let mut l = Vec::with_capacity(TENANTS * DAYS as usize);
        for (t, name) in self.tenants.iter().enumerate() {
            for p in POLICIES {
                b.push(Bucket {
                    policy: p.to_owned(),
                    key: name.clone(),
                    level: self.rng.f64() * 1000.0,
                    updated_ms: self.now_ms,
                });
            }
            for d in 0..DAYS {
                l.push(Ledger {
                    day: TODAY - d,
                    tenant: name.clone(),
                    model: MODELS[t % MODELS.len()].to_owned(),
                    input: self.rng.u64(..1 << 30),
                    output: self.rng.u64(..1 << 30),
                    requests: self.rng.u64(..1 << 20),
                });
            }
        }
        (b, l)
    }

    /// One flush: `k` changed buckets (4 per tenant) and a ledger row of today per tenant.
    fn batch(&mut self, k: usize) -> (Vec<Bucket>, Vec<Ledger>) {
        self.now_ms += 100;
        let tenants = k.div_ceil(POLICIES.len());
        let mut b = Vec::with_capacity(k);
        let mut l = Vec::with_capacity(tenants);
        for _ in 0..tenants {
            let t = self.rng.usize(..TENANTS);
            for p in POLICIES {
                if b.len() < k {
                    b.push(Bucket {
                        policy: p.to_owned(),
                        key: self.tenants[t].clone(),
                        level: self.rng.f64() * 1000.0,
                        updated_ms: self.now_ms,
                    });
                }
            }
            l.push(Ledger {
                day: TODAY,
                tenant: self.tenants[t].clone(),
                model: MODELS[t % MODELS.len()].to_owned(),
                input: self.rng.u64(..1 << 30),
                output: self.rng.u64(..1 << 30),
                requests: self.rng.u64(..1 << 20),
            });
        }
        (b, l)
    }
}

// ---------------------------------------------------------------------------------------------
// The engines.

trait Engine {
    /// One durable commit (fsync'd before it returns) of these rows.
    fn write(&mut self, b: &[Bucket], l: &[Ledger]);
    fn load(&self) -> (Vec<Bucket>, Vec<Ledger>);
    /// Whatever the engine offers to give space back (redb compact, SQLite checkpoint + VACUUM,
    /// fjall major compaction); returns false where it did nothing.
    fn compact(&mut self) -> bool;
}

const ENGINES: [&str; 4] = ["redb", "sqlite-full", "sqlite-normal", "fjall"];

fn open(engine: &str, dir: &Path) -> Box<dyn Engine> {
    std::fs::create_dir_all(dir).unwrap();
    match engine {
        "redb" => Box::new(Redb::open(dir)),
        "sqlite-full" => Box::new(Sqlite::open(dir, "FULL")),
        "sqlite-normal" => Box::new(Sqlite::open(dir, "NORMAL")),
        "fjall" => Box::new(Fjall::open(dir)),
        other => panic!("unknown engine {other}"),
    }
}

// redb: the tables and the write exactly as sidecar/src/store/mod.rs does them (Database::create,
// default durability = Immediate), plus the ledger table.
mod redb_engine {
    use super::*;
    use redb::{Database, ReadableTable, TableDefinition};

    const BUCKETS: TableDefinition<(&str, &str), (f64, u64)> = TableDefinition::new("buckets");
    const LEDGER: TableDefinition<(u32, &str, &str), (u64, u64, u64)> =
        TableDefinition::new("ledger");

    pub struct Redb(Option<Database>);

    impl Redb {
        pub fn open(dir: &Path) -> Redb {
            let db = Database::create(dir.join("state.redb")).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(BUCKETS).unwrap();
            tx.open_table(LEDGER).unwrap();
            tx.commit().unwrap();
            Redb(Some(db))
        }
    }

    impl Engine for Redb {
        fn write(&mut self, b: &[Bucket], l: &[Ledger]) {
            let tx = self.0.as_ref().unwrap().begin_write().unwrap();
            {
                let mut t = tx.open_table(BUCKETS).unwrap();
                for r in b {
                    t.insert((r.policy.as_str(), r.key.as_str()), (r.level, r.updated_ms))
                        .unwrap();
                }
                let mut t = tx.open_table(LEDGER).unwrap();
                for r in l {
                    t.insert(
                        (r.day, r.tenant.as_str(), r.model.as_str()),
                        (r.input, r.output, r.requests),
                    )
                    .unwrap();
                }
            }
            tx.commit().unwrap();
        }

        fn load(&self) -> (Vec<Bucket>, Vec<Ledger>) {
            let tx = self.0.as_ref().unwrap().begin_read().unwrap();
            let mut b = Vec::new();
            for row in tx.open_table(BUCKETS).unwrap().iter().unwrap() {
                let (k, v) = row.unwrap();
                let ((policy, key), (level, updated_ms)) = (k.value(), v.value());
                b.push(Bucket {
                    policy: policy.to_owned(),
                    key: key.to_owned(),
                    level,
                    updated_ms,
                });
            }
            let mut l = Vec::new();
            for row in tx.open_table(LEDGER).unwrap().iter().unwrap() {
                let (k, v) = row.unwrap();
                let ((day, tenant, model), (input, output, requests)) = (k.value(), v.value());
                l.push(Ledger {
                    day,
                    tenant: tenant.to_owned(),
                    model: model.to_owned(),
                    input,
                    output,
                    requests,
                });
            }
            (b, l)
        }

        fn compact(&mut self) -> bool {
            self.0.as_mut().unwrap().compact().unwrap()
        }
    }
}
use redb_engine::Redb;

// SQLite: WAL, one table per kind WITHOUT ROWID (the key is the primary key), prepared upserts in
// one transaction per flush. synchronous=FULL syncs the WAL at every commit; NORMAL only at
// checkpoints (not durable against a power cut, see RESULTS.md).
struct Sqlite(rusqlite::Connection);

impl Sqlite {
    fn open(dir: &Path, synchronous: &str) -> Sqlite {
        let c = rusqlite::Connection::open(dir.join("state.sqlite")).unwrap();
        let mode: String = c
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        c.execute_batch(&format!(
            "PRAGMA synchronous={synchronous};
             CREATE TABLE IF NOT EXISTS buckets(policy TEXT NOT NULL, key TEXT NOT NULL,
               level REAL NOT NULL, updated_ms INTEGER NOT NULL, PRIMARY KEY(policy, key))
               WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS ledger(day INTEGER NOT NULL, tenant TEXT NOT NULL,
               model TEXT NOT NULL, input INTEGER NOT NULL, output INTEGER NOT NULL,
               requests INTEGER NOT NULL, PRIMARY KEY(day, tenant, model)) WITHOUT ROWID;"
        ))
        .unwrap();
        Sqlite(c)
    }
}

impl Engine for Sqlite {
    fn write(&mut self, b: &[Bucket], l: &[Ledger]) {
        let tx = self.0.transaction().unwrap();
        {
            let mut s = tx
                .prepare_cached("INSERT OR REPLACE INTO buckets VALUES (?1, ?2, ?3, ?4)")
                .unwrap();
            for r in b {
                s.execute(rusqlite::params![r.policy, r.key, r.level, r.updated_ms as i64])
                    .unwrap();
            }
            let mut s = tx
                .prepare_cached("INSERT OR REPLACE INTO ledger VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
                .unwrap();
            for r in l {
                s.execute(rusqlite::params![
                    r.day,
                    r.tenant,
                    r.model,
                    r.input as i64,
                    r.output as i64,
                    r.requests as i64
                ])
                .unwrap();
            }
        }
        tx.commit().unwrap();
    }

    fn load(&self) -> (Vec<Bucket>, Vec<Ledger>) {
        let mut s = self.0.prepare("SELECT * FROM buckets").unwrap();
        let b = s
            .query_map([], |r| {
                Ok(Bucket {
                    policy: r.get(0)?,
                    key: r.get(1)?,
                    level: r.get(2)?,
                    updated_ms: r.get::<_, i64>(3)? as u64,
                })
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut s = self.0.prepare("SELECT * FROM ledger").unwrap();
        let l = s
            .query_map([], |r| {
                Ok(Ledger {
                    day: r.get(0)?,
                    tenant: r.get(1)?,
                    model: r.get(2)?,
                    input: r.get::<_, i64>(3)? as u64,
                    output: r.get::<_, i64>(4)? as u64,
                    requests: r.get::<_, i64>(5)? as u64,
                })
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        (b, l)
    }

    fn compact(&mut self) -> bool {
        self.0
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE); VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        true
    }
}

// fjall: two keyspaces in one database, an atomic WriteBatch per flush persisted with
// PersistMode::SyncAll (fsync of the journal) before commit returns. Keys are the fields joined by
// a 0 byte (day as big-endian u32 first), values the numbers little-endian.
struct Fjall {
    db: fjall::Database,
    buckets: fjall::Keyspace,
    ledger: fjall::Keyspace,
}

impl Fjall {
    fn open(dir: &Path) -> Fjall {
        let db = fjall::Database::builder(dir.join("state.fjall")).open().unwrap();
        let buckets = db
            .keyspace("buckets", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        let ledger = db
            .keyspace("ledger", fjall::KeyspaceCreateOptions::default)
            .unwrap();
        Fjall {
            db,
            buckets,
            ledger,
        }
    }
}

fn join0(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            k.push(0);
        }
        k.extend_from_slice(p);
    }
    k
}

fn split0(k: &[u8]) -> (&str, &str) {
    let at = k.iter().position(|&c| c == 0).unwrap();
    (
        std::str::from_utf8(&k[..at]).unwrap(),
        std::str::from_utf8(&k[at + 1..]).unwrap(),
    )
}

fn u64_at(v: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().unwrap())
}

impl Engine for Fjall {
    fn write(&mut self, b: &[Bucket], l: &[Ledger]) {
        let mut batch = self
            .db
            .batch()
            .durability(Some(fjall::PersistMode::SyncAll));
        for r in b {
            let mut v = [0u8; 16];
            v[..8].copy_from_slice(&r.level.to_le_bytes());
            v[8..].copy_from_slice(&r.updated_ms.to_le_bytes());
            batch.insert(
                &self.buckets,
                join0(&[r.policy.as_bytes(), r.key.as_bytes()]),
                v.to_vec(),
            );
        }
        for r in l {
            let mut v = [0u8; 24];
            v[..8].copy_from_slice(&r.input.to_le_bytes());
            v[8..16].copy_from_slice(&r.output.to_le_bytes());
            v[16..].copy_from_slice(&r.requests.to_le_bytes());
            let mut k = r.day.to_be_bytes().to_vec();
            k.extend_from_slice(&join0(&[r.tenant.as_bytes(), r.model.as_bytes()]));
            batch.insert(&self.ledger, k, v.to_vec());
        }
        batch.commit().unwrap();
    }

    fn load(&self) -> (Vec<Bucket>, Vec<Ledger>) {
        let mut b = Vec::new();
        for g in self.buckets.iter() {
            let (k, v) = g.into_inner().unwrap();
            let (policy, key) = split0(&k);
            b.push(Bucket {
                policy: policy.to_owned(),
                key: key.to_owned(),
                level: f64::from_le_bytes(v[..8].try_into().unwrap()),
                updated_ms: u64_at(&v, 1),
            });
        }
        let mut l = Vec::new();
        for g in self.ledger.iter() {
            let (k, v) = g.into_inner().unwrap();
            let day = u32::from_be_bytes(k[..4].try_into().unwrap());
            let (tenant, model) = split0(&k[4..]);
            l.push(Ledger {
                day,
                tenant: tenant.to_owned(),
                model: model.to_owned(),
                input: u64_at(&v, 0),
                output: u64_at(&v, 1),
                requests: u64_at(&v, 2),
            });
        }
        (b, l)
    }

    fn compact(&mut self) -> bool {
        // fjall compacts on its own, in background threads; nothing to call in its stable API
        // beyond what it already does.
        false
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring.

/// (wchar, write_bytes) of /proc/self/io: the bytes this process passed to write(2)-family calls
/// (every thread's, the engines' background ones too), and the bytes of page cache it dirtied.
/// The second counts whole page-cache folios: on this kernel (6.18, ext4 with large folios) it
/// overstates small random writes several times over, so the tables use the first.
fn proc_io() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0)
    };
    (field("wchar:"), field("write_bytes:"))
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
        .unwrap()
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            files(&e.path(), out);
        } else if ty.is_file() {
            out.push(e.path());
        }
    }
}

/// Bytes the files under `dir` take on disk (allocated blocks).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut v = Vec::new();
    files(dir, &mut v);
    v.iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Drops the files' pages from the page cache (flushed first), so the next open reads the disk:
/// a cold start without dropping every other process's cache.
fn evict(dir: &Path) {
    use std::os::fd::AsRawFd;
    let mut v = Vec::new();
    files(dir, &mut v);
    for p in v {
        if let Ok(f) = std::fs::File::open(&p) {
            let _ = f.sync_all();
            #[allow(unsafe_code, reason = "posix_fadvise on a file this process owns")]
            // SAFETY: a valid open descriptor; advice only.
            unsafe {
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// `key=value` pairs on one line: what a case reports to the driver.
fn report(pairs: &[(&str, f64)]) {
    let s: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", s.join(" "));
}

fn cmd_populate(engine: &str, dir: &Path) {
    let mut db = open(engine, dir);
    let (b, l) = Gen::new(1).all();
    for (cb, cl) in b.chunks(10_000).zip(l.chunks(10_000)) {
        db.write(cb, cl);
    }
    drop(db);
    report(&[("disk_bytes", disk_bytes(dir) as f64)]);
}

fn cmd_commit(engine: &str, dir: &Path, k: usize, n: usize, interval_ms: u64, seed: u64) {
    let mut gen = Gen::new(seed);
    let mut db = open(engine, dir);
    let warm: Vec<_> = (0..3).map(|_| gen.batch(k)).collect();
    let batches: Vec<_> = (0..n).map(|_| gen.batch(k)).collect();
    for (b, l) in &warm {
        db.write(b, l);
    }
    let w0 = proc_io();
    let mut lat = Vec::with_capacity(n);
    let interval = Duration::from_millis(interval_ms);
    for (b, l) in &batches {
        let t = Instant::now();
        db.write(b, l);
        let took = t.elapsed();
        lat.push(took.as_secs_f64() * 1e3);
        if took < interval {
            std::thread::sleep(interval - took);
        }
    }
    let w1 = proc_io();
    drop(db);
    if n == 0 {
        report(&[]);
        return;
    }
    let mean = lat.iter().sum::<f64>() / n as f64;
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    report(&[
        ("p50_ms", pct(&lat, 0.5)),
        ("p99_ms", pct(&lat, 0.99)),
        ("mean_ms", mean),
        ("written_per_commit", (w1.0 - w0.0) as f64 / n as f64),
        ("write_bytes_per_commit", (w1.1 - w0.1) as f64 / n as f64),
    ]);
}

fn cmd_load(engine: &str, dir: &Path) {
    evict(dir);
    let rss0 = rss_kib();
    let t = Instant::now();
    let db = open(engine, dir);
    let opened = t.elapsed();
    let (b, l) = db.load();
    let total = t.elapsed();
    assert_eq!(b.len(), TENANTS * POLICIES.len());
    assert_eq!(l.len(), TENANTS * DAYS as usize);
    let rss_rows = rss_kib();
    drop((b, l));
    #[allow(unsafe_code, reason = "glibc malloc_trim: give freed heap back so RSS is the engine's")]
    // SAFETY: no arguments beyond a size; glibc only.
    unsafe {
        libc::malloc_trim(0);
    }
    let rss_engine = rss_kib();
    drop(db);
    report(&[
        ("open_ms", opened.as_secs_f64() * 1e3),
        ("open_load_ms", total.as_secs_f64() * 1e3),
        ("rss_with_rows_mib", (rss_rows.saturating_sub(rss0)) as f64 / 1024.0),
        ("rss_engine_mib", (rss_engine.saturating_sub(rss0)) as f64 / 1024.0),
    ]);
}

fn cmd_compact(engine: &str, dir: &Path) {
    let mut db = open(engine, dir);
    let t = Instant::now();
    let did = db.compact();
    let took = t.elapsed().as_secs_f64();
    let after = disk_bytes(dir);
    drop(db);
    report(&[
        ("compacted_mib", if did { after as f64 / 1048576.0 } else { f64::NAN }),
        ("compact_s", took),
    ]);
}

fn cmd_grow(engine: &str, dir: &Path, commits: usize, k: usize, every: usize) {
    let mut gen = Gen::new(7);
    let mut db = open(engine, dir);
    let w0 = proc_io();
    let t = Instant::now();
    let mut sizes = Vec::new();
    for i in 1..=commits {
        let (b, l) = gen.batch(k);
        db.write(&b, &l);
        if i % every == 0 {
            sizes.push((i, disk_bytes(dir)));
        }
    }
    let elapsed = t.elapsed().as_secs_f64();
    let w1 = proc_io();
    let end = disk_bytes(dir);
    drop(db);
    let closed = disk_bytes(dir);
    let trail: Vec<String> = sizes
        .iter()
        .map(|(i, s)| format!("{i}:{:.1}", *s as f64 / 1048576.0))
        .collect();
    println!("SIZES {}", trail.join(","));
    report(&[
        ("end_mib", end as f64 / 1048576.0),
        ("closed_mib", closed as f64 / 1048576.0),
        ("elapsed_s", elapsed),
        ("written_per_commit", (w1.0 - w0.0) as f64 / commits as f64),
        ("write_bytes_per_commit", (w1.1 - w0.1) as f64 / commits as f64),
    ]);
}

// ---------------------------------------------------------------------------------------------
// The driver: every case in a child process, REPS times, medians, tables.

type Res = std::collections::BTreeMap<String, f64>;

fn child(args: &[String]) -> (Res, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut r = Res::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("RESULT") {
            for kv in rest.split_whitespace() {
                let (k, v) = kv.split_once('=').unwrap();
                r.insert(k.to_owned(), v.parse().unwrap());
            }
        }
    }
    (r, stdout)
}

/// fsync + fdatasync + sync_file_range + msync calls that strace counts in this case.
fn strace_syncs(args: &[String], tmp: &Path) -> Option<f64> {
    let out = tmp.join("strace.txt");
    let st = Command::new("strace")
        .args(["-f", "-c", "-e", "trace=fsync,fdatasync,sync_file_range,msync,syncfs", "-o"])
        .arg(&out)
        .arg(std::env::current_exe().unwrap())
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .ok()?;
    if !st.success() {
        return None;
    }
    let text = std::fs::read_to_string(&out).ok()?;
    let mut n = 0.0;
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() >= 5 && ["fsync", "fdatasync", "sync_file_range", "msync", "syncfs"].contains(t.last()?) {
            n += t[3].parse::<f64>().ok()?;
        }
    }
    Some(n)
}

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(st.success());
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

fn ratio(v: f64, base: f64) -> String {
    if v.is_nan() || base.is_nan() || base == 0.0 {
        "-".into()
    } else {
        format!("{:.2}x", v / base)
    }
}

fn fmt_bytes(b: f64) -> String {
    if b.is_nan() {
        "-".into()
    } else if b >= 1048576.0 {
        format!("{:.1} MiB", b / 1048576.0)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

fn cmd_all(work: &Path) {
    let reps = env_usize("REPS", 3);
    let n = env_usize("COMMITS", 60);
    let grow_commits = env_usize("GROW_COMMITS", 3_600);
    let ks = [10usize, 1_000, 10_000];
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).unwrap();
    let started = Instant::now();
    let stamp = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());

    // 1. A filled database per engine (100k buckets + 100k ledger rows), the template every case
    //    starts from. (sqlite-full and -normal share a file format: one template.)
    for e in ENGINES {
        stamp(&format!("fill {e}"));
        child(&[s("populate"), s(e), work.join(format!("tpl-{e}")).display().to_string()]);
    }

    // 2. Commit latency / bytes: REPS runs of N paced commits (one per 100 ms) per engine and K.
    let mut commit: std::collections::BTreeMap<(String, usize), Vec<Res>> = Default::default();
    for rep in 0..reps {
        for &k in &ks {
            for e in ENGINES {
                stamp(&format!("commit {e} K={k} run {}", rep + 1));
                let d = work.join("case");
                copy_dir(&work.join(format!("tpl-{e}")), &d);
                let (r, _) = child(&[
                    s("commit"), s(e), d.display().to_string(), s(k), s(n), s(100), s(100 + rep),
                ]);
                commit.entry((e.to_owned(), k)).or_default().push(r);
            }
        }
    }

    // 3. fsyncs per commit: strace -c of 20 unpaced commits minus that of 0 (open + warm-up).
    let mut syncs: std::collections::BTreeMap<(String, usize), f64> = Default::default();
    if Command::new("strace").arg("-V").output().is_ok() {
        for &k in &ks {
            for e in ENGINES {
                stamp(&format!("strace {e} K={k}"));
                let d = work.join("case");
                let mut c = Vec::new();
                for m in [0usize, 20] {
                    copy_dir(&work.join(format!("tpl-{e}")), &d);
                    c.push(strace_syncs(
                        &[s("commit"), s(e), d.display().to_string(), s(k), s(m), s(0), s(9)],
                        work,
                    ));
                }
                if let (Some(a), Some(b)) = (c[0], c[1]) {
                    syncs.insert((e.to_owned(), k), (b - a) / 20.0);
                }
            }
        }
    }

    // 4. Cold open + load-all (page cache of the files dropped first), and RSS.
    let mut load: std::collections::BTreeMap<String, Vec<Res>> = Default::default();
    for rep in 0..reps {
        for e in ENGINES {
            stamp(&format!("load {e} run {}", rep + 1));
            let (r, _) = child(&[s("load"), s(e), work.join(format!("tpl-{e}")).display().to_string()]);
            load.entry(e.to_owned()).or_default().push(r);
        }
    }

    // 5. Growth: GROW_COMMITS unpaced commits of 1,000 buckets (+250 ledger rows) over the 100k
    //    keys, size every tenth of the way; then each engine's compaction (last). Once per engine (sizes
    //    do not need a median); sqlite-normal writes the same file as sqlite-full: skipped.
    //    Then REPS cold open + load-all of the grown files (fjall replays its journal).
    let mut grow: std::collections::BTreeMap<String, (Res, String)> = Default::default();
    for e in ["redb", "sqlite-full", "fjall"] {
        stamp(&format!("grow {e} ({grow_commits} commits)"));
        let d = work.join("case");
        copy_dir(&work.join(format!("tpl-{e}")), &d);
        let (r, out) = child(&[
            s("grow"), s(e), d.display().to_string(), s(grow_commits), s(1000),
            s((grow_commits / 10).max(1)),
        ]);
        let trail = out
            .lines()
            .find_map(|l| l.strip_prefix("SIZES "))
            .unwrap_or("")
            .to_owned();
        // Start-up after an hour-like run: cold open + load-all of the grown files.
        let mut after = Vec::new();
        for rep in 0..reps {
            stamp(&format!("load {e} after growth, run {}", rep + 1));
            after.push(child(&[s("load"), s(e), d.display().to_string()]).0);
        }
        let mut r = r;
        for key in ["open_load_ms", "rss_engine_mib"] {
            r.insert(format!("grown_{key}"), median(after.iter().map(|a| a[key]).collect()));
        }
        stamp(&format!("compact {e}"));
        r.extend(child(&[s("compact"), s(e), d.display().to_string()]).0);
        grow.insert(e.to_owned(), (r, trail));
    }
    let tpl_size: Vec<(String, f64)> = ENGINES
        .iter()
        .map(|e| (s(e), disk_bytes(&work.join(format!("tpl-{e}"))) as f64))
        .collect();
    let _ = std::fs::remove_dir_all(work);
    stamp("done");

    // ---- tables (markdown) ----
    let med = |v: &[Res], key: &str| median(v.iter().filter_map(|r| r.get(key).copied()).collect());
    println!("\n### Commit every 100 ms, durable (median of {reps} runs of {n} commits; K buckets + ceil(K/4) ledger rows per commit)\n");
    println!("| engine | K | p50 ms | p99 ms | p50 vs redb | p99 vs redb | written / commit (write syscalls) | vs redb | fsyncs / commit (strace) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &k in &ks {
        let base = &commit[&(s("redb"), k)];
        let (b50, b99, bw) = (med(base, "p50_ms"), med(base, "p99_ms"), med(base, "written_per_commit"));
        for e in ENGINES {
            let v = &commit[&(s(e), k)];
            let (p50, p99, w) = (med(v, "p50_ms"), med(v, "p99_ms"), med(v, "written_per_commit"));
            let sy = syncs.get(&(s(e), k)).map_or("-".into(), |x| format!("{x:.2}"));
            println!(
                "| {e} | {k} | {p50:.2} | {p99:.2} | {} | {} | {} | {} | {sy} |",
                ratio(p50, b50), ratio(p99, b99), fmt_bytes(w), ratio(w, bw)
            );
        }
    }
    println!("\n### Cold open + load all (100k buckets + 100k ledger rows; page cache of the files dropped; median of {reps})\n");
    println!("| engine | open ms | open+load ms | vs redb | RSS with rows loaded | RSS engine only (rows dropped) | vs redb | file size filled |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let bl = &load["redb"];
    let base_size = tpl_size[0].1;
    for (e, size) in &tpl_size {
        let v = &load[e];
        println!(
            "| {e} | {:.1} | {:.1} | {} | {:.1} MiB | {:.1} MiB | {} | {} ({}) |",
            med(v, "open_ms"), med(v, "open_load_ms"),
            ratio(med(v, "open_load_ms"), med(bl, "open_load_ms")),
            med(v, "rss_with_rows_mib"), med(v, "rss_engine_mib"),
            ratio(med(v, "rss_engine_mib"), med(bl, "rss_engine_mib")),
            fmt_bytes(*size), ratio(*size, base_size)
        );
    }
    println!("\n### Growth: {grow_commits} unpaced durable commits of 1,000 buckets + 250 ledger rows over the 100k keys (once)\n");
    println!("| engine | size at end | vs redb | after compaction | written / commit (amortised) | vs redb | commits/s | then cold open+load ms | then RSS engine only | size trail (commit:MiB) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let (gb, _) = &grow["redb"];
    for e in ["redb", "sqlite-full", "fjall"] {
        let (r, trail) = &grow[e];
        let compacted = r["compacted_mib"];
        println!(
            "| {e} | {:.1} MiB | {} | {} | {} | {} | {:.0} | {:.0} | {:.1} MiB | {trail} |",
            r["end_mib"], ratio(r["end_mib"], gb["end_mib"]),
            if compacted.is_nan() { "n/a (background)".to_owned() } else { format!("{compacted:.1} MiB in {:.1} s", r["compact_s"]) },
            fmt_bytes(r["written_per_commit"]),
            ratio(r["written_per_commit"], gb["written_per_commit"]),
            grow_commits as f64 / r["elapsed_s"],
            r["grown_open_load_ms"],
            r["grown_rss_engine_mib"],
        );
    }
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| a[i].as_str();
    let num = |i: usize| a[i].parse::<usize>().unwrap();
    match arg(0) {
        "populate" => cmd_populate(arg(1), Path::new(arg(2))),
        "commit" => cmd_commit(arg(1), Path::new(arg(2)), num(3), num(4), num(5) as u64, num(6) as u64),
        "load" => cmd_load(arg(1), Path::new(arg(2))),
        "compact" => cmd_compact(arg(1), Path::new(arg(2))),
        "grow" => cmd_grow(arg(1), Path::new(arg(2)), num(3), num(4), num(5)),
        "all" => cmd_all(Path::new(a.get(1).map_or("/tmp/store-choice-work", |s| s.as_str()))),
        other => panic!("unknown command {other}: populate|commit|load|grow|compact|all"),
    }
}
