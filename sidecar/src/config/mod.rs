//! Configuration: one set of keys read from flags, `SLOTGATE_*` variables and a TOML file, merged and
//! validated once into an immutable [`Config`].
//!
//! `settings` declares every key (flags, env, TOML); `values` their types; `policy` and `state` the
//! policy chain and the budgets' store; this file applies the defaults and checks each value;
//! `launch` reads llama-server's own command line.

/// Implements `Display` + `FromStr` based serde (as a string) for a value type.
macro_rules! string_serde {
    ($ty:ty) => {
        impl ::serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = <$crate::config::StringOrInt as ::serde::Deserialize>::deserialize(d)?;
                raw.0.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// Lets TOML write `max-body = 1048576` as well as `max-body = "1MiB"`.
pub(crate) struct StringOrInt(String);

impl<'de> serde::Deserialize<'de> for StringOrInt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i64),
        }
        Ok(StringOrInt(
            match <Raw as serde::Deserialize>::deserialize(d)? {
                Raw::S(s) => s,
                Raw::I(i) => i.to_string(),
            },
        ))
    }
}

pub mod admin;
pub mod launch;
pub mod policy;
pub mod settings;
pub mod state;
pub mod tenants;
#[cfg(test)]
mod tests;
pub mod values;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use admin::*;
pub use policy::*;
pub use settings::*;
pub use state::*;
pub use tenants::*;
pub use values::*;

/// The validated, effective configuration. Built once; never mutated.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: Vec<ListenAddr>,
    pub socket_mode: u32,
    pub upstream: UpstreamAddr,
    pub upstream_api_key_file: Option<PathBuf>,
    /// The key read from `upstream_api_key_file`, or (`slotgate wrap`) from the child's command line.
    pub upstream_api_key: Option<Secret>,
    /// The llama-server command line `slotgate wrap` runs (not a setting).
    pub launch: Option<crate::config::launch::Launch>,
    pub forward_host_endpoints: bool,
    pub admin_listen: AdminAddr,
    /// Who may use the admin listener, and where its audit lines go.
    pub admin: AdminConfig,
    pub slots: Slots,
    pub kv_pool: KvPool,
    pub queue_depth: usize,
    pub queue_timeout: Duration,
    pub trust_client_priority: bool,
    /// One priority level gained per this much waiting; `None` when off.
    pub priority_aging: Option<Duration>,
    /// Fraction of the queue one tenant may hold, in `(0, 1]`; 1 is no limit.
    pub tenant_queue_share: f64,
    /// Per-tenant concurrency caps, and what a request at its tenant's cap gets.
    pub tenant_caps: TenantCaps,
    pub max_body: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// `None` when the guard is off.
    pub client_stall_timeout: Option<Duration>,
    pub upstream_idle_timeout: Option<Duration>,
    pub upstream_first_byte_timeout: Option<Duration>,
    /// Non-streamed generation requests may reuse idle upstream connections.
    pub upstream_reuse_connections: bool,
    /// llama-server's `/metrics` is appended to the admin `/metrics`.
    pub upstream_metrics: bool,
    /// In front of a router: whether its models take turns (see `router::turns`).
    pub model_turns: ModelTurns,
    pub reject_doomed_waits: bool,
    /// Requests of this priority or less urgent may be shed for more urgent ones; `None`: off.
    pub sheddable_priority: Option<i64>,
    /// The status a policy's 429 denial is sent with (429 unless configured).
    pub policy_denial_status: u16,
    pub max_connections: usize,
    pub drain_timeout: Duration,
    pub health_interval: Duration,
    /// `wrap`: failed starts in a row before giving up (0: never).
    pub wrap_start_limit: u32,
    pub connect_timeout: Duration,
    pub log_format: LogFormat,
    /// How prompt tokens are counted.
    pub tokenizer: Tokenizer,
    /// Count every generation request before the chain, not only those that wait.
    pub count_first: bool,
    /// Poll interval for policy file changes; `None` when off.
    pub policy_watch: Option<Duration>,
    /// On-disk cache of compiled policy modules.
    pub policy_cache_dir: Option<PathBuf>,
    /// Where policy budgets live.
    pub state: StateConfig,
    /// The policy chain, in evaluation order (file entries first, then `--policy` flags).
    pub policies: Vec<PolicySpec>,
    /// Per-model overrides in front of llama-server's router, by the name the file gives.
    pub models: std::collections::BTreeMap<String, ModelOverride>,
    /// Overload bands (`[bands.NAME]`), by their lowest priority.
    pub bands: Vec<BandSpec>,
}

/// One overload band as configured (`[bands.NAME]`; see `admission::bands`).
#[derive(Debug, Clone, PartialEq)]
pub struct BandSpec {
    pub name: String,
    /// Both ends included.
    pub priorities: (i64, i64),
    pub slots: Option<f64>,
    pub queue: Option<f64>,
}

/// What one model behind llama-server's router has of its own (`[models."NAME"]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelOverride {
    pub slots: Option<usize>,
    pub queue_depth: Option<usize>,
    pub queue_timeout: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("invalid config file {0}: {1}")]
    Parse(PathBuf, String),
    #[error("invalid setting `{key}`: {reason}")]
    Invalid { key: &'static str, reason: String },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl Config {
    /// Applies defaults and checks every value.
    pub fn from_settings(s: Settings) -> Result<Config, ConfigError> {
        let admin = AdminConfig::from_settings(&s)?;
        let listen = s.listen.unwrap_or_else(|| {
            vec![ListenAddr::Unix(PathBuf::from(
                "/run/slotgate/slotgate.sock",
            ))]
        });
        if listen.is_empty() {
            return Err(invalid("listen", "at least one listen address is required"));
        }
        let slots = s.slots.unwrap_or(Slots::Auto);
        if slots == Slots::Fixed(0) {
            return Err(invalid("slots", "must be at least 1 (or auto)"));
        }
        let max_connections = s.max_connections.unwrap_or(1024);
        if max_connections == 0 {
            return Err(invalid("max-connections", "must be at least 1"));
        }
        let max_body = s.max_body.map_or(8 << 20, |b| b.0);
        if max_body == 0 {
            return Err(invalid("max-body", "must be at least 1 byte"));
        }
        let tenant_queue_share = s.tenant_queue_share.unwrap_or(0.5);
        if !(tenant_queue_share > 0.0 && tenant_queue_share <= 1.0) {
            return Err(invalid(
                "tenant-queue-share",
                format!(
                    "{tenant_queue_share} is not a fraction in (0, 1]; 1.0 turns the limit off"
                ),
            ));
        }
        let policy_denial_status = s.policy_denial_status.unwrap_or(429);
        if !(400..=499).contains(&policy_denial_status) {
            return Err(invalid(
                "policy-denial-status",
                format!("{policy_denial_status} is not a client-error status (400 to 499)"),
            ));
        }
        let positive = |key: &'static str, d: Option<Dur>, default: Duration| match d {
            Some(Dur(d)) if d.is_zero() => Err(invalid(key, "must be longer than zero")),
            Some(Dur(d)) => Ok(d),
            None => Ok(default),
        };
        Ok(Config {
            admin,
            listen,
            socket_mode: s.socket_mode.map_or(0o660, |m| m.0),
            upstream: s
                .upstream
                .unwrap_or_else(|| UpstreamAddr::Tcp("127.0.0.1:8080".into())),
            upstream_api_key: match &s.upstream_api_key_file {
                Some(path) => Some(read_key(path)?),
                None => None,
            },
            upstream_api_key_file: s.upstream_api_key_file,
            launch: None,
            forward_host_endpoints: s.forward_host_endpoints.unwrap_or(false),
            admin_listen: s
                .admin_listen
                .unwrap_or(AdminAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 9464)))),
            slots,
            kv_pool: match s.kv_pool {
                Some(KvPool::Tokens(0)) => {
                    return Err(invalid(
                        "kv-pool",
                        "a pool of 0 tokens holds nothing; use auto, per-slot or a size",
                    ))
                }
                other => other.unwrap_or(KvPool::Auto),
            },
            queue_depth: s.queue_depth.unwrap_or(8),
            queue_timeout: positive("queue-timeout", s.queue_timeout, Duration::from_secs(60))?,
            trust_client_priority: s.trust_client_priority.unwrap_or(false),
            priority_aging: zero_is_off(s.priority_aging, Duration::from_secs(10)),
            tenant_queue_share,
            tenant_caps: TenantCaps::new(
                TenantTable {
                    max_in_service: s.tenant_max_in_service,
                    max_waiting: s.tenant_max_waiting,
                },
                s.tenants.unwrap_or_default(),
                s.tenant_over_cap.unwrap_or_default(),
            )?,
            max_body,
            header_timeout: positive("header-timeout", s.header_timeout, Duration::from_secs(10))?,
            body_timeout: positive("body-timeout", s.body_timeout, Duration::from_secs(30))?,
            client_stall_timeout: zero_is_off(s.client_stall_timeout, Duration::from_secs(30)),
            upstream_idle_timeout: zero_is_off(s.upstream_idle_timeout, Duration::from_secs(60)),
            upstream_first_byte_timeout: zero_is_off(
                s.upstream_first_byte_timeout,
                Duration::from_secs(600),
            ),
            upstream_reuse_connections: s.upstream_reuse_connections.unwrap_or(true),
            upstream_metrics: s.upstream_metrics.unwrap_or(true),
            model_turns: s.model_turns.unwrap_or_default(),
            reject_doomed_waits: s.reject_doomed_waits.unwrap_or(true),
            sheddable_priority: s.sheddable_priority,
            policy_denial_status,
            max_connections,
            drain_timeout: s.drain_timeout.map_or(Duration::from_secs(30), |d| d.0),
            health_interval: positive(
                "health-interval",
                s.health_interval,
                Duration::from_secs(1),
            )?,
            connect_timeout: positive(
                "connect-timeout",
                s.connect_timeout,
                Duration::from_secs(2),
            )?,
            wrap_start_limit: s.wrap_start_limit.unwrap_or(5),
            log_format: s.log_format.unwrap_or(LogFormat::Text),
            tokenizer: s
                .cost_tokenizer
                .or(s.cost.as_ref().and_then(|c| c.tokenizer))
                .unwrap_or(Tokenizer::Upstream),
            count_first: s
                .cost_count_first
                .or(s.cost.as_ref().and_then(|c| c.count_first))
                .unwrap_or(false),
            policy_watch: zero_is_off(s.policy_watch, Duration::from_secs(2)),
            policy_cache_dir: s.policy_cache_dir,
            state: StateConfig::from_table(
                StateTable {
                    backend: s.state_backend,
                    redis_url: s.state_redis_url,
                    prefix: s.state_prefix,
                    fleet: s.state_fleet,
                    on_unavailable: s.state_on_unavailable,
                    fetch_timeout: s.state_fetch_timeout,
                    lease_horizon: s.state_lease_horizon,
                    lease_max_share: s.state_lease_max_share,
                    lease_idle: s.state_lease_idle,
                    lease_max_age: s.state_lease_max_age,
                    dir: s.state_dir,
                    flush_interval: s.state_flush_interval,
                    usage_retention_days: s.state_usage_retention_days,
                }
                .over(s.state.unwrap_or_default()),
            )?,
            policies: policy_chain(s.policy, s.policy_flags)?,
            models: model_overrides(s.models.unwrap_or_default())?,
            bands: bands_of(s.bands.unwrap_or_default())?,
        })
    }

    /// The effective settings, every key filled in, in the config file's own format.
    pub fn effective(&self) -> Settings {
        Settings {
            listen: Some(self.listen.clone()),
            socket_mode: Some(SocketMode(self.socket_mode)),
            upstream: Some(self.upstream.clone()),
            upstream_api_key_file: self.upstream_api_key_file.clone(),
            forward_host_endpoints: Some(self.forward_host_endpoints),
            admin_listen: Some(self.admin_listen.clone()),
            admin_token_file: self.admin.token_file.clone(),
            admin_read_token_file: self.admin.read_token_file.clone(),
            admin_open_metrics: Some(self.admin.open_metrics),
            admin_socket_mode: Some(SocketMode(self.admin.socket_mode)),
            admin_allow_uids: (!self.admin.allow_uids.is_empty())
                .then(|| Uids(self.admin.allow_uids.clone())),
            audit_log: Some(self.admin.audit_log.clone()),
            slots: Some(self.slots),
            kv_pool: Some(self.kv_pool),
            queue_depth: Some(self.queue_depth),
            queue_timeout: Some(Dur(self.queue_timeout)),
            trust_client_priority: Some(self.trust_client_priority),
            priority_aging: Some(off_is_zero(self.priority_aging)),
            tenant_queue_share: Some(self.tenant_queue_share),
            tenant_max_in_service: self.tenant_caps.default.max_in_service,
            tenant_max_waiting: self.tenant_caps.default.max_waiting,
            tenant_over_cap: Some(self.tenant_caps.over_cap),
            tenants: (!self.tenant_caps.tenants.is_empty())
                .then(|| self.tenant_caps.tenants.clone()),
            max_body: Some(ByteSize(self.max_body)),
            header_timeout: Some(Dur(self.header_timeout)),
            body_timeout: Some(Dur(self.body_timeout)),
            client_stall_timeout: Some(off_is_zero(self.client_stall_timeout)),
            upstream_idle_timeout: Some(off_is_zero(self.upstream_idle_timeout)),
            upstream_first_byte_timeout: Some(off_is_zero(self.upstream_first_byte_timeout)),
            upstream_reuse_connections: Some(self.upstream_reuse_connections),
            upstream_metrics: Some(self.upstream_metrics),
            model_turns: Some(self.model_turns),
            reject_doomed_waits: Some(self.reject_doomed_waits),
            sheddable_priority: self.sheddable_priority,
            policy_denial_status: Some(self.policy_denial_status),
            max_connections: Some(self.max_connections),
            drain_timeout: Some(Dur(self.drain_timeout)),
            health_interval: Some(Dur(self.health_interval)),
            connect_timeout: Some(Dur(self.connect_timeout)),
            wrap_start_limit: Some(self.wrap_start_limit),
            log_format: Some(self.log_format),
            cost_tokenizer: None,
            cost_count_first: None,
            cost: Some(CostTable {
                tokenizer: Some(self.tokenizer),
                count_first: Some(self.count_first),
            }),
            state_backend: None,
            state_redis_url: None,
            state_prefix: None,
            state_fleet: None,
            state_on_unavailable: None,
            state_fetch_timeout: None,
            state_lease_horizon: None,
            state_lease_max_share: None,
            state_lease_idle: None,
            state_lease_max_age: None,
            state_dir: None,
            state_flush_interval: None,
            state_usage_retention_days: None,
            state: Some(self.state.table()),
            policy_watch: Some(off_is_zero(self.policy_watch)),
            policy_cache_dir: self.policy_cache_dir.clone(),
            policy_paths: None,
            policy_settings: None,
            policy_flags: None,
            policy: (!self.policies.is_empty()).then(|| self.policies.clone()),
            bands: (!self.bands.is_empty()).then(|| {
                self.bands
                    .iter()
                    .map(|b| {
                        let table = BandTable {
                            priorities: [b.priorities.0, b.priorities.1],
                            slots: b.slots,
                            queue: b.queue,
                        };
                        (b.name.clone(), table)
                    })
                    .collect()
            }),
            models: (!self.models.is_empty()).then(|| {
                self.models
                    .iter()
                    .map(|(name, o)| {
                        let table = ModelTable {
                            slots: o.slots,
                            queue_depth: o.queue_depth,
                            queue_timeout: o.queue_timeout.map(Dur),
                        };
                        (name.clone(), table)
                    })
                    .collect()
            }),
        }
    }
}

/// The `[bands.NAME]` tables, checked: a range each, not overlapping another; shares in (0, 1].
fn bands_of(
    tables: std::collections::BTreeMap<String, BandTable>,
) -> Result<Vec<BandSpec>, ConfigError> {
    let mut bands = Vec::new();
    for (name, t) in tables {
        let [lo, hi] = t.priorities;
        if lo > hi {
            return Err(invalid(
                "bands.priorities",
                format!("band `{name}`: [{lo}, {hi}] is no range; give [lowest, highest]"),
            ));
        }
        for (what, share) in [("bands.slots", t.slots), ("bands.queue", t.queue)] {
            if let Some(v) = share.filter(|v| !(*v > 0.0 && *v <= 1.0)) {
                return Err(invalid(
                    what,
                    format!("band `{name}`: {v} is not a share in (0, 1]"),
                ));
            }
        }
        if t.slots.is_none() && t.queue.is_none() {
            return Err(invalid(
                "bands",
                format!("band `{name}`: limits nothing; give `slots`, `queue` or both"),
            ));
        }
        bands.push(BandSpec {
            name,
            priorities: (lo, hi),
            slots: t.slots,
            queue: t.queue,
        });
    }
    bands.sort_by_key(|b| b.priorities.0);
    for pair in bands.windows(2) {
        if pair[1].priorities.0 <= pair[0].priorities.1 {
            return Err(invalid(
                "bands.priorities",
                format!(
                    "bands `{}` and `{}` overlap: a priority belongs to one band",
                    pair[0].name, pair[1].name
                ),
            ));
        }
    }
    Ok(bands)
}

/// The `[models."NAME"]` tables, checked.
fn model_overrides(
    tables: std::collections::BTreeMap<String, ModelTable>,
) -> Result<std::collections::BTreeMap<String, ModelOverride>, ConfigError> {
    tables
        .into_iter()
        .map(|(name, t)| {
            if t.slots == Some(0) {
                return Err(invalid(
                    "models.slots",
                    format!("model `{name}`: must be at least 1"),
                ));
            }
            if t.queue_timeout.is_some_and(|d| d.0.is_zero()) {
                return Err(invalid(
                    "models.queue-timeout",
                    format!("model `{name}`: must be longer than zero"),
                ));
            }
            let o = ModelOverride {
                slots: t.slots,
                queue_depth: t.queue_depth,
                queue_timeout: t.queue_timeout.map(|d| d.0),
            };
            Ok((name, o))
        })
        .collect()
}

/// The key of an API key file, read as llama-server reads its `--api-key-file`.
fn read_key(path: &Path) -> Result<Secret, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        invalid(
            "upstream-api-key-file",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let key = crate::config::launch::first_key(&text).ok_or_else(|| {
        invalid(
            "upstream-api-key-file",
            format!(
                "{} holds no key (one per line; lines starting with # are comments)",
                path.display()
            ),
        )
    })?;
    if http::HeaderValue::try_from(format!("Bearer {key}")).is_err() {
        return Err(invalid(
            "upstream-api-key-file",
            format!(
                "the key in {} holds control bytes an HTTP header cannot carry",
                path.display()
            ),
        ));
    }
    Ok(Secret(key))
}

/// A duration where `0s` means off; unset means `default`.
fn zero_is_off(d: Option<Dur>, default: Duration) -> Option<Duration> {
    match d {
        Some(Dur(d)) if d.is_zero() => None,
        Some(Dur(d)) => Some(d),
        None => Some(default),
    }
}

fn off_is_zero(d: Option<Duration>) -> Dur {
    Dur(d.unwrap_or(Duration::ZERO))
}

impl Config {
    /// The most waiters one tenant may hold: `ceil(share * queue-depth)`, at least 1; `None` when the
    /// share is 1 (off) or there is no queue.
    pub fn tenant_queue_limit(&self) -> Option<usize> {
        if self.tenant_queue_share >= 1.0 || self.queue_depth == 0 {
            return None;
        }
        let limit = (self.tenant_queue_share * self.queue_depth as f64).ceil() as usize;
        Some(limit.clamp(1, self.queue_depth))
    }
}
