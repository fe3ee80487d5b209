//! The names of the policies' budgets, as types, and their one string form: the key column of the
//! state file's rows and the last part of a fleet bucket's Redis key. Both were written by earlier
//! versions in this same form, so they read back as they were.

use std::fmt::Write as _;
use std::sync::Arc;

use slotgate_sdk::calendar::Period;

/// A policy's own bucket or window: whose budgets (the policy's state key) and the key it chose.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BudgetKey {
    pub policy: Arc<str>,
    pub key: String,
}

/// A calendar quota: a policy's key counted over a period, in the period's canonical spelling
/// (`day`, never `day@UTC`; see [`canonical`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QuotaKey {
    pub policy: Arc<str>,
    pub key: String,
    pub period: String,
}

/// What a token bucket is kept for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BucketName {
    /// A policy's bucket (`bucket_take`).
    Bucket(BudgetKey),
    /// The window of a calendar quota that starts at `start_ms` (`quota_take`): a bucket with no
    /// refill whose capacity is the limit, so that each window starts whole.
    Quota { quota: QuotaKey, start_ms: i64 },
}

/// What the string form of a quota's window starts with. The control characters keep it apart
/// from the keys policies choose (the form `slotgate_sdk::calendar::quota_bucket` writes too).
const QUOTA_MARK: &str = "\u{1}quota\u{1}";

/// What parts a quota's field in the fleet's limits hash: policy, key and period.
const FIELD_SEP: char = '\u{1f}';

/// A period as quotas are kept under (`day@UTC` is `day`); one that does not parse, as it is.
pub fn canonical(period: &str) -> String {
    Period::parse(period).map_or_else(|_| period.to_owned(), |p| p.to_string())
}

impl BudgetKey {
    pub fn new(policy: &Arc<str>, key: &str) -> BudgetKey {
        BudgetKey {
            policy: policy.clone(),
            key: key.to_owned(),
        }
    }
}

impl QuotaKey {
    /// The quota of `policy`'s `key` over `period` (made canonical).
    pub fn new(policy: &Arc<str>, key: &str, period: &str) -> QuotaKey {
        QuotaKey {
            policy: policy.clone(),
            key: key.to_owned(),
            period: canonical(period),
        }
    }

    /// Its field in the fleet's limits hash: `policy U+001F key U+001F period`.
    pub fn field(&self) -> String {
        let QuotaKey {
            policy,
            key,
            period,
        } = self;
        format!("{policy}{FIELD_SEP}{key}{FIELD_SEP}{period}")
    }

    /// The quota a field of the fleet's limits hash names (see [`QuotaKey::field`]).
    pub fn from_field(field: &str) -> Option<QuotaKey> {
        let mut parts = field.splitn(3, FIELD_SEP);
        Some(QuotaKey {
            policy: Arc::from(parts.next()?),
            key: parts.next()?.to_owned(),
            period: parts.next()?.to_owned(),
        })
    }
}

impl BucketName {
    /// A policy's bucket.
    pub fn bucket(policy: &Arc<str>, key: &str) -> BucketName {
        BucketName::Bucket(BudgetKey::new(policy, key))
    }

    /// Whose budgets it is.
    pub fn policy(&self) -> &Arc<str> {
        match self {
            BucketName::Bucket(b) => &b.policy,
            BucketName::Quota { quota, .. } => &quota.policy,
        }
    }

    /// The quota and its window's start, when it is a quota's window.
    pub fn quota(&self) -> Option<(&QuotaKey, i64)> {
        match self {
            BucketName::Bucket(_) => None,
            BucketName::Quota { quota, start_ms } => Some((quota, *start_ms)),
        }
    }

    /// The string form of all but the policy: a policy's key as it is; a quota's window as
    /// `U+0001 quota U+0001 period U+0001 start U+0001 key`.
    pub fn stored_key(&self) -> String {
        match self {
            BucketName::Bucket(b) => b.key.clone(),
            BucketName::Quota { quota, start_ms } => {
                let mut s = String::with_capacity(quota.key.len() + quota.period.len() + 32);
                s.push_str(QUOTA_MARK);
                let _ = write!(s, "{}\u{1}{start_ms}\u{1}{}", quota.period, quota.key);
                s
            }
        }
    }

    /// The name that `policy` and a [`BucketName::stored_key`] stand for.
    pub fn from_stored(policy: &str, key: &str) -> BucketName {
        let policy: Arc<str> = Arc::from(policy);
        match parse_quota(key) {
            Some((key, period, start_ms)) => BucketName::Quota {
                quota: QuotaKey {
                    policy,
                    key: key.to_owned(),
                    period,
                },
                start_ms,
            },
            None => BucketName::Bucket(BudgetKey {
                policy,
                key: key.to_owned(),
            }),
        }
    }
}

/// The key, the canonical period and the window's start of a quota window's string form.
fn parse_quota(stored: &str) -> Option<(&str, String, i64)> {
    let rest = stored.strip_prefix(QUOTA_MARK)?;
    let mut parts = rest.splitn(3, '\u{1}');
    let period = Period::parse(parts.next()?).ok()?.to_string();
    let start = parts.next()?.parse().ok()?;
    Some((parts.next()?, period, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_from_their_string_form() {
        let p: Arc<str> = Arc::from("quota");
        let names = [
            BucketName::bucket(&p, "tenant-a"),
            BucketName::bucket(&p, ""),
            BucketName::bucket(&p, "a\u{1}b"),
            BucketName::Quota {
                quota: QuotaKey::new(&p, "tokens:alice", "day@Europe/Berlin"),
                start_ms: 1_767_222_000_000,
            },
            BucketName::Quota {
                quota: QuotaKey::new(&p, "team\u{1}a", "week"),
                start_ms: -5,
            },
        ];
        for name in names {
            assert_eq!(
                BucketName::from_stored(&p, &name.stored_key()),
                name,
                "{name:?}"
            );
        }
        let q = QuotaKey::new(&p, "k:1", "month@UTC");
        assert_eq!(q.period, "month");
        assert_eq!(QuotaKey::from_field(&q.field()), Some(q));
    }

    #[test]
    fn the_forms_earlier_versions_wrote_are_read() {
        // A quota window's key column in state.redb, and the tail of its fleet bucket's Redis
        // key, as slotgate wrote them before names were typed (and as the SDK still writes them).
        let old = "\u{1}quota\u{1}day@Europe/Paris\u{1}1767222000000\u{1}tokens:alice";
        let period = Period::parse("day@Europe/Paris").unwrap();
        assert_eq!(
            old,
            slotgate_sdk::calendar::quota_bucket("tokens:alice", &period, 1_767_222_000_000)
        );
        let name = BucketName::from_stored("quota", old);
        assert_eq!(
            name.quota(),
            Some((
                &QuotaKey {
                    policy: Arc::from("quota"),
                    key: "tokens:alice".into(),
                    period: "day@Europe/Paris".into(),
                },
                1_767_222_000_000
            ))
        );
        assert_eq!(name.stored_key(), old, "written back as it was");
        // A plain key, and the fleet's limits field.
        assert_eq!(
            BucketName::from_stored("budget", "sha256:ab"),
            BucketName::bucket(&Arc::from("budget"), "sha256:ab")
        );
        assert_eq!(
            QuotaKey::from_field("quota\u{1f}tokens:alice\u{1f}day"),
            Some(QuotaKey::new(&Arc::from("quota"), "tokens:alice", "day"))
        );
        assert_eq!(QuotaKey::from_field("quota\u{1f}tokens"), None);
    }
}
