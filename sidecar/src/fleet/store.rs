//! The fleet buckets on Redis or Valkey: one atomic script per sync (`lease.lua`), over a connection
//! manager that reconnects on its own.

use redis::aio::ConnectionManager;
use redis::Script;

use crate::store::name::{BucketName, BudgetKey};

/// One sync of a lease, as `lease.lua` takes it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseCall<'a> {
    /// The fleet bucket's key.
    pub bucket: &'a str,
    pub capacity: f64,
    /// Tokens per second.
    pub refill: f64,
    /// Tokens wanted for the lease.
    pub want: f64,
    /// Tokens handed back (positive) or owed (negative).
    pub settle: f64,
    /// With `seq`, names the sync: sent again with the same pair, it is not applied again and
    /// answers as the first time.
    pub sidecar: &'a str,
    pub seq: u64,
    /// A calendar quota's window: the fleet's operator limits (hash key) and the quota's field.
    pub limits: Option<(&'a str, &'a str)>,
    /// When the bucket may go, in Unix milliseconds (0: when it is idle, as the script decides);
    /// see [`quota_expiry_ms`].
    pub expires_ms: i64,
}

impl LeaseCall<'_> {
    fn invocation<'s>(&self, script: &'s Script) -> redis::ScriptInvocation<'s> {
        let mut call = script.key(self.bucket);
        if let Some((hash, _)) = self.limits {
            call.key(hash);
        }
        call.arg(self.capacity)
            .arg(self.refill)
            .arg(self.want)
            .arg(self.settle)
            .arg(self.sidecar)
            .arg(self.seq)
            .arg(self.expires_ms);
        if let Some((_, field)) = self.limits {
            call.arg(field);
        }
        call
    }
}

/// A connection to the store, and the lease and window scripts.
#[derive(Clone)]
pub struct FleetStore {
    conn: ConnectionManager,
    lease: Script,
    window: Script,
    limit: Script,
    keys: Script,
    prefix: String,
}

impl FleetStore {
    /// Connects to `url`: `redis://HOST:PORT/DB`, `rediss://...`, or `unix:///path/to/redis.sock`
    /// (also `redis+unix://`). Keys start with `prefix`.
    pub async fn connect(url: &str, prefix: &str) -> redis::RedisResult<FleetStore> {
        let mut store = FleetStore::connect_client(redis::Client::open(url)?).await?;
        store.prefix = prefix.to_owned();
        Ok(store)
    }

    /// Connects with an opened client (keys without a prefix of their own: the caller names them).
    pub async fn connect_client(client: redis::Client) -> redis::RedisResult<FleetStore> {
        let conn = ConnectionManager::new(client).await?;
        Ok(FleetStore {
            conn,
            lease: lease_script(),
            window: Script::new(include_str!("window.lua")),
            limit: Script::new(include_str!("limit.lua")),
            keys: Script::new(include_str!("keys.lua")),
            prefix: String::new(),
        })
    }

    /// This sidecar (`id`) is alive: returns how many of the fleet are (heard from within `ttl`).
    pub async fn heartbeat(
        &self,
        live_key: &str,
        id: &str,
        ttl: std::time::Duration,
    ) -> redis::RedisResult<u64> {
        let mut conn = self.conn.clone();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let (_, _, live, _): (i64, i64, u64, i64) = redis::pipe()
            .atomic()
            .zadd(live_key, id, now_ms)
            .zrembyscore(
                live_key,
                "-inf",
                now_ms.saturating_sub(ttl.as_millis() as u64),
            )
            .zcard(live_key)
            .pexpire(live_key, (ttl.as_millis() * 10) as i64)
            .query_async(&mut conn)
            .await?;
        Ok(live)
    }

    /// [`FleetStore::lease`] on a blocking connection (its timeouts set by the caller).
    pub fn lease_blocking(
        conn: &mut redis::Connection,
        call: &LeaseCall<'_>,
    ) -> redis::RedisResult<(f64, f64)> {
        let (granted, level): (String, String) = call.invocation(&lease_script()).invoke(conn)?;
        Ok((number(&granted)?, number(&level)?))
    }

    /// The key of a policy's fleet bucket under this store's prefix (see [`bucket_key`]).
    pub fn bucket_key(&self, policy: &str, key: &str) -> String {
        bucket_key(&self.prefix, &BucketName::bucket(&policy.into(), key))
    }

    /// One sync of a lease (see [`LeaseCall`]): refills the bucket by the store's clock, settles
    /// what is handed back or owed, and grants up to what is wanted. Returns the tokens granted and
    /// the bucket's level after.
    pub async fn lease(&self, call: &LeaseCall<'_>) -> redis::RedisResult<(f64, f64)> {
        let mut conn = self.conn.clone();
        let (granted, level): (String, String) =
            call.invocation(&self.lease).invoke_async(&mut conn).await?;
        Ok((number(&granted)?, number(&level)?))
    }
}

impl FleetStore {
    /// Sets (or, `None`, removes) an operator's limit for a quota, fleet-wide, and moves its
    /// current window with it (`limit.lua`). Returns what is left in the window, `None` when no
    /// sidecar has used it yet.
    pub async fn set_limit(
        &self,
        limits: &str,
        field: &str,
        window: &str,
        limit: Option<f64>,
    ) -> redis::RedisResult<Option<f64>> {
        let mut conn = self.conn.clone();
        let left: String = self
            .limit
            .key(limits)
            .key(window)
            .arg(field)
            .arg(limit.map_or_else(String::new, |l| l.to_string()))
            .invoke_async(&mut conn)
            .await?;
        match left.as_str() {
            "" => Ok(None),
            n => number(n).map(Some),
        }
    }

    /// Every operator limit of the fleet: field → limit.
    pub async fn limits(&self, limits: &str) -> redis::RedisResult<Vec<(String, f64)>> {
        let mut conn = self.conn.clone();
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(limits)
            .query_async(&mut conn)
            .await?;
        Ok(all
            .into_iter()
            .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
            .collect())
    }

    /// Shares one key's record under `keys` (see `keys.lua`): whether the store kept it.
    pub async fn key_push(
        &self,
        keys: &KeysAt<'_>,
        id: &str,
        record: &str,
        revoked: bool,
        rev: u64,
    ) -> redis::RedisResult<bool> {
        let mut conn = self.conn.clone();
        let kept: i64 = self
            .keys
            .key(keys.records)
            .key(keys.versions)
            .key(keys.counter)
            .arg(id)
            .arg(record)
            .arg(u8::from(revoked))
            .arg(rev)
            .invoke_async(&mut conn)
            .await?;
        Ok(kept == 1)
    }

    /// The keys' version counter (0: none shared yet).
    pub async fn keys_version(&self, keys: &KeysAt<'_>) -> redis::RedisResult<u64> {
        let mut conn = self.conn.clone();
        let v: Option<u64> = redis::cmd("GET")
            .arg(keys.counter)
            .query_async(&mut conn)
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// Every key shared: id → record JSON.
    pub async fn keys_all(&self, keys: &KeysAt<'_>) -> redis::RedisResult<Vec<(String, String)>> {
        let mut conn = self.conn.clone();
        redis::cmd("HGETALL")
            .arg(keys.records)
            .query_async(&mut conn)
            .await
    }

    /// Adds `amount` to the fleet window `key` of `window_ms` and returns its total. `(sidecar, seq)`
    /// as for [`FleetStore::lease`].
    pub async fn window_add(
        &self,
        key: &str,
        window_ms: i64,
        amount: i64,
        sidecar: &str,
        seq: u64,
    ) -> redis::RedisResult<i64> {
        let mut conn = self.conn.clone();
        let total: String = self
            .window
            .key(key)
            .arg(window_ms.max(1))
            .arg(amount)
            .arg(sidecar)
            .arg(seq)
            .invoke_async(&mut conn)
            .await?;
        total.parse::<i64>().map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "window script answered no integer",
                format!("{total:?}: {e}"),
            ))
        })
    }
}

/// Where a fleet's keys are kept: `<prefix>:keys`, `:keys-versions` and `:keys-version`.
#[derive(Debug, Clone, Copy)]
pub struct KeysAt<'a> {
    pub records: &'a str,
    pub versions: &'a str,
    pub counter: &'a str,
}

/// The key of one fleet bucket: `<namespace>:bucket:<policy>:<key>`, the key in its one string
/// form ([`BucketName::stored_key`]).
pub fn bucket_key(namespace: &str, name: &BucketName) -> String {
    format!("{namespace}:bucket:{}:{}", name.policy(), name.stored_key())
}

/// The key of one fleet window: `<namespace>:window:<policy>:<key>:<window_ms>`.
pub fn window_key(namespace: &str, name: &BudgetKey, window_ms: i64) -> String {
    format!(
        "{namespace}:window:{}:{}:{window_ms}",
        name.policy, name.key
    )
}

/// When the fleet bucket of a calendar quota's window may go (a day after the window ends: a late
/// sync of another sidecar must not find it gone and start it whole); 0 for any other bucket.
pub fn quota_expiry_ms(name: &BucketName) -> i64 {
    const GRACE_MS: i64 = 86_400_000;
    let Some((quota, start)) = name.quota() else {
        return 0;
    };
    slotgate_sdk::calendar::Period::parse(&quota.period)
        .and_then(|period| slotgate_sdk::calendar::window(&period, start))
        .map_or(0, |(_, end)| end + GRACE_MS)
}

fn lease_script() -> Script {
    Script::new(include_str!("lease.lua"))
}

fn number(s: &str) -> redis::RedisResult<f64> {
    s.parse::<f64>().map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "lease script answered no number",
            format!("{s:?}: {e}"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::name::QuotaKey;

    #[test]
    fn redis_keys_are_those_earlier_versions_used() {
        let p: Arc<str> = Arc::from("quota");
        let window = BucketName::Quota {
            quota: QuotaKey::new(&p, "tokens:alice", "day@UTC"),
            start_ms: 1_767_225_600_000,
        };
        assert_eq!(
            bucket_key("slotgate:m", &window),
            "slotgate:m:bucket:quota:\u{1}quota\u{1}day\u{1}1767225600000\u{1}tokens:alice"
        );
        assert_eq!(
            bucket_key("slotgate:m", &BucketName::bucket(&p, "uid:1000")),
            "slotgate:m:bucket:quota:uid:1000"
        );
        assert_eq!(
            window_key("slotgate:m", &BudgetKey::new(&p, "k"), 60_000),
            "slotgate:m:window:quota:k:60000"
        );
        // The day after the window's end (2026-01-02 00:00 UTC), as before.
        assert_eq!(quota_expiry_ms(&window), 1_767_312_000_000 + 86_400_000);
        assert_eq!(quota_expiry_ms(&BucketName::bucket(&p, "uid:1000")), 0);
    }
}
