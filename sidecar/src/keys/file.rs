//! The keys file (`--keys-file`, docs/keys.md#a-keys-file): keys an operator keeps with the rest of
//! the configuration, in git, by their digest. TOML, one `[[key]]` table per key; `slotgate key
//! mint` prints a secret and its entry. Re-read when it changes; a file that does not read is
//! refused whole and the keys read before stay in force.
//!
//! ```toml
//! [[key]]
//! id = "3f9c0a1b2c4d"
//! digest = "sha256:9e1c…"            # of the whole secret, `sgk_3f9c0a1b2c4d_…`
//! tenant = "alice"
//! team = "research"                  # the rest is optional
//! models = ["qwen2.5-7b"]
//! expires = "2027-03-01T00:00:00Z"
//! priority = 0
//! max_in_service = 2
//! allow_from = ["10.0.0.0/8"]
//! labels = { laptop = "alice-mbp" }
//! revoked = false
//! ```

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{check_fields, secret, Record};
use crate::config::Networks;

/// The most entries one file holds.
const MAX_ENTRIES: usize = 100_000;
/// The largest file read.
const MAX_BYTES: u64 = 64 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    key: Vec<Entry>,
}

/// One `[[key]]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub id: String,
    /// `sha256:` and the 64 hex digits of the secret's SHA-256.
    pub digest: String,
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_service: Option<usize>,
    #[serde(
        default,
        skip_serializing_if = "Networks::is_any",
        serialize_with = "Networks::as_list"
    )]
    pub allow_from: Networks,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

impl Entry {
    /// The entry of a key `key mint` made.
    pub fn of(record: &Record) -> Entry {
        Entry {
            id: record.id.clone(),
            digest: format!("sha256:{}", record.digest),
            tenant: record.tenant.clone(),
            team: record.team.clone(),
            models: record.models.clone(),
            expires: record.expires_ms.map(super::rfc3339),
            priority: record.priority,
            max_in_service: record.max_in_service,
            allow_from: record.allow_from.clone(),
            labels: record.labels.clone(),
            revoked: false,
        }
    }

    /// As the file holds it: one `[[key]]` table.
    pub fn to_toml(&self) -> String {
        #[derive(Serialize)]
        struct One<'a> {
            key: [&'a Entry; 1],
        }
        toml::to_string(&One { key: [self] }).unwrap_or_default()
    }

    /// The key it names, read at `read_ms` (when it counts as created, or revoked).
    fn record(self, read_ms: i64) -> Result<Record, String> {
        if !secret::is_id(&self.id) {
            return Err(format!(
                "id `{}` is not 12 lower-case hex digits (the part after `sgk_` of the secret)",
                self.id.escape_debug()
            ));
        }
        let digest = self
            .digest
            .strip_prefix("sha256:")
            .filter(|d| secret::unhex(d).is_some())
            .ok_or_else(|| {
                format!(
                    "key {}: digest must be `sha256:` and 64 hex digits (`slotgate key mint` prints it)",
                    self.id
                )
            })?
            .to_ascii_lowercase();
        check_fields(
            &self.tenant,
            self.team.as_deref(),
            &self.models,
            &self.labels,
            self.max_in_service,
        )
        .map_err(|e| format!("key {}: {e}", self.id))?;
        let expires_ms = match &self.expires {
            Some(t) => Some(
                t.parse::<jiff::Timestamp>()
                    .map_err(|e| {
                        format!(
                            "key {}: expires `{t}` is not an RFC 3339 time (2027-03-01T00:00:00Z): {e}",
                            self.id
                        )
                    })?
                    .as_millisecond(),
            ),
            None => None,
        };
        Ok(Record {
            id: self.id,
            tenant: self.tenant,
            team: self.team,
            models: self.models,
            priority: self.priority,
            max_in_service: self.max_in_service,
            labels: self.labels,
            allow_from: self.allow_from,
            created_ms: read_ms,
            expires_ms,
            revoked_ms: self.revoked.then_some(read_ms),
            last_used_ms: None,
            digest,
            previous: None,
            rev: 0,
            from_file: true,
        })
    }
}

/// The keys in the file at `path`, read at `now_ms`; the first problem, naming the file, else.
pub fn read(path: &Path, text: &str, now_ms: i64) -> Result<Vec<Record>, String> {
    let file: File = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
        match line {
            Some(n) => format!("{}: line {n}: {}", path.display(), e.message()),
            None => format!("{}: {}", path.display(), e.message()),
        }
    })?;
    if file.key.len() > MAX_ENTRIES {
        return Err(format!(
            "{}: at most {MAX_ENTRIES} keys in one file",
            path.display()
        ));
    }
    let mut seen = HashSet::new();
    let mut records = Vec::with_capacity(file.key.len());
    for entry in file.key {
        let record = entry
            .record(now_ms)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if !seen.insert(record.id.clone()) {
            return Err(format!(
                "{}: key {} is listed twice",
                path.display(),
                record.id
            ));
        }
        records.push(record);
    }
    Ok(records)
}

/// The file's text, when it is not too large to be a keys file.
pub fn load(path: &Path) -> Result<String, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if md.len() > MAX_BYTES {
        return Err(format!(
            "{}: larger than {} MiB",
            path.display(),
            MAX_BYTES >> 20
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{issue, NewKey};

    #[test]
    fn a_minted_entry_reads_back_as_its_key() {
        let (record, secret) = issue(
            NewKey {
                tenant: "alice".into(),
                team: Some("research".into()),
                expires: Some("30d".into()),
                allow_from: "10.0.0.0/8".parse().unwrap(),
                ..NewKey::default()
            },
            1_000,
        )
        .unwrap();
        let text = Entry::of(&record).to_toml();
        assert!(text.starts_with("[[key]]"), "{text}");
        assert!(!text.contains(&secret));
        let read = read(Path::new("keys.toml"), &text, 5).unwrap();
        assert_eq!(read.len(), 1);
        let r = &read[0];
        assert_eq!(
            (r.id.as_str(), r.tenant.as_str()),
            (record.id.as_str(), "alice")
        );
        assert_eq!(r.digest, record.digest);
        assert_eq!(r.expires_ms, record.expires_ms);
        assert_eq!(r.allow_from, record.allow_from);
        assert!(r.from_file && r.revoked_ms.is_none());
    }

    #[test]
    fn a_bad_entry_refuses_the_file_and_names_the_problem() {
        let ok = "[[key]]\nid = \"0123456789ab\"\ndigest = \"sha256:".to_owned()
            + &"a".repeat(64)
            + "\"\ntenant = \"bob\"\n";
        assert_eq!(read(Path::new("k"), &ok, 0).unwrap().len(), 1);
        for (bad, says) in [
            (ok.replace("bob", "b b"), "tenant"),
            (ok.replace("0123456789ab", "xyz"), "id"),
            (ok.replace("sha256:", "md5:"), "digest"),
            (ok.clone() + "colour = \"red\"\n", "unknown field"),
            (ok.clone() + &ok, "twice"),
            (ok.clone() + "expires = \"soon\"\n", "RFC 3339"),
            (ok.clone() + "allow_from = [\"10.0.0.0/99\"]\n", "network"),
        ] {
            let e = read(Path::new("k"), &bad, 0).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
