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

/// Source networks a caller may come from (`--allow-from`, a key's `allow_from`): TCP peers whose
/// address is in one of them. Empty: any. A Unix-socket peer is a local process, not a network
/// peer: no network list refuses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Networks(pub Vec<ipnet::IpNet>);

impl Networks {
    /// Whether a peer at `addr` (none: a Unix-socket peer) may call.
    pub fn allows(&self, addr: Option<std::net::IpAddr>) -> bool {
        let Some(addr) = addr else { return true };
        if self.0.is_empty() {
            return true;
        }
        // An IPv4 client on a dual-stack socket arrives as `::ffff:a.b.c.d`.
        let addr = match addr {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, std::net::IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|n| n.contains(&addr))
    }

    pub fn is_any(&self) -> bool {
        self.0.is_empty()
    }

    /// Each network as text.
    pub fn to_list(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }

    /// Serializes as a list of strings (a keys file's entry, a key as the API shows it).
    pub fn as_list<S: serde::Serializer>(n: &Networks, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(n.0.iter().map(ToString::to_string))
    }

    /// Each of `items`, a network (`10.0.0.0/8`, `2001:db8::/32`) or one address.
    pub fn parse_all<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Networks, String> {
        let mut nets = Vec::new();
        for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
            let net = match item.parse::<ipnet::IpNet>() {
                Ok(n) => n.trunc(),
                Err(_) => match item.parse::<std::net::IpAddr>() {
                    Ok(a) => ipnet::IpNet::from(a),
                    Err(_) => {
                        return Err(format!(
                            "`{}` is not a network (10.0.0.0/8, 2001:db8::/32) or an address",
                            item.escape_debug()
                        ))
                    }
                },
            };
            nets.push(net);
        }
        if nets.len() > 256 {
            return Err("at most 256 networks".into());
        }
        Ok(Networks(nets))
    }
}

impl FromStr for Networks {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim() == "any" {
            return Ok(Networks::default());
        }
        Networks::parse_all(s.split(','))
    }
}

impl fmt::Display for Networks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("any");
        }
        let list: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&list.join(","))
    }
}

/// Written as one comma-separated string (`any` for none), as the flag takes it; read from that or
/// from a list of strings.
impl serde::Serialize for Networks {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Networks {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Either {
            One(String),
            Many(Vec<String>),
        }
        match Either::deserialize(d)? {
            Either::One(s) => s.parse(),
            Either::Many(v) => Networks::parse_all(v.iter().map(String::as_str)),
        }
        .map_err(serde::de::Error::custom)
    }
}

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

    #[test]
    fn networks_read_print_back_and_match() {
        let n: Networks = "10.0.0.0/8, 192.168.1.7 ,2001:db8::/32".parse().unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8,192.168.1.7/32,2001:db8::/32");
        assert_eq!(n.to_string().parse::<Networks>().unwrap(), n);
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        assert!(n.allows(ip("10.1.2.3")));
        assert!(
            n.allows(ip("::ffff:10.1.2.3")),
            "a v4 peer on a dual-stack socket"
        );
        assert!(n.allows(ip("192.168.1.7")));
        assert!(!n.allows(ip("192.168.1.8")));
        assert!(n.allows(ip("2001:db8::1")));
        assert!(!n.allows(ip("127.0.0.1")));
        assert!(n.allows(None), "a Unix-socket peer is local");
        let any: Networks = "any".parse().unwrap();
        assert!(any.is_any() && any.allows(ip("8.8.8.8")) && any.to_string() == "any");
        assert_eq!(
            "10.1.2.3/8".parse::<Networks>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert!("10.0.0.0/33".parse::<Networks>().is_err());
        assert!("example.com".parse::<Networks>().is_err());
    }
}
