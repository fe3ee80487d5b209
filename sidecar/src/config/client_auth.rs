//! Who may use slotgate (`--client-auth`, docs/keys.md), and the Unix peers known by their uid.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// How a caller is let in, before anything is counted, stored or queued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClientAuth {
    /// A key slotgate issued (`slotgate key create`): its tenant is the caller's name everywhere,
    /// and llama-server sees slotgate's own key, never the caller's.
    Keys,
    /// What llama-server lets in: when it runs with `--api-key`, a key it would refuse is refused
    /// here first; when it checks none, anyone. The default: it changes nothing for a deployment
    /// that has not asked for slotgate's keys, and nobody gets in through slotgate whom llama-server
    /// would refuse.
    #[default]
    Upstream,
    /// Anyone: every peer is trusted (a Unix socket only your own services reach).
    Open,
}

impl FromStr for ClientAuth {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "keys" => Ok(ClientAuth::Keys),
            "upstream" => Ok(ClientAuth::Upstream),
            "open" => Ok(ClientAuth::Open),
            _ => Err(format!(
                "`{s}` is not a client-auth mode; use keys, upstream or open"
            )),
        }
    }
}

impl fmt::Display for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClientAuth::Keys => "keys",
            ClientAuth::Upstream => "upstream",
            ClientAuth::Open => "open",
        })
    }
}
string_serde!(ClientAuth);

/// Unix peers let in without a key under `--client-auth keys`, each under a tenant's name:
/// `1000=alice,1001=bob`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UidTenants(pub BTreeMap<u32, String>);

impl FromStr for UidTenants {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        if s.trim() == "none" {
            return Ok(UidTenants(map));
        }
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (uid, tenant) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not UID=TENANT"))?;
            let uid = uid
                .trim()
                .parse::<u32>()
                .map_err(|_| format!("`{uid}` is not a numeric uid"))?;
            let tenant = tenant.trim();
            check_name("tenant", tenant)?;
            map.insert(uid, tenant.to_owned());
        }
        Ok(UidTenants(map))
    }
}

impl fmt::Display for UidTenants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let list: Vec<String> = self.0.iter().map(|(u, t)| format!("{u}={t}")).collect();
        f.write_str(&list.join(","))
    }
}
string_serde!(UidTenants);

/// A tenant's or team's name: what lists, logs, metrics and quota keys show, so 1 to 64 of
/// `A-Z a-z 0-9 . _ @ -`, and not a name slotgate gives callers itself (`anonymous`, `other`).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'))
        && !matches!(name, "anonymous" | "other" | "-")
        && slotgate_sdk::is_tenant_name(name);
    if ok {
        return Ok(());
    }
    Err(format!(
        "{what} `{}`: 1 to 64 of A-Z a-z 0-9 . _ @ - (not anonymous or other, nor a key's shape sk-, sgk_)",
        name.escape_debug()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_uids_read_and_print_back() {
        for m in ["keys", "upstream", "open"] {
            assert_eq!(m.parse::<ClientAuth>().unwrap().to_string(), m);
        }
        assert!("on".parse::<ClientAuth>().is_err());
        let u: UidTenants = "1000=alice, 1001=bob".parse().unwrap();
        assert_eq!(u.0.get(&1001).map(String::as_str), Some("bob"));
        assert_eq!(u.to_string().parse::<UidTenants>().unwrap(), u);
        assert!("1000".parse::<UidTenants>().is_err());
        let none: UidTenants = "none".parse().unwrap();
        assert_eq!(none.to_string().parse::<UidTenants>().unwrap(), none);
        assert!("x=alice".parse::<UidTenants>().is_err());
        assert!("1000=a:b".parse::<UidTenants>().is_err());
    }
}
