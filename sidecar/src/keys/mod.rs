//! Keys slotgate issues (docs/keys.md): who a caller is when `--client-auth keys` says slotgate
//! decides it. Each key names a tenant (and maybe a team), the models it may use, when it ends, and
//! may carry a priority, a concurrency cap and labels. Only a digest of its secret is kept
//! (`secret`), in the state store beside the quotas, durably at each change; lists show its id.
//!
//! A request's key is found by the id in its text and compared in constant time; a rotated key's
//! old secret works until its grace ends. A key that is unknown, revoked or expired is refused
//! before anything is counted or stored (`pipeline::caller`).

pub mod secret;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::Store;

/// The most keys one slotgate keeps (revoked ones included, until removed).
pub const MAX_KEYS: usize = 1_000_000;
/// The most labels a key carries, and their sizes.
const MAX_LABELS: usize = 16;
const MAX_LABEL_KEY: usize = 64;
const MAX_LABEL_VALUE: usize = 256;
/// The most models a key names.
const MAX_MODELS: usize = 64;
/// The longest grace a rotation gives the old secret.
pub const MAX_GRACE: Duration = Duration::from_secs(30 * 86_400);
/// How often a key's last use is written down, at most.
const LAST_USED_STEP_MS: u64 = 60_000;

/// A key as kept and as the admin API shows it (never its secret).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub id: String,
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The models it may use; empty: any.
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_service: Option<usize>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub created_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_ms: Option<i64>,
    /// The digest of its secret, hex.
    pub digest: String,
    /// A rotated key's old secret and when it stops working.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Previous {
    pub digest: String,
    pub until_ms: i64,
}

impl Record {
    /// The record as lists show it: no digest.
    pub fn shown(&self, now_ms: i64) -> serde_json::Value {
        let mut v = serde_json::json!({
            "id": self.id,
            "tenant": self.tenant,
            "team": self.team,
            "models": self.models,
            "priority": self.priority,
            "max_in_service": self.max_in_service,
            "labels": self.labels,
            "created": rfc3339(self.created_ms),
            "expires": self.expires_ms.map(rfc3339),
            "revoked": self.revoked_ms.map(rfc3339),
            "last_used": self.last_used_ms.map(rfc3339),
            "state": self.state(now_ms),
        });
        if let Some(p) = &self.previous {
            if p.until_ms > now_ms {
                v["old_secret_until"] = serde_json::json!(rfc3339(p.until_ms));
            }
        }
        v
    }

    /// `active`, `revoked` or `expired`.
    pub fn state(&self, now_ms: i64) -> &'static str {
        if self.revoked_ms.is_some() {
            "revoked"
        } else if self.expires_ms.is_some_and(|e| e <= now_ms) {
            "expired"
        } else {
            "active"
        }
    }

    /// Whether it may use `model` (any, when it names none).
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

pub fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).map_or_else(|_| ms.to_string(), |t| t.to_string())
}

/// A key in force: its record and its digests, ready to compare.
#[derive(Debug)]
pub struct Key {
    pub record: Record,
    digest: [u8; 32],
    previous: Option<([u8; 32], i64)>,
    /// Its last use, Unix milliseconds (0: never since start, see `record.last_used_ms`).
    last_used: AtomicU64,
    /// The last use written down.
    last_written: AtomicU64,
}

impl Key {
    fn of(record: Record) -> Result<Key, String> {
        let digest = secret::unhex(&record.digest)
            .ok_or_else(|| format!("key {}: its digest is not 64 hex digits", record.id))?;
        let previous = match &record.previous {
            Some(p) => Some((
                secret::unhex(&p.digest).ok_or_else(|| {
                    format!("key {}: its old digest is not 64 hex digits", record.id)
                })?,
                p.until_ms,
            )),
            None => None,
        };
        let used = record.last_used_ms.unwrap_or(0).max(0) as u64;
        Ok(Key {
            record,
            digest,
            previous,
            last_used: AtomicU64::new(used),
            last_written: AtomicU64::new(used),
        })
    }

    /// The tenant it names.
    pub fn tenant(&self) -> &str {
        &self.record.tenant
    }
}

/// Why a presented key is not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No key slotgate issued has this text (or it is not one's shape).
    Unknown,
    Revoked,
    Expired,
}

impl Refused {
    /// The reason label of `slotgate_callers_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Unknown => "unknown_key",
            Refused::Revoked => "revoked_key",
            Refused::Expired => "expired_key",
        }
    }
}

/// What `key create` asks for.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    pub tenant: String,
    #[serde(default)]
    pub team: Option<String>,
    #[serde(default)]
    pub models: Vec<String>,
    /// How long it lasts: `30d`, `12h`, ...
    #[serde(default)]
    pub expires: Option<String>,
    #[serde(default)]
    pub priority: Option<i64>,
    #[serde(default)]
    pub max_in_service: Option<usize>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Every key slotgate issued, kept in the state store.
pub struct Keys {
    by_id: RwLock<HashMap<String, Arc<Key>>>,
    store: Option<Arc<Store>>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("count", &self.len()).finish()
    }
}

impl Keys {
    /// The keys kept in `store` (none without one: keys then live until the process ends).
    pub fn open(store: Option<Arc<Store>>) -> Result<Keys, String> {
        let mut by_id = HashMap::new();
        if let Some(s) = &store {
            for row in s.load_keys().map_err(|e| e.to_string())? {
                // A row that cannot be read stops the start: a key that vanished would take its
                // revocation with it.
                let record: Record = serde_json::from_slice(&row)
                    .map_err(|e| format!("{}: a key's row: {e}", s.file().display()))?;
                let key = Key::of(record)?;
                by_id.insert(key.record.id.clone(), Arc::new(key));
            }
        }
        Ok(Keys {
            by_id: RwLock::new(by_id),
            store,
        })
    }

    /// No keys and no store: what a slotgate that issues none holds.
    pub fn none() -> Keys {
        Keys {
            by_id: RwLock::new(HashMap::new()),
            store: None,
        }
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether changes outlive the process.
    pub fn durable(&self) -> bool {
        self.store.is_some()
    }

    /// The key `presented` is, if it is one in force at `now_ms`. A revoked or expired key is told
    /// apart only to a caller holding its secret.
    pub fn check(&self, presented: &[u8], now_ms: i64) -> Result<Arc<Key>, Refused> {
        let id = secret::id_of(presented).ok_or(Refused::Unknown)?;
        let key = self.read().get(id).cloned().ok_or(Refused::Unknown)?;
        let d = secret::digest(presented);
        let current = secret::same(&d, &key.digest);
        let old = key
            .previous
            .is_some_and(|(p, until)| secret::same(&d, &p) && now_ms < until);
        if !(current || old) {
            return Err(Refused::Unknown);
        }
        match key.record.state(now_ms) {
            "revoked" => Err(Refused::Revoked),
            "expired" => Err(Refused::Expired),
            _ => {
                key.last_used.store(now_ms.max(0) as u64, Ordering::Relaxed);
                Ok(key)
            }
        }
    }

    /// Every key, oldest first.
    pub fn list(&self) -> Vec<Record> {
        let mut all: Vec<Record> = self.read().values().map(|k| current(k)).collect();
        all.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        all
    }

    pub fn get(&self, id: &str) -> Option<Record> {
        self.read().get(id).map(|k| current(k))
    }

    /// A new key for `new`; its secret is returned once and never kept.
    pub fn create(&self, new: NewKey, now_ms: i64) -> Result<(Record, String), KeyError> {
        check_name("tenant", &new.tenant)?;
        if let Some(t) = &new.team {
            check_name("team", t)?;
        }
        if new.models.len() > MAX_MODELS || new.models.iter().any(|m| m.is_empty() || m.len() > 256)
        {
            return Err(KeyError::Invalid(format!(
                "models: at most {MAX_MODELS} names, each 1 to 256 bytes"
            )));
        }
        if new.labels.len() > MAX_LABELS
            || new
                .labels
                .iter()
                .any(|(k, v)| k.is_empty() || k.len() > MAX_LABEL_KEY || v.len() > MAX_LABEL_VALUE)
        {
            return Err(KeyError::Invalid(format!(
                "labels: at most {MAX_LABELS}, each key 1 to {MAX_LABEL_KEY} bytes and value up to {MAX_LABEL_VALUE}"
            )));
        }
        if new.max_in_service == Some(0) {
            return Err(KeyError::Invalid(
                "max_in_service must be at least 1".into(),
            ));
        }
        let expires_ms = match &new.expires {
            Some(text) => {
                let d = humantime::parse_duration(text).map_err(|e| {
                    KeyError::Invalid(format!(
                        "expires `{text}` is not a duration (30d, 12h): {e}"
                    ))
                })?;
                if d.is_zero() {
                    return Err(KeyError::Invalid("expires must be more than 0".into()));
                }
                Some(now_ms.saturating_add(d.as_millis().min(i64::MAX as u128) as i64))
            }
            None => None,
        };
        if self.len() >= MAX_KEYS {
            return Err(KeyError::Invalid(format!(
                "slotgate keeps at most {MAX_KEYS} keys"
            )));
        }
        let minted = secret::mint().map_err(KeyError::Store)?;
        let record = Record {
            id: minted.id,
            tenant: new.tenant,
            team: new.team,
            models: new.models,
            priority: new.priority,
            max_in_service: new.max_in_service,
            labels: new.labels,
            created_ms: now_ms,
            expires_ms,
            revoked_ms: None,
            last_used_ms: None,
            digest: secret::hex(&secret::digest(minted.secret.as_bytes())),
            previous: None,
        };
        self.put(record.clone())?;
        Ok((record, minted.secret))
    }

    /// Revokes `id` at `now_ms` (again: no change).
    pub fn revoke(&self, id: &str, now_ms: i64) -> Result<Record, KeyError> {
        let mut record = self
            .get(id)
            .ok_or_else(|| KeyError::NotFound(id.to_owned()))?;
        if record.revoked_ms.is_none() {
            record.revoked_ms = Some(now_ms);
            self.put(record.clone())?;
        }
        Ok(record)
    }

    /// A new secret for `id`; the old one works for `grace` more.
    pub fn rotate(
        &self,
        id: &str,
        grace: Duration,
        now_ms: i64,
    ) -> Result<(Record, String), KeyError> {
        let mut record = self
            .get(id)
            .ok_or_else(|| KeyError::NotFound(id.to_owned()))?;
        if record.state(now_ms) != "active" {
            return Err(KeyError::Invalid(format!(
                "key {id} is {}: a rotation gives an active key a new secret",
                record.state(now_ms)
            )));
        }
        if grace > MAX_GRACE {
            return Err(KeyError::Invalid("grace: at most 30 days".into()));
        }
        // Its id stays: the new secret carries it.
        let text = secret::secret_for(id).map_err(KeyError::Store)?;
        record.previous = (!grace.is_zero()).then(|| Previous {
            digest: record.digest.clone(),
            until_ms: now_ms.saturating_add(grace.as_millis() as i64),
        });
        record.digest = secret::hex(&secret::digest(text.as_bytes()));
        self.put(record.clone())?;
        Ok((record, text))
    }

    /// Writes last uses that moved by a minute or more; off the request path.
    pub fn write_last_used(&self) {
        let Some(store) = &self.store else { return };
        let moved: Vec<Record> = self
            .read()
            .values()
            .filter(|k| {
                let used = k.last_used.load(Ordering::Relaxed);
                used >= k.last_written.load(Ordering::Relaxed) + LAST_USED_STEP_MS
            })
            .map(|k| {
                k.last_written
                    .store(k.last_used.load(Ordering::Relaxed), Ordering::Relaxed);
                current(k)
            })
            .collect();
        if moved.is_empty() {
            return;
        }
        if let Err(e) = store.put_keys(&rows(&moved)) {
            tracing::warn!(error = %e, "cannot write keys' last use");
        }
    }

    /// Keeps `record` (durably first, when there is a store) and puts it in force.
    fn put(&self, record: Record) -> Result<(), KeyError> {
        let key = Key::of(record).map_err(KeyError::Store)?;
        if let Some(store) = &self.store {
            store
                .put_keys(&rows(std::slice::from_ref(&key.record)))
                .map_err(|e| KeyError::Store(e.to_string()))?;
        }
        self.write().insert(key.record.id.clone(), Arc::new(key));
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Key>>> {
        self.by_id
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<Key>>> {
        self.by_id
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Records as the store keeps them.
fn rows(records: &[Record]) -> Vec<(&str, Vec<u8>)> {
    records
        .iter()
        .map(|r| (r.id.as_str(), serde_json::to_vec(r).unwrap_or_default()))
        .collect()
}

/// A key's record with its last use as known now.
fn current(k: &Key) -> Record {
    let mut r = k.record.clone();
    let used = k.last_used.load(Ordering::Relaxed);
    if used > 0 {
        r.last_used_ms = Some(used as i64);
    }
    r
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    Invalid(String),
    #[error("no key {0}")]
    NotFound(String),
    #[error("the key could not be kept: {0}")]
    Store(String),
}

/// A tenant's or team's name (see `config::check_name`).
pub fn check_name(what: &str, name: &str) -> Result<(), KeyError> {
    crate::config::check_name(what, name).map_err(KeyError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(tenant: &str) -> NewKey {
        NewKey {
            tenant: tenant.into(),
            ..NewKey::default()
        }
    }

    #[test]
    fn a_created_key_is_let_in_and_others_are_not() {
        let keys = Keys::none();
        let (rec, secret) = keys.create(new("alice"), 1_000).unwrap();
        assert_eq!(
            keys.check(secret.as_bytes(), 2_000).unwrap().tenant(),
            "alice"
        );
        assert_eq!(keys.get(&rec.id).unwrap().last_used_ms, Some(2_000));
        let mut wrong = secret.clone().into_bytes();
        let last = wrong.len() - 1;
        wrong[last] = if wrong[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(keys.check(&wrong, 2_000).unwrap_err(), Refused::Unknown);
        assert_eq!(
            keys.check(b"sk-made-up", 2_000).unwrap_err(),
            Refused::Unknown
        );
        assert!(!serde_json::to_string(&keys.list())
            .unwrap()
            .contains(&secret));
    }

    #[test]
    fn revoked_and_expired_keys_are_refused() {
        let keys = Keys::none();
        let (a, sa) = keys.create(new("a"), 0).unwrap();
        let mut n = new("b");
        n.expires = Some("1h".into());
        let (_, sb) = keys.create(n, 0).unwrap();
        keys.revoke(&a.id, 10).unwrap();
        assert_eq!(keys.check(sa.as_bytes(), 11).unwrap_err(), Refused::Revoked);
        assert!(keys.check(sb.as_bytes(), 3_599_999).is_ok());
        assert_eq!(
            keys.check(sb.as_bytes(), 3_600_000).unwrap_err(),
            Refused::Expired
        );
    }

    #[test]
    fn a_rotated_key_keeps_its_old_secret_for_the_grace() {
        let keys = Keys::none();
        let (rec, old) = keys.create(new("a"), 0).unwrap();
        let (after, fresh) = keys
            .rotate(&rec.id, Duration::from_secs(60), 1_000)
            .unwrap();
        assert_eq!(after.id, rec.id);
        assert_ne!(old, fresh);
        assert!(keys.check(fresh.as_bytes(), 2_000).is_ok());
        assert!(keys.check(old.as_bytes(), 60_999).is_ok());
        assert_eq!(
            keys.check(old.as_bytes(), 61_000).unwrap_err(),
            Refused::Unknown
        );
        let (_, third) = keys.rotate(&rec.id, Duration::ZERO, 70_000).unwrap();
        assert!(keys.check(fresh.as_bytes(), 70_001).is_err());
        assert!(keys.check(third.as_bytes(), 70_001).is_ok());
    }

    #[test]
    fn names_are_checked() {
        let keys = Keys::none();
        for bad in [
            "",
            "a b",
            "a:b",
            "anonymous",
            "x\n",
            "sk-live-123",
            "sgk_x",
            &"a".repeat(65),
        ] {
            assert!(keys.create(new(bad), 0).is_err(), "{bad:?}");
        }
        let mut n = new("ok");
        n.expires = Some("soon".into());
        assert!(keys.create(n, 0).is_err());
        assert!(keys.is_empty());
    }
}
