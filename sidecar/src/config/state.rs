//! The `[state]` table and `--state-*` flags: where policy budgets live (this process, kept on disk
//! under `state.dir`, or a fleet store on Redis/Valkey), checked.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::table::{millis, secs, Keys, Kind, Plain, Positive};
use super::values::Dur;
use super::{invalid, ConfigError, Settings};

/// The `[state]` table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StateTable {
    /// `memory` or `redis` (see `--state-backend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<StateBackend>,
    /// See `--state-redis-url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// See `--state-prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// See `--state-fleet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// See `--state-on-unavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unavailable: Option<OnUnavailable>,
    /// See `--state-fetch-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_timeout: Option<Dur>,
    /// See `--state-lease-horizon`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_horizon: Option<Dur>,
    /// See `--state-lease-max-share`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_max_share: Option<f64>,
    /// See `--state-lease-idle`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_idle: Option<Dur>,
    /// See `--state-lease-max-age`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_max_age: Option<Dur>,
    /// See `--state-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<StateDir>,
    /// See `--state-flush-interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_interval: Option<Dur>,
    /// See `--state-usage-retention-days`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_retention_days: Option<u32>,
    /// See `--state-usage-zone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_zone: Option<Zone>,
}

/// A time zone by its IANA name (`Europe/Berlin`, `UTC`).
#[derive(Debug, Clone, PartialEq)]
pub struct Zone(pub jiff::tz::TimeZone, String);

impl Zone {
    pub fn utc() -> Zone {
        Zone(jiff::tz::TimeZone::UTC, "UTC".into())
    }
}

impl std::str::FromStr for Zone {
    type Err = String;
    fn from_str(s: &str) -> Result<Zone, String> {
        let name = s.trim();
        jiff::tz::TimeZone::get(name)
            .map(|tz| Zone(tz, name.to_owned()))
            .map_err(|_| format!("`{name}` is not a time zone (an IANA name: UTC, Europe/Berlin)"))
    }
}

impl std::fmt::Display for Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}
string_serde!(Zone);

impl StateTable {
    /// Keys set in `self` (the flags) win; the rest come from `lower` (the file).
    pub(super) fn over(self, lower: StateTable) -> StateTable {
        StateTable {
            backend: self.backend.or(lower.backend),
            redis_url: self.redis_url.or(lower.redis_url),
            prefix: self.prefix.or(lower.prefix),
            fleet: self.fleet.or(lower.fleet),
            on_unavailable: self.on_unavailable.or(lower.on_unavailable),
            fetch_timeout: self.fetch_timeout.or(lower.fetch_timeout),
            lease_horizon: self.lease_horizon.or(lower.lease_horizon),
            lease_max_share: self.lease_max_share.or(lower.lease_max_share),
            lease_idle: self.lease_idle.or(lower.lease_idle),
            lease_max_age: self.lease_max_age.or(lower.lease_max_age),
            dir: self.dir.or(lower.dir),
            flush_interval: self.flush_interval.or(lower.flush_interval),
            usage_retention_days: self.usage_retention_days.or(lower.usage_retention_days),
            usage_zone: self.usage_zone.or(lower.usage_zone),
        }
    }
}

/// Where policy budgets live, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct StateConfig {
    pub backend: StateBackend,
    /// Set when the backend is `redis`.
    pub redis_url: Option<String>,
    pub prefix: String,
    pub fleet: String,
    pub on_unavailable: OnUnavailable,
    /// The longest a take waits for the one synchronous fetch of a dry lease.
    pub fetch_timeout: Duration,
    /// How leases are sized and when they go back.
    pub lease: LeaseSettings,
    /// Where the memory backend keeps its budgets across restarts.
    pub dir: StateDir,
    /// How often changed budgets are written to disk: what a crash can lose at most.
    pub flush_interval: Duration,
    /// Days of the usage ledger kept.
    pub usage_retention_days: u32,
    /// The zone whose days the usage ledger's rows are.
    pub usage_zone: Zone,
}

/// How big a sidecar's lease of a fleet bucket grows and when it goes back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseSettings {
    /// A full lease covers this much of the recent demand.
    pub horizon: Duration,
    /// The most of a bucket's capacity one lease holds, in `(0, 1]`.
    pub max_share: f64,
    /// Unused for this long: given back.
    pub idle: Duration,
    /// Held for this long: given back.
    pub max_age: Duration,
}

/// What the table below gives when no layer sets a key.
impl Default for LeaseSettings {
    fn default() -> Self {
        <LeaseSettings as Keys<StateTable>>::read(&StateTable::default())
            .expect("the lease defaults are valid")
    }
}

// The `[state]` keys: their defaults and checks, and so their effective values (see `table`).
key_table! {
    StateConfig from StateTable, keys "state.", every key {
        backend: Plain = StateBackend::Memory;
        prefix: Name = "slotgate".to_owned();
        fleet: Name = "default".to_owned();
        on_unavailable: Plain = OnUnavailable::LocalShare;
        fetch_timeout: Positive = millis(5), unless |d| !(millis(1)..=secs(1)).contains(d) => format!(
            "`{}` is outside 1ms to 1s: a take waits this long on the request path",
            Dur(*d)
        );
        dir: Plain = StateDir::Auto;
        flush_interval: Positive = millis(100), unless |d| *d > secs(60)
            => "at most 60s: a crash loses the charges of up to one interval";
        usage_retention_days: Plain = 400, unless |n| *n == 0
            => "at least 1: the ledger keeps today's usage at least";
        usage_zone: Plain = Zone::utc();
    }
    groups {
        redis_url: RedisUrl [redis_url];
        lease: LeaseSettings [lease_horizon, lease_max_share, lease_idle, lease_max_age];
    }
}

key_table! {
    LeaseSettings from StateTable, keys "state." {
        lease_horizon => horizon: Positive = secs(1);
        lease_max_share => max_share: Plain = 0.1, unless |f| !(*f > 0.0 && *f <= 1.0)
            => format!("`{f}` must be a fraction of the capacity in (0, 1]");
        lease_idle => idle: Positive = secs(5);
        lease_max_age => max_age: Positive = secs(30);
    }
}

/// The `--state-*` flags over the `[state]` table; printed as the table.
impl Keys<Settings> for StateConfig {
    type Value = StateConfig;
    fn read(s: &Settings) -> Result<StateConfig, ConfigError> {
        let flags = StateTable {
            backend: s.state_backend,
            redis_url: s.state_redis_url.clone(),
            prefix: s.state_prefix.clone(),
            fleet: s.state_fleet.clone(),
            on_unavailable: s.state_on_unavailable,
            fetch_timeout: s.state_fetch_timeout,
            lease_horizon: s.state_lease_horizon,
            lease_max_share: s.state_lease_max_share,
            lease_idle: s.state_lease_idle,
            lease_max_age: s.state_lease_max_age,
            dir: s.state_dir.clone(),
            flush_interval: s.state_flush_interval,
            usage_retention_days: s.state_usage_retention_days,
            usage_zone: s.state_usage_zone.clone(),
        };
        let table = flags.over(s.state.clone().unwrap_or_default());
        let state = <StateConfig as Keys<StateTable>>::read(&table)?;
        if state.backend == StateBackend::Redis && state.redis_url.is_none() {
            return Err(invalid(
                "state.redis-url",
                "the redis backend needs the store's URL (redis://HOST:PORT, rediss://... or unix:///path/redis.sock)",
            ));
        }
        Ok(state)
    }
    fn write(v: &StateConfig, s: &mut Settings) {
        let mut table = StateTable::default();
        <StateConfig as Keys<StateTable>>::write(v, &mut table);
        s.state = Some(table);
    }
}

/// The store's URL, checked; empty is unset.
struct RedisUrl;

impl Keys<StateTable> for RedisUrl {
    type Value = Option<String>;
    fn read(t: &StateTable) -> Result<Option<String>, ConfigError> {
        let url = t.redis_url.clone().filter(|u| !u.is_empty());
        if let Some(url) = &url {
            redis::Client::open(url.as_str())
                .map_err(|e| invalid("state.redis-url", format!("`{url}`: {e}")))?;
        }
        Ok(url)
    }
    fn write(v: &Option<String>, t: &mut StateTable) {
        t.redis_url = v.clone();
    }
}

/// A name in the store's keys: not empty, no white space.
struct Name;

impl Kind<String, String> for Name {
    fn value(s: String) -> Result<String, String> {
        match s.is_empty() || s.contains(char::is_whitespace) {
            true => Err(format!("`{s}` must be a non-empty name without spaces")),
            false => Ok(s),
        }
    }
    fn setting(v: &String) -> Option<String> {
        Some(v.clone())
    }
}

/// Where the memory backend's budgets are kept on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateDir {
    /// systemd's `$STATE_DIRECTORY` (a unit is one instance), else a directory of this instance's
    /// own, named after its first listen address, in `$XDG_STATE_HOME/slotgate`,
    /// `~/.local/state/slotgate` or `/var/lib/slotgate` (see [`StateDir::resolve`]).
    Auto,
    /// Nowhere: budgets live in memory and a restart forgets them.
    Off,
    Dir(PathBuf),
}

impl StateDir {
    /// The directory, `None` when off. `auto` gives every instance on a host a directory of its
    /// own, the same across its restarts: two sidecars (one per model process) never share one.
    pub fn resolve(&self, first_listen: &str) -> Option<PathBuf> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        match self {
            StateDir::Off => None,
            StateDir::Dir(p) => Some(p.clone()),
            StateDir::Auto => Some(if let Some(dirs) = env("STATE_DIRECTORY") {
                // systemd's StateDirectory=: the first, when it names several.
                let first = dirs
                    .to_string_lossy()
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .to_owned();
                PathBuf::from(first)
            } else {
                let base = if let Some(x) = env("XDG_STATE_HOME") {
                    PathBuf::from(x).join("slotgate")
                } else if let Some(home) = env("HOME") {
                    PathBuf::from(home).join(".local/state/slotgate")
                } else {
                    PathBuf::from("/var/lib/slotgate")
                };
                base.join(instance_name(first_listen))
            }),
        }
    }
}

/// A directory name for the instance listening first at `listen`: `unix:/run/a.sock` is
/// `unix-run-a.sock`, `tcp:127.0.0.1:8081` is `tcp-127.0.0.1-8081`.
fn instance_name(listen: &str) -> String {
    let mut name = String::new();
    for c in listen.chars() {
        let keep = c.is_ascii_alphanumeric() || c == '.' || c == '_';
        let c = if keep { c } else { '-' };
        if !(c == '-' && name.ends_with('-')) {
            name.push(c);
        }
    }
    let name: String = name.trim_matches('-').chars().take(120).collect();
    if name.is_empty() {
        "default".into()
    } else {
        name
    }
}

impl FromStr for StateDir {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" => Err("give a directory, `auto` or `off`".into()),
            "auto" => Ok(StateDir::Auto),
            "off" => Ok(StateDir::Off),
            p => Ok(StateDir::Dir(PathBuf::from(p))),
        }
    }
}

impl fmt::Display for StateDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateDir::Auto => f.write_str("auto"),
            StateDir::Off => f.write_str("off"),
            StateDir::Dir(p) => write!(f, "{}", p.display()),
        }
    }
}

string_serde!(StateDir);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_instance_has_a_directory_named_after_its_listen_address() {
        assert_eq!(
            instance_name("unix:/run/slotgate/a.sock"),
            "unix-run-slotgate-a.sock"
        );
        assert_eq!(instance_name("tcp:127.0.0.1:8081"), "tcp-127.0.0.1-8081");
        assert_eq!(instance_name("tcp:[::1]:8081"), "tcp-1-8081");
        assert_eq!(instance_name(":::"), "default");
        assert_eq!(StateDir::Off.resolve("unix:/a"), None);
        let d = StateDir::Dir("/x".into());
        assert_eq!(d.resolve("unix:/a"), Some(PathBuf::from("/x")));
    }
}

/// Where policy budgets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateBackend {
    /// In each sidecar's memory.
    Memory,
    /// On Redis or Valkey, shared by the fleet.
    Redis,
}

impl FromStr for StateBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "memory" => Ok(StateBackend::Memory),
            "redis" => Ok(StateBackend::Redis),
            _ => Err(format!("`{s}` is not a state backend; use memory or redis")),
        }
    }
}

impl fmt::Display for StateBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateBackend::Memory => "memory",
            StateBackend::Redis => "redis",
        })
    }
}

string_serde!(StateBackend);

/// What a fleet budget does while the store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnavailable {
    /// Each sidecar enforces the capacity (and refill) divided by the live sidecars.
    LocalShare,
    Allow,
    Deny,
}

impl FromStr for OnUnavailable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local-share" => Ok(OnUnavailable::LocalShare),
            "allow" => Ok(OnUnavailable::Allow),
            "deny" => Ok(OnUnavailable::Deny),
            _ => Err(format!(
                "`{s}` is not a failure mode; use local-share, allow or deny"
            )),
        }
    }
}

impl fmt::Display for OnUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnUnavailable::LocalShare => "local-share",
            OnUnavailable::Allow => "allow",
            OnUnavailable::Deny => "deny",
        })
    }
}

string_serde!(OnUnavailable);
