//! Configuration: one set of keys read from flags, `SLOTGATE_*` variables and a TOML file, merged and
//! validated once into an immutable [`Config`].
//!
//! `settings` declares every key (flags, env, TOML); `values` their types; `policy` and `state` the
//! policy chain and the budgets' store; the key table in this file holds each key's default and
//! checks (`table` makes both directions of it); `launch` reads llama-server's own command line.

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

#[macro_use]
mod table;

pub mod admin;
pub mod client_auth;
pub mod hints;
pub mod launch;
pub mod policy;
pub mod prices;
pub mod settings;
pub mod state;
pub mod tenants;
#[cfg(test)]
mod tests;
pub mod values;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use table::{secs, Bytes, Keys, Mode, NotASetting, Plain, Positive, Time, ZeroOff};

pub use admin::*;
pub use client_auth::*;
pub use hints::{LoadReport, TierPriorities};
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
    /// llama-server's admin routes the client listener forwards (`client-admin-routes`).
    pub client_admin_routes: Option<Vec<AdminRoutes>>,
    pub admin_listen: AdminAddr,
    /// Who may use the admin listener, and where its audit lines go.
    pub admin: AdminConfig,
    pub slots: Slots,
    pub kv_pool: KvPool,
    pub queue_depth: usize,
    pub queue_timeout: Duration,
    pub trust_client_priority: bool,
    /// The priority hint each `service_tier` stands for.
    pub service_tier_priority: TierPriorities,
    /// `x-slo-ttft-ms` is taken as the request's deadline.
    pub slo_ttft_deadline: bool,
    /// When responses carry an ORCA load report.
    pub load_report: LoadReport,
    /// One priority level gained per this much waiting; `None` when off.
    pub priority_aging: Option<Duration>,
    /// Fraction of the queue one tenant may hold, in `(0, 1]`; 1 is no limit.
    pub tenant_queue_share: f64,
    /// What a cached prompt token counts for in fair scheduling and token quotas (0 to 1).
    pub cached_token_weight: f64,
    /// Per-tenant concurrency caps, and what a request at its tenant's cap gets.
    pub tenant_caps: TenantCaps,
    /// What tokens cost (`[prices]`); empty: no cost is booked.
    pub prices: prices::Prices,
    pub max_body: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// `None` when the guard is off.
    pub client_stall_timeout: Option<Duration>,
    /// A waiting stream's comment interval; `None` when off.
    pub stream_keepalive: Option<Duration>,
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
    /// The status of an overload refusal on the Messages API (Anthropic's 529, or 429 or 503).
    pub messages_overload_status: u16,
    pub max_connections: usize,
    /// The most of `max_connections` one peer (address or uid) holds.
    pub max_connections_per_peer: usize,
    /// Refusals of callers a peer may have at once before the rest are sent late.
    pub refusal_burst: u32,
    /// Refusals a second a peer may have after its burst; 0: none is ever sent late.
    pub refusal_rate: f64,
    /// Who may use slotgate (docs/keys.md).
    pub client_auth: ClientAuth,
    /// Unix peers let in without a key under `keys`, by uid, as tenants.
    pub client_auth_uids: UidTenants,
    /// The networks TCP callers of the client listeners may come from (empty: any).
    pub allow_from: Networks,
    /// Keys kept in a file (hashes), re-read when it changes.
    pub keys_file: Option<PathBuf>,
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
    Invalid {
        key: Cow<'static, str>,
        reason: String,
    },
}

fn invalid(key: impl Into<Cow<'static, str>>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

impl Config {
    /// Applies defaults and checks every value (the table below).
    pub fn from_settings(s: Settings) -> Result<Config, ConfigError> {
        let config = <Config as Keys<Settings>>::read(&s)?;
        config
            .admin
            .check_listener(&config.admin_listen, s.admin_listen.is_none())?;
        Ok(config)
    }

    /// The effective settings, every key filled in, in the config file's own format.
    pub fn effective(&self) -> Settings {
        let mut s = Settings::default();
        <Config as Keys<Settings>>::write(self, &mut s);
        s
    }
}

// Each key of `Settings`: its default and check, and so its effective value (see `table`).
key_table! {
    Config from Settings, every key {
        listen: Plain = vec![ListenAddr::Unix("/run/slotgate/slotgate.sock".into())],
            unless |l| l.is_empty() => "at least one listen address is required";
        socket_mode: Mode = 0o660;
        upstream: Plain = UpstreamAddr::Tcp("127.0.0.1:8080".into());
        upstream_api_key_file: Plain;
        forward_host_endpoints: Plain = false;
        client_admin_routes: Plain;
        admin_listen: Plain = AdminAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 9464)));
        slots: Plain = Slots::Auto,
            unless |n| *n == Slots::Fixed(0) => "must be at least 1 (or auto)";
        kv_pool: Plain = KvPool::Auto, unless |p| *p == KvPool::Tokens(0)
            => "a pool of 0 tokens holds nothing; use auto, per-slot or a size";
        queue_depth: Plain = 8;
        queue_timeout: Positive = secs(60);
        trust_client_priority: Plain = false;
        service_tier_priority: Plain = TierPriorities::default();
        slo_ttft_deadline: Plain = false;
        load_report: Plain = LoadReport::Asked;
        priority_aging: ZeroOff = Some(secs(10));
        tenant_queue_share: Plain = 0.5, unless |f| !(*f > 0.0 && *f <= 1.0)
            => format!("{f} is not a fraction in (0, 1]; 1.0 turns the limit off");
        cached_token_weight: Plain = 1.0, unless |w| !(w.is_finite() && (0.0..=1.0).contains(w))
            => format!("{w} is not a weight from 0 (a cached token counts for nothing) to 1 (in full)");
        max_body: Bytes = 8 << 20, unless |b| *b == 0 => "must be at least 1 byte";
        header_timeout: Positive = secs(10);
        body_timeout: Positive = secs(30);
        client_stall_timeout: ZeroOff = Some(secs(30));
        stream_keepalive: ZeroOff = None;
        upstream_idle_timeout: ZeroOff = Some(secs(60));
        upstream_first_byte_timeout: ZeroOff = Some(secs(600));
        upstream_reuse_connections: Plain = true;
        upstream_metrics: Plain = true;
        model_turns: Plain = ModelTurns::Auto;
        reject_doomed_waits: Plain = true;
        sheddable_priority: Plain;
        messages_overload_status: Plain = 529, unless |s| ![529, 429, 503].contains(s)
            => format!("{s} is not an overload status; use 529 (Anthropic's), 429 or 503");
        policy_denial_status: Plain = 429, unless |s| !(400..=499).contains(s)
            => format!("{s} is not a client-error status (400 to 499)");
        max_connections: Plain = 1024, unless |n| *n == 0 => "must be at least 1";
        max_connections_per_peer: Plain = 256, unless |n| *n == 0 => "must be at least 1";
        refusal_burst: Plain = 100;
        refusal_rate: Plain = 20.0, unless |r| !(r.is_finite() && *r >= 0.0)
            => format!("{r} is not a rate (0 or more a second; 0 turns the delay off)");
        client_auth: Plain = ClientAuth::Upstream;
        client_auth_uids: Plain = UidTenants::default();
        allow_from: Plain = Networks::default();
        keys_file: Plain;
        drain_timeout: Time = secs(30);
        health_interval: Positive = secs(1);
        connect_timeout: Positive = secs(2);
        wrap_start_limit: Plain = 5;
        log_format: Plain = LogFormat::Text;
        policy_watch: ZeroOff = Some(secs(2));
        policy_cache_dir: Plain;
    }
    groups {
        admin: AdminConfig [admin_token_file, admin_read_token_file, admin_open_metrics,
            admin_socket_mode, admin_allow_uids, audit_log];
        upstream_api_key: UpstreamKey [];
        launch: NotASetting<launch::Launch> [];
        tenant_caps: TenantCaps [tenant_max_in_service, tenant_max_waiting, tenant_over_cap,
            tenants, teams];
        prices: prices::Prices [prices];
        tokenizer: CostTokenizer [cost_tokenizer, cost];
        count_first: CostCountFirst [cost_count_first];
        state: StateConfig [state, state_backend, state_redis_url, state_prefix, state_fleet,
            state_on_unavailable, state_fetch_timeout, state_lease_horizon, state_lease_max_share,
            state_lease_idle, state_lease_max_age, state_dir, state_flush_interval,
            state_usage_retention_days, state_usage_zone];
        policies: policy::PolicyChain [policy, policy_flags, policy_paths, policy_settings];
        models: Models [models];
        bands: Bands [bands];
    }
}

/// The key in the file `upstream-api-key-file` names; the file is printed, never the key.
struct UpstreamKey;

impl Keys<Settings> for UpstreamKey {
    type Value = Option<Secret>;
    fn read(s: &Settings) -> Result<Option<Secret>, ConfigError> {
        s.upstream_api_key_file.as_deref().map(read_key).transpose()
    }
    fn write(_: &Option<Secret>, _: &mut Settings) {}
}

/// `--cost-tokenizer`, or `tokenizer` in `[cost]`.
struct CostTokenizer;

impl Keys<Settings> for CostTokenizer {
    type Value = Tokenizer;
    fn read(s: &Settings) -> Result<Tokenizer, ConfigError> {
        let file = s.cost.as_ref().and_then(|c| c.tokenizer);
        Ok(s.cost_tokenizer.or(file).unwrap_or(Tokenizer::Upstream))
    }
    fn write(v: &Tokenizer, s: &mut Settings) {
        s.cost.get_or_insert_with(CostTable::default).tokenizer = Some(*v);
    }
}

/// `--cost-count-first`, or `count-first` in `[cost]`.
struct CostCountFirst;

impl Keys<Settings> for CostCountFirst {
    type Value = bool;
    fn read(s: &Settings) -> Result<bool, ConfigError> {
        let file = s.cost.as_ref().and_then(|c| c.count_first);
        Ok(s.cost_count_first.or(file).unwrap_or(false))
    }
    fn write(v: &bool, s: &mut Settings) {
        s.cost.get_or_insert_with(CostTable::default).count_first = Some(*v);
    }
}

/// The `[bands.NAME]` tables.
struct Bands;

impl Keys<Settings> for Bands {
    type Value = Vec<BandSpec>;
    fn read(s: &Settings) -> Result<Vec<BandSpec>, ConfigError> {
        bands_of(s.bands.clone().unwrap_or_default())
    }
    fn write(v: &Vec<BandSpec>, s: &mut Settings) {
        let table = |b: &BandSpec| BandTable {
            priorities: [b.priorities.0, b.priorities.1],
            slots: b.slots,
            queue: b.queue,
        };
        s.bands = (!v.is_empty()).then(|| v.iter().map(|b| (b.name.clone(), table(b))).collect());
    }
}

/// The `[models."NAME"]` tables.
struct Models;

impl Keys<Settings> for Models {
    type Value = BTreeMap<String, ModelOverride>;
    fn read(s: &Settings) -> Result<Self::Value, ConfigError> {
        model_overrides(s.models.clone().unwrap_or_default())
    }
    fn write(v: &Self::Value, s: &mut Settings) {
        let table = |o: &ModelOverride| ModelTable {
            slots: o.slots,
            queue_depth: o.queue_depth,
            queue_timeout: o.queue_timeout.map(Dur),
        };
        s.models = (!v.is_empty()).then(|| v.iter().map(|(n, o)| (n.clone(), table(o))).collect());
    }
}

/// The `[bands.NAME]` tables, checked: a range each, not overlapping another; shares in (0, 1].
fn bands_of(tables: BTreeMap<String, BandTable>) -> Result<Vec<BandSpec>, ConfigError> {
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
    tables: BTreeMap<String, ModelTable>,
) -> Result<BTreeMap<String, ModelOverride>, ConfigError> {
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
