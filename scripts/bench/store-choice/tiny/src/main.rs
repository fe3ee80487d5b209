//! Opens a database in the directory given and writes one bucket row durably: the build-cost
//! probe of run.sh, built once per feature (`none` = the same program on a plain file).

fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect("a directory"));
    std::fs::create_dir_all(&dir).unwrap();
    let (policy, key, level, updated_ms) = ("token-budget", "tenant:0000000000001", 12.5f64, 1u64);

    #[cfg(feature = "none")]
    {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.join("state.bin")).unwrap();
        writeln!(f, "{policy}\t{key}\t{level}\t{updated_ms}").unwrap();
        f.sync_all().unwrap();
    }

    #[cfg(feature = "redb")]
    {
        const T: redb::TableDefinition<(&str, &str), (f64, u64)> =
            redb::TableDefinition::new("buckets");
        let db = redb::Database::create(dir.join("state.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(T).unwrap().insert((policy, key), (level, updated_ms)).unwrap();
        tx.commit().unwrap();
    }

    #[cfg(feature = "sqlite")]
    {
        let c = rusqlite::Connection::open(dir.join("state.sqlite")).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE IF NOT EXISTS buckets(policy TEXT, key TEXT, level REAL, updated_ms INTEGER,
               PRIMARY KEY(policy, key)) WITHOUT ROWID;",
        )
        .unwrap();
        c.execute(
            "INSERT OR REPLACE INTO buckets VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![policy, key, level, updated_ms as i64],
        )
        .unwrap();
    }

    #[cfg(feature = "fjall")]
    {
        let db = fjall::Database::builder(dir.join("state.fjall")).open().unwrap();
        let t = db.keyspace("buckets", fjall::KeyspaceCreateOptions::default).unwrap();
        let mut v = level.to_le_bytes().to_vec();
        v.extend_from_slice(&updated_ms.to_le_bytes());
        let mut b = db.batch().durability(Some(fjall::PersistMode::SyncAll));
        b.insert(&t, format!("{policy}\0{key}"), v);
        b.commit().unwrap();
    }
}
