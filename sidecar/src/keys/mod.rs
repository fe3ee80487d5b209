//! Keys slotgate issues (docs/keys.md): who a caller is when `--client-auth keys` says slotgate
//! decides it. Each key names a tenant (and maybe a team), the models it may use, when it ends, and
//! may carry a priority, a concurrency cap and labels. Only a digest of its secret is kept
//! (`secret`), in the state store beside the quotas, durably at each change; lists show its id.
//!
//! A request's key is found by the id in its text and compared in constant time; a rotated key's
//! old secret works until its grace ends. A key that is unknown, revoked or expired is refused
//! before anything is counted or stored (`pipeline::caller`).

pub mod file;
pub mod secret;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Networks;
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
    /// The networks its TCP callers may come from; empty: any the listener allows.
    #[serde(default, skip_serializing_if = "Networks::is_any")]
    pub allow_from: Networks,
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
    /// Its version: one more at each change (create, revoke, rotate), so that of two copies (a
    /// fleet's sidecars) the later wins.
    #[serde(default)]
    pub rev: u64,
    /// Read from the keys file (`--keys-file`), not issued by the API: changed only there.
    #[serde(skip)]
    pub from_file: bool,
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
            "allow_from": (!self.allow_from.is_any()).then(|| self.allow_from.to_list()),
            "source": if self.from_file { "file" } else { "api" },
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
    /// The networks its callers may come from (`10.0.0.0/8,...`); none: any.
    #[serde(default)]
    pub allow_from: Networks,
}

/// Every key slotgate issued, kept in the state store, and those of the keys file.
pub struct Keys {
    by_id: RwLock<HashMap<String, Arc<Key>>>,
    store: Option<Arc<Store>>,
    /// The digest of the keys file's text as last read in.
    file_read: std::sync::Mutex<Option<[u8; 32]>>,
    /// With a fleet (`state.backend = redis`): the ids changed here and not yet shared.
    unshared: std::sync::Mutex<Option<HashSet<String>>>,
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
            file_read: std::sync::Mutex::new(None),
            unshared: std::sync::Mutex::new(None),
        })
    }

    /// Reads the keys file (`--keys-file`) and puts its keys in force in place of those read from
    /// it before: `Ok(Some(n))` when its text changed (`n` keys in it), `Ok(None)` when it is what
    /// was read last. A file that does not read changes nothing.
    pub fn load_file(&self, path: &Path, now_ms: i64) -> Result<Option<usize>, String> {
        let text = file::load(path)?;
        let digest = secret::digest(text.as_bytes());
        let mut read = self
            .file_read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *read == Some(digest) {
            return Ok(None);
        }
        let records = file::read(path, &text, now_ms)?;
        let mut by_id = self.write();
        if let Some(r) = records
            .iter()
            .find(|r| by_id.get(&r.id).is_some_and(|k| !k.record.from_file))
        {
            return Err(format!(
                "{}: key {} is also a key slotgate issued (`key create`); give the file's key another id",
                path.display(),
                r.id
            ));
        }
        let issued = by_id.values().filter(|k| !k.record.from_file).count();
        if issued + records.len() > MAX_KEYS {
            return Err(format!(
                "{}: slotgate keeps at most {MAX_KEYS} keys",
                path.display()
            ));
        }
        let mut before: HashMap<String, Arc<Key>> = HashMap::new();
        by_id.retain(|id, k| {
            if k.record.from_file {
                before.insert(id.clone(), k.clone());
            }
            !k.record.from_file
        });
        let n = records.len();
        for mut record in records {
            let old = before.get(&record.id);
            // A key read again keeps when it was first read, revoked and last used.
            if let Some(old) = old {
                record.created_ms = old.record.created_ms;
                if record.revoked_ms.is_some() {
                    record.revoked_ms = old.record.revoked_ms.or(record.revoked_ms);
                }
            }
            let key = Key::of(record)?;
            if let Some(old) = old {
                key.last_used
                    .store(old.last_used.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            by_id.insert(key.record.id.clone(), Arc::new(key));
        }
        *read = Some(digest);
        Ok(Some(n))
    }

    /// No keys and no store: what a slotgate that issues none holds.
    pub fn none() -> Keys {
        Keys {
            by_id: RwLock::new(HashMap::new()),
            store: None,
            file_read: std::sync::Mutex::new(None),
            unshared: std::sync::Mutex::new(None),
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
        if self.len() >= MAX_KEYS {
            return Err(KeyError::Invalid(format!(
                "slotgate keeps at most {MAX_KEYS} keys"
            )));
        }
        let (record, secret) = issue(new, now_ms)?;
        if self.get(&record.id).is_some() {
            return Err(KeyError::Store(
                "a fresh key's id is taken; try again".into(),
            ));
        }
        self.put(record.clone())?;
        Ok((record, secret))
    }

    /// Revokes `id` at `now_ms` (again: no change).
    pub fn revoke(&self, id: &str, now_ms: i64) -> Result<Record, KeyError> {
        let mut record = self
            .get(id)
            .ok_or_else(|| KeyError::NotFound(id.to_owned()))?;
        refuse_file_key(&record)?;
        if record.revoked_ms.is_none() {
            record.revoked_ms = Some(now_ms);
            record.rev += 1;
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
        refuse_file_key(&record)?;
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
        record.rev += 1;
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
                // The keys file's keys are the file's: their last use is kept in memory only.
                if k.record.from_file {
                    return false;
                }
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
        let id = key.record.id.clone();
        self.write().insert(id.clone(), Arc::new(key));
        if let Some(unshared) = self.unshared_set().as_mut() {
            unshared.insert(id);
        }
        Ok(())
    }

    /// From now on, shares its changes with a fleet (`fleet::Fleet::sync_keys`): every key issued
    /// here is to be shared, and each change after.
    pub fn share(&self) {
        let ids = self
            .read()
            .values()
            .filter(|k| !k.record.from_file)
            .map(|k| k.record.id.clone())
            .collect();
        *self.unshared_set() = Some(ids);
    }

    /// The keys changed here and not yet shared, taken (give back with [`Keys::not_shared`] what
    /// could not be).
    pub fn take_unshared(&self) -> Vec<Record> {
        let ids = match self.unshared_set().as_mut() {
            Some(set) => std::mem::take(set),
            None => return Vec::new(),
        };
        let by_id = self.read();
        ids.iter()
            .filter_map(|id| by_id.get(id).map(|k| k.record.clone()))
            .collect()
    }

    /// Shares these again at the next sync.
    pub fn not_shared(&self, ids: impl IntoIterator<Item = String>) {
        if let Some(set) = self.unshared_set().as_mut() {
            set.extend(ids);
        }
    }

    /// Shares every key issued here again (the fleet's store lost them).
    pub fn share_all_again(&self) {
        if self.unshared_set().is_some() {
            self.share();
        }
    }

    /// Keys another sidecar of the fleet shared. Each that is later than the copy here (revoked
    /// over not, else a higher `rev`) is put in force and kept in the store; each copy here that
    /// is later is shared again. Returns how many changed here.
    pub fn merge(&self, shared: Vec<Record>) -> usize {
        let mut changed = Vec::new();
        let mut ours_later = Vec::new();
        {
            let mut by_id = self.write();
            for mut record in shared {
                record.from_file = false;
                let here = by_id.get(&record.id);
                match here {
                    Some(k) if k.record.from_file => continue,
                    Some(k) if later(&k.record, &record) => {
                        ours_later.push(record.id.clone());
                        continue;
                    }
                    Some(k) if !later(&record, &k.record) => continue,
                    _ => {}
                }
                if by_id.len() >= MAX_KEYS && here.is_none() {
                    continue;
                }
                let Ok(key) = Key::of(record) else { continue };
                if let Some(old) = here {
                    key.last_used
                        .store(old.last_used.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                changed.push(key.record.clone());
                by_id.insert(key.record.id.clone(), Arc::new(key));
            }
        }
        self.not_shared(ours_later);
        if let (Some(store), false) = (&self.store, changed.is_empty()) {
            if let Err(e) = store.put_keys(&rows(&changed)) {
                tracing::warn!(error = %e, "cannot keep keys the fleet shared; they are in force until a restart");
            }
        }
        changed.len()
    }

    fn unshared_set(&self) -> std::sync::MutexGuard<'_, Option<HashSet<String>>> {
        self.unshared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// The keys, as the fleet shares them (`fleet::runtime`): records in JSON, without their last use.
impl crate::fleet::SharedKeys for Keys {
    fn take_unshared(&self) -> Vec<crate::fleet::KeyCopy> {
        Keys::take_unshared(self)
            .into_iter()
            .map(|mut r| {
                r.last_used_ms = None;
                crate::fleet::KeyCopy {
                    json: serde_json::to_string(&r).unwrap_or_default(),
                    revoked: r.revoked_ms.is_some(),
                    rev: r.rev,
                    id: r.id,
                }
            })
            .collect()
    }

    fn not_shared(&self, ids: Vec<String>) {
        Keys::not_shared(self, ids);
    }

    fn share_all_again(&self) {
        Keys::share_all_again(self);
    }

    fn merge(&self, copies: Vec<String>) -> usize {
        let records = copies
            .iter()
            .filter_map(|json| serde_json::from_str(json).ok())
            .collect();
        Keys::merge(self, records)
    }
}

/// Whether `a` is a later copy of a key than `b`: revoked over not, else the higher `rev`.
pub fn later(a: &Record, b: &Record) -> bool {
    (a.revoked_ms.is_some(), a.rev) > (b.revoked_ms.is_some(), b.rev)
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

/// A new key's record and its secret, kept nowhere yet: `key create` keeps it in the store,
/// `key mint` prints it for the keys file.
pub fn issue(new: NewKey, now_ms: i64) -> Result<(Record, String), KeyError> {
    check_fields(
        &new.tenant,
        new.team.as_deref(),
        &new.models,
        &new.labels,
        new.max_in_service,
    )?;
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
    let minted = secret::mint().map_err(KeyError::Store)?;
    let record = Record {
        id: minted.id,
        tenant: new.tenant,
        team: new.team,
        models: new.models,
        priority: new.priority,
        max_in_service: new.max_in_service,
        labels: new.labels,
        allow_from: new.allow_from,
        created_ms: now_ms,
        expires_ms,
        revoked_ms: None,
        last_used_ms: None,
        digest: secret::hex(&secret::digest(minted.secret.as_bytes())),
        previous: None,
        rev: 1,
        from_file: false,
    };
    Ok((record, minted.secret))
}

/// A key from the keys file changes only there.
fn refuse_file_key(record: &Record) -> Result<(), KeyError> {
    if record.from_file {
        return Err(KeyError::Invalid(format!(
            "key {} comes from the keys file: change it there (`revoked = true`, or a new entry)",
            record.id
        )));
    }
    Ok(())
}

/// What a key names, checked alike for `key create` and the keys file.
fn check_fields(
    tenant: &str,
    team: Option<&str>,
    models: &[String],
    labels: &BTreeMap<String, String>,
    max_in_service: Option<usize>,
) -> Result<(), KeyError> {
    check_name("tenant", tenant)?;
    if let Some(t) = team {
        check_name("team", t)?;
    }
    if models.len() > MAX_MODELS || models.iter().any(|m| m.is_empty() || m.len() > 256) {
        return Err(KeyError::Invalid(format!(
            "models: at most {MAX_MODELS} names, each 1 to 256 bytes"
        )));
    }
    if labels.len() > MAX_LABELS
        || labels
            .iter()
            .any(|(k, v)| k.is_empty() || k.len() > MAX_LABEL_KEY || v.len() > MAX_LABEL_VALUE)
    {
        return Err(KeyError::Invalid(format!(
            "labels: at most {MAX_LABELS}, each key 1 to {MAX_LABEL_KEY} bytes and value up to {MAX_LABEL_VALUE}"
        )));
    }
    if max_in_service == Some(0) {
        return Err(KeyError::Invalid(
            "max_in_service must be at least 1".into(),
        ));
    }
    Ok(())
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
    fn a_fleets_copies_meet_at_the_later_and_a_revocation_always_wins() {
        let a = Keys::none();
        let b = Keys::none();
        a.share();
        b.share();
        let (rec, secret) = a.create(new("alice"), 0).unwrap();
        let pushed = a.take_unshared();
        assert_eq!(pushed.len(), 1);
        assert!(a.take_unshared().is_empty(), "taken once");
        assert_eq!(b.merge(pushed.clone()), 1);
        assert!(b.check(secret.as_bytes(), 1).is_ok(), "b lets a's key in");
        assert_eq!(b.merge(pushed), 0, "the same copy again changes nothing");
        // a rotates twice (rev 3) while b revokes its rev-1 copy (rev 2): the revocation wins.
        let (_, s2) = a.rotate(&rec.id, Duration::ZERO, 10).unwrap();
        a.rotate(&rec.id, Duration::ZERO, 20).unwrap();
        let revoked = b.revoke(&rec.id, 15).unwrap();
        assert!(later(&revoked, &a.get(&rec.id).unwrap()));
        assert_eq!(a.merge(b.take_unshared()), 1);
        assert_eq!(a.check(s2.as_bytes(), 30).unwrap_err(), Refused::Unknown);
        assert_eq!(a.get(&rec.id).unwrap().state(30), "revoked");
        // b's own copy is later than a's rotations: merging them leaves b's revocation, and marks
        // nothing of a's as later.
        b.take_unshared();
        assert_eq!(b.merge(a.list()), 0);
        assert_eq!(b.get(&rec.id).unwrap().state(30), "revoked");
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
