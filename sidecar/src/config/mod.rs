//! Configuration: one set of keys read from flags, `SLOTGATE_*` variables and a TOML file, merged and
//! validated once into an immutable [`Config`].

pub mod launch;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

/// Every key, each optional so layers can be merged. Flags and env come from clap; the file from serde.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    /// Where clients connect: `unix:PATH` or `tcp:HOST:PORT`. Repeatable. [default: unix:/run/slotgate/slotgate.sock]
    #[arg(
        long,
        env = "SLOTGATE_LISTEN",
        value_delimiter = ',',
        value_name = "ADDR"
    )]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<Vec<ListenAddr>>,

    /// Octal file mode of Unix listen sockets. [default: 0660]
    #[arg(long, env = "SLOTGATE_SOCKET_MODE", value_name = "MODE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_mode: Option<SocketMode>,

    /// The llama-server: `http://HOST:PORT` or `unix:/path/llama.sock`. [default: http://127.0.0.1:8080]
    #[arg(long, env = "SLOTGATE_UPSTREAM", value_name = "URL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamAddr>,

    /// A file holding the API key slotgate's own calls to llama-server carry (`/props`, counting,
    /// `/slots`, `/metrics`) when llama-server runs with `--api-key`: the first line that is not a
    /// `#` comment, as llama-server reads its `--api-key-file`. `slotgate wrap` takes it from the
    /// command line itself. Clients' own keys reach llama-server unchanged. [default: none]
    #[arg(long, env = "SLOTGATE_UPSTREAM_API_KEY_FILE", value_name = "PATH")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_api_key_file: Option<PathBuf>,

    /// Forward llama-server's endpoints that act on the host rather than the model (`/tools`: its
    /// built-in tools read and write files and run commands; `/cors-proxy`: fetches any URL). Off,
    /// clients get 403 naming this setting. [default: false]
    #[arg(long, env = "SLOTGATE_FORWARD_HOST_ENDPOINTS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_host_endpoints: Option<bool>,

    /// Admin endpoints (/metrics, /livez, /readyz, /status): `HOST:PORT`, `tcp:HOST:PORT`, `unix:PATH` or `off`. [default: tcp:127.0.0.1:9464]
    #[arg(long, env = "SLOTGATE_ADMIN_LISTEN", value_name = "ADDR")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<AdminAddr>,

    /// Requests forwarded at once: `auto` follows llama-server's `total_slots` (its `-np`, read from
    /// `/props` whenever it becomes ready; 1 until then), or a fixed number (a number that differs
    /// from llama-server's is warned about, in the log, `/status` and `slotgate_slots_mismatch`).
    /// [default: auto]
    #[arg(long, env = "SLOTGATE_SLOTS", value_name = "auto|N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<Slots>,

    /// How llama-server's slots hold their context: `auto` (learned: `/props`, and whether the slots
    /// share one KV pool from llama-server's command line, that of `slotgate wrap` or of the process
    /// behind --upstream on this host; a shared pool of one slot's context is assumed when it cannot
    /// be seen), `per-slot` (each slot its own, `-np N` without `--kv-unified`), or the pool's size in
    /// tokens. In a shared pool a request is admitted only while its reservation fits beside those
    /// in service (llama-server fails every request at once when the pool runs out). [default: auto]
    #[arg(long, env = "SLOTGATE_KV_POOL", value_name = "auto|per-slot|TOKENS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_pool: Option<KvPool>,

    /// Requests that may wait for a slot; beyond it new requests get 429 at once. [default: 8]
    #[arg(long, env = "SLOTGATE_QUEUE_DEPTH", value_name = "D")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<usize>,

    /// Longest wait in the queue; a request that waited longer gets 504 and is never forwarded. [default: 60s]
    #[arg(long, env = "SLOTGATE_QUEUE_TIMEOUT", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout: Option<Dur>,

    /// Take priority from the body's `priority` field (lower is served earlier, as in vLLM).
    #[arg(long, env = "SLOTGATE_TRUST_CLIENT_PRIORITY", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_client_priority: Option<bool>,

    /// Waiting this long makes a queued request one priority level more urgent (repeatedly), so less
    /// urgent requests still run once more urgent ones let up. `0s` turns aging off. [default: 10s]
    #[arg(long, env = "SLOTGATE_PRIORITY_AGING", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_aging: Option<Dur>,

    /// The largest fraction of the queue one tenant may hold (at least one place); its further
    /// requests get 429 `tenant_queue_full` while other tenants can still queue. `1.0` turns the
    /// limit off. [default: 0.5]
    #[arg(long, env = "SLOTGATE_TENANT_QUEUE_SHARE", value_name = "FRACTION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_queue_share: Option<f64>,

    /// Largest request body; larger ones get 413. Accepts `8MiB`, `512KiB`, `1048576`. [default: 8MiB]
    #[arg(long, env = "SLOTGATE_MAX_BODY", value_name = "SIZE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body: Option<ByteSize>,

    /// Time allowed to read a request's headers (slowloris guard). [default: 10s]
    #[arg(long, env = "SLOTGATE_HEADER_TIMEOUT", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_timeout: Option<Dur>,

    /// Time allowed to read a request's body; then 408. [default: 30s]
    #[arg(long, env = "SLOTGATE_BODY_TIMEOUT", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_timeout: Option<Dur>,

    /// A client that takes no byte of a waiting response for this long is cut: its slot is released at
    /// once and llama-server stops generating for it. A slow reader that keeps taking bytes is never
    /// cut. `0s` turns the guard off. [default: 30s]
    #[arg(long, env = "SLOTGATE_CLIENT_STALL_TIMEOUT", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_stall_timeout: Option<Dur>,

    /// Longest silence from llama-server once its answer has begun (between streamed tokens); then
    /// the client's response is aborted and the slot released. `0s` turns it off. [default: 60s]
    #[arg(long, env = "SLOTGATE_UPSTREAM_IDLE_TIMEOUT", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_idle_timeout: Option<Dur>,

    /// Longest wait for llama-server's response to begin once a request is forwarded. It covers the
    /// prompt's prefill and, for a non-streamed request, the whole generation, so the default is
    /// long enough for a full context on a CPU. `0s` turns it off. [default: 10m]
    #[arg(
        long,
        env = "SLOTGATE_UPSTREAM_FIRST_BYTE_TIMEOUT",
        value_name = "DURATION"
    )]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_first_byte_timeout: Option<Dur>,

    /// Let generation requests that are not streamed reuse idle upstream connections (idle at most
    /// 2 s, below llama-server's 5 s keep-alive). Streamed ones always get a connection of their own
    /// (llama-server closes it after a stream while announcing keep-alive). Turn it off for an
    /// upstream that closes idle connections silently. [default: true]
    #[arg(long, env = "SLOTGATE_UPSTREAM_REUSE_CONNECTIONS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_reuse_connections: Option<bool>,

    /// Append llama-server's own `/metrics` (the `llamacpp:*` series, when it runs with `--metrics`)
    /// to slotgate's admin `/metrics`, so one scrape target serves both (llama-server on a private
    /// Unix socket cannot be scraped itself). [default: true]
    #[arg(long, env = "SLOTGATE_UPSTREAM_METRICS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_metrics: Option<bool>,

    /// Refuse at arrival, with 429 and Retry-After, a request whose estimated wait for a slot is
    /// already longer than its queue timeout, instead of letting it wait for a 504. [default: true]
    #[arg(long, env = "SLOTGATE_REJECT_DOOMED_WAITS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject_doomed_waits: Option<bool>,

    /// The HTTP status (400 to 499) of a policy's 429 denial: one tenant over its own budget, as
    /// token-budget answers, not this server's load. A router in front that takes every 429 as "this
    /// server is overloaded" (LiteLLM cools the whole deployment down, for every tenant) can be given
    /// a status it passes to the caller instead, e.g. 403 (see examples/litellm). Retry-After and the
    /// `policy_denied` code stay; a policy's other statuses are sent as they are. [default: 429]
    #[arg(long, env = "SLOTGATE_POLICY_DENIAL_STATUS", value_name = "STATUS")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_denial_status: Option<u16>,

    /// Open client connections across all listeners; further ones wait in the kernel backlog. [default: 1024]
    #[arg(long, env = "SLOTGATE_MAX_CONNECTIONS", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,

    /// On SIGTERM/SIGINT, how long in-flight responses may keep streaming. [default: 30s]
    #[arg(long, env = "SLOTGATE_DRAIN_TIMEOUT", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<Dur>,

    /// How often the upstream's /health is probed for readiness. [default: 1s]
    #[arg(long, env = "SLOTGATE_HEALTH_INTERVAL", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_interval: Option<Dur>,

    /// Time allowed for one upstream connect attempt. [default: 2s]
    #[arg(long, env = "SLOTGATE_CONNECT_TIMEOUT", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<Dur>,

    /// Log line format on stderr: `text` or `json`. Level from SLOTGATE_LOG or RUST_LOG. [default: text]
    #[arg(long, env = "SLOTGATE_LOG_FORMAT", value_name = "FORMAT")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,

    /// How prompt tokens are counted: `upstream` (llama-server's own template and tokenizer, while a
    /// request waits for a slot or before the chain when a policy asks; the estimate when it cannot
    /// answer) or `estimate` (characters / 4). TOML: `cost.tokenizer`. [default: upstream]
    #[arg(
        long = "cost-tokenizer",
        env = "SLOTGATE_COST_TOKENIZER",
        value_name = "MODE"
    )]
    #[serde(skip)]
    pub cost_tokenizer: Option<Tokenizer>,

    /// Count every generation request's prompt before the policy chain, as if a policy had asked:
    /// exact counts on every request, at the price of two llama-server round trips before a request
    /// with a free slot is forwarded. Off: counted only while a request waits. TOML:
    /// `cost.count-first`. [default: false]
    #[arg(long = "cost-count-first", env = "SLOTGATE_COST_COUNT_FIRST", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(skip)]
    pub cost_count_first: Option<bool>,

    /// The `[cost]` table of the config file.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostTable>,

    /// Where policy budgets live: `memory` (each sidecar its own) or `redis` (shared by every sidecar
    /// of the fleet, on Redis or Valkey, through leases; see "Running a fleet"). TOML:
    /// `state.backend`. [default: memory]
    #[arg(
        long = "state-backend",
        env = "SLOTGATE_STATE_BACKEND",
        value_name = "BACKEND"
    )]
    #[serde(skip)]
    pub state_backend: Option<StateBackend>,

    /// The store of the `redis` backend: `redis://HOST:PORT/DB`, `rediss://...` or
    /// `unix:///path/redis.sock`. TOML: `state.redis-url`.
    #[arg(
        long = "state-redis-url",
        env = "SLOTGATE_STATE_REDIS_URL",
        value_name = "URL"
    )]
    #[serde(skip)]
    pub state_redis_url: Option<String>,

    /// Prefix of every key slotgate writes in the store. TOML: `state.prefix`. [default: slotgate]
    #[arg(
        long = "state-prefix",
        env = "SLOTGATE_STATE_PREFIX",
        value_name = "PREFIX"
    )]
    #[serde(skip)]
    pub state_prefix: Option<String>,

    /// The name the sidecars of one model share: their budgets are one. TOML: `state.fleet`.
    /// [default: default]
    #[arg(
        long = "state-fleet",
        env = "SLOTGATE_STATE_FLEET",
        value_name = "NAME"
    )]
    #[serde(skip)]
    pub state_fleet: Option<String>,

    /// What a budget does while the store is unreachable: `local-share` (each sidecar enforces the
    /// capacity divided by the live sidecars), `allow` or `deny`. TOML: `state.on-unavailable`.
    /// [default: local-share]
    #[arg(
        long = "state-on-unavailable",
        env = "SLOTGATE_STATE_ON_UNAVAILABLE",
        value_name = "MODE"
    )]
    #[serde(skip)]
    pub state_on_unavailable: Option<OnUnavailable>,

    /// When a lease cannot cover a take: the longest the one synchronous fetch from the store may
    /// take before the failure mode applies (1ms to 1s). TOML: `state.fetch-timeout`. [default: 5ms]
    #[arg(
        long = "state-fetch-timeout",
        env = "SLOTGATE_STATE_FETCH_TIMEOUT",
        value_name = "DURATION"
    )]
    #[serde(skip)]
    pub state_fetch_timeout: Option<Dur>,

    /// A full lease covers this much of the sidecar's recent demand for a bucket (also the time
    /// constant of that demand rate). TOML: `state.lease-horizon`. [default: 1s]
    #[arg(
        long = "state-lease-horizon",
        env = "SLOTGATE_STATE_LEASE_HORIZON",
        value_name = "DURATION"
    )]
    #[serde(skip)]
    pub state_lease_horizon: Option<Dur>,

    /// The most of a bucket's capacity one sidecar's lease may hold, in (0, 1]: what tokens in
    /// other sidecars' leases can keep from a tenant. TOML: `state.lease-max-share`. [default: 0.1]
    #[arg(
        long = "state-lease-max-share",
        env = "SLOTGATE_STATE_LEASE_MAX_SHARE",
        value_name = "FRACTION"
    )]
    #[serde(skip)]
    pub state_lease_max_share: Option<f64>,

    /// A lease not taken from for this long goes back to the fleet bucket. TOML:
    /// `state.lease-idle`. [default: 5s]
    #[arg(
        long = "state-lease-idle",
        env = "SLOTGATE_STATE_LEASE_IDLE",
        value_name = "DURATION"
    )]
    #[serde(skip)]
    pub state_lease_idle: Option<Dur>,

    /// Tokens held this long since they were leased go back, busy or not. TOML:
    /// `state.lease-max-age`. [default: 30s]
    #[arg(
        long = "state-lease-max-age",
        env = "SLOTGATE_STATE_LEASE_MAX_AGE",
        value_name = "DURATION"
    )]
    #[serde(skip)]
    pub state_lease_max_age: Option<Dur>,

    /// The `[state]` table of the config file.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateTable>,

    /// How often policy modules, their settings files and the config file are checked for changes;
    /// a change reloads the chain (as SIGHUP does). `0s` turns the watch off. [default: 2s]
    #[arg(long, env = "SLOTGATE_POLICY_WATCH", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_watch: Option<Dur>,

    /// Directory where compiled policy modules are kept across restarts (keyed by module hash and
    /// engine). [default: off; modules are still cached in memory, so a reload only compiles what changed]
    #[arg(long, env = "SLOTGATE_POLICY_CACHE_DIR", value_name = "DIR")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_cache_dir: Option<PathBuf>,

    /// Add a WASM policy to the chain (repeatable; evaluated in order, after any `[[policy]]` of the
    /// config file).
    #[arg(long = "policy", value_name = "PATH")]
    #[serde(skip)]
    pub policy_paths: Option<Vec<PathBuf>>,

    /// Settings (JSON, or TOML by extension) of the `--policy` just before this flag.
    #[arg(long = "policy-settings", value_name = "PATH")]
    #[serde(skip)]
    pub policy_settings: Option<Vec<PathBuf>>,

    /// `--policy` flags paired with their `--policy-settings` (filled in by `cli::parse`).
    #[arg(skip)]
    #[serde(skip)]
    pub policy_flags: Option<Vec<PolicySpec>>,

    /// The policy chain of the config file: `[[policy]]` tables.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Vec<PolicySpec>>,
}

/// One `[[policy]]` entry: a module, its settings, how its decisions count, and its limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PolicySpec {
    /// Name in logs and metric labels. [default: the file name without extension]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The module (.wasm, or .wat text).
    pub path: PathBuf,
    /// Settings as an inline table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<toml::Value>,
    /// Settings from a file (JSON, or TOML by extension) instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings_file: Option<PathBuf>,
    /// `enforce` (default): the decision counts. `monitor`: evaluated, logged, counted, ignored.
    #[serde(default)]
    pub mode: PolicyMode,
    /// What a failed evaluation (trap, timeout, fuel, memory, bad output) means: `deny` (default,
    /// fail closed with 503) or `allow`.
    #[serde(default)]
    pub on_error: PolicyOnError,
    /// Fuel one evaluation may burn. [default: 10000000]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Wall-clock deadline of one evaluation. [default: 20ms]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Dur>,
    /// Largest linear memory. [default: 16MiB]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyMode {
    #[default]
    Enforce,
    Monitor,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyOnError {
    #[default]
    Deny,
    Allow,
}

impl PolicySpec {
    pub fn from_path(path: PathBuf, settings_file: Option<PathBuf>) -> Self {
        PolicySpec {
            name: None,
            path,
            settings: None,
            settings_file,
            mode: PolicyMode::Enforce,
            on_error: PolicyOnError::Deny,
            fuel: None,
            deadline: None,
            memory: None,
        }
    }

    pub fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            self.path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("policy")
                .to_owned()
        })
    }
}

macro_rules! layer {
    ($hi:expr, $lo:expr, $($field:ident),+ $(,)?) => {
        Settings { $($field: $hi.$field.or($lo.$field)),+ }
    };
}

impl Settings {
    /// Keys set in `self` win; the rest come from `lower`.
    pub fn over(self, lower: Settings) -> Settings {
        layer!(
            self,
            lower,
            listen,
            socket_mode,
            upstream,
            upstream_api_key_file,
            forward_host_endpoints,
            admin_listen,
            slots,
            kv_pool,
            queue_depth,
            queue_timeout,
            trust_client_priority,
            priority_aging,
            tenant_queue_share,
            max_body,
            header_timeout,
            body_timeout,
            client_stall_timeout,
            upstream_idle_timeout,
            upstream_first_byte_timeout,
            upstream_reuse_connections,
            upstream_metrics,
            reject_doomed_waits,
            policy_denial_status,
            max_connections,
            drain_timeout,
            health_interval,
            connect_timeout,
            log_format,
            cost_tokenizer,
            cost_count_first,
            cost,
            state_backend,
            state_redis_url,
            state_prefix,
            state_fleet,
            state_on_unavailable,
            state_fetch_timeout,
            state_lease_horizon,
            state_lease_max_share,
            state_lease_idle,
            state_lease_max_age,
            state,
            policy_watch,
            policy_cache_dir,
            policy_paths,
            policy_settings,
            policy_flags,
            policy,
        )
    }

    /// Reads a TOML file of settings.
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_owned(), e))?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse(path.to_owned(), e.to_string()))
    }
}

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
    pub slots: Slots,
    pub kv_pool: KvPool,
    pub queue_depth: usize,
    pub queue_timeout: Duration,
    pub trust_client_priority: bool,
    /// One priority level gained per this much waiting; `None` when off.
    pub priority_aging: Option<Duration>,
    /// Fraction of the queue one tenant may hold, in `(0, 1]`; 1 is no limit.
    pub tenant_queue_share: f64,
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
    pub reject_doomed_waits: bool,
    /// The status a policy's 429 denial is sent with (429 unless configured).
    pub policy_denial_status: u16,
    pub max_connections: usize,
    pub drain_timeout: Duration,
    pub health_interval: Duration,
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
            reject_doomed_waits: s.reject_doomed_waits.unwrap_or(true),
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
                }
                .over(s.state.unwrap_or_default()),
            )?,
            policies: policy_chain(s.policy, s.policy_flags)?,
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
            slots: Some(self.slots),
            kv_pool: Some(self.kv_pool),
            queue_depth: Some(self.queue_depth),
            queue_timeout: Some(Dur(self.queue_timeout)),
            trust_client_priority: Some(self.trust_client_priority),
            priority_aging: Some(off_is_zero(self.priority_aging)),
            tenant_queue_share: Some(self.tenant_queue_share),
            max_body: Some(ByteSize(self.max_body)),
            header_timeout: Some(Dur(self.header_timeout)),
            body_timeout: Some(Dur(self.body_timeout)),
            client_stall_timeout: Some(off_is_zero(self.client_stall_timeout)),
            upstream_idle_timeout: Some(off_is_zero(self.upstream_idle_timeout)),
            upstream_first_byte_timeout: Some(off_is_zero(self.upstream_first_byte_timeout)),
            upstream_reuse_connections: Some(self.upstream_reuse_connections),
            upstream_metrics: Some(self.upstream_metrics),
            reject_doomed_waits: Some(self.reject_doomed_waits),
            policy_denial_status: Some(self.policy_denial_status),
            max_connections: Some(self.max_connections),
            drain_timeout: Some(Dur(self.drain_timeout)),
            health_interval: Some(Dur(self.health_interval)),
            connect_timeout: Some(Dur(self.connect_timeout)),
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
            state: Some(self.state.table()),
            policy_watch: Some(off_is_zero(self.policy_watch)),
            policy_cache_dir: self.policy_cache_dir.clone(),
            policy_paths: None,
            policy_settings: None,
            policy_flags: None,
            policy: (!self.policies.is_empty()).then(|| self.policies.clone()),
        }
    }
}

/// A secret that `Debug` and logs never show.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
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

/// File entries first, then the `--policy` flags (already paired with their settings).
fn policy_chain(
    file: Option<Vec<PolicySpec>>,
    flags: Option<Vec<PolicySpec>>,
) -> Result<Vec<PolicySpec>, ConfigError> {
    let mut chain = file.unwrap_or_default();
    chain.extend(flags.unwrap_or_default());
    let mut names = std::collections::HashSet::new();
    for spec in &chain {
        if spec.settings.is_some() && spec.settings_file.is_some() {
            return Err(invalid(
                "policy",
                format!(
                    "{}: give `settings` or `settings-file`, not both",
                    spec.path.display()
                ),
            ));
        }
        check_policy_limits(spec)?;
        if !names.insert(spec.display_name()) {
            return Err(invalid(
                "policy",
                format!(
                    "two policies are named `{}`; set `name`",
                    spec.display_name()
                ),
            ));
        }
    }
    Ok(chain)
}

/// The most linear memory one policy instance may have: the engine's instance pool is sized by it.
pub const POLICY_MAX_MEMORY_BYTES: usize = 64 << 20;

/// A policy's limits must be positive, and its memory must fit the engine's instance pool.
pub fn check_policy_limits(spec: &PolicySpec) -> Result<(), ConfigError> {
    let at = || spec.path.display().to_string();
    let max = POLICY_MAX_MEMORY_BYTES;
    if spec.fuel == Some(0) {
        return Err(invalid(
            "policy",
            format!("{}: fuel must be positive", at()),
        ));
    }
    if spec.deadline.is_some_and(|d| d.0.is_zero()) {
        return Err(invalid(
            "policy",
            format!("{}: deadline must be longer than zero", at()),
        ));
    }
    match spec.memory {
        Some(ByteSize(m)) if m < 64 << 10 => Err(invalid(
            "policy",
            format!("{}: memory must be at least one wasm page (64KiB)", at()),
        )),
        Some(ByteSize(m)) if m > max => Err(invalid(
            "policy",
            format!(
                "{}: memory is over the {}MiB a policy may have",
                at(),
                max >> 20
            ),
        )),
        _ => Ok(()),
    }
}

/// Implements `Display` + `FromStr` based serde (as a string) for a value type.
macro_rules! string_serde {
    ($ty:ty) => {
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = StringOrInt::deserialize(d)?;
                raw.0.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// Lets TOML write `max-body = 1048576` as well as `max-body = "1MiB"`.
struct StringOrInt(String);

impl<'de> Deserialize<'de> for StringOrInt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i64),
        }
        Ok(StringOrInt(match Raw::deserialize(d)? {
            Raw::S(s) => s,
            Raw::I(i) => i.to_string(),
        }))
    }
}

/// A client listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("`unix:` needs a socket path".into());
            }
            Ok(ListenAddr::Unix(PathBuf::from(path)))
        } else {
            let addr = s.strip_prefix("tcp:").unwrap_or(s);
            addr.parse().map(ListenAddr::Tcp).map_err(|_| {
                format!("`{s}` is neither unix:PATH nor tcp:HOST:PORT (an IP address and port)")
            })
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}
string_serde!(ListenAddr);

/// The admin listen address, or `off`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    Off,
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for AdminAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(AdminAddr::Off);
        }
        Ok(match s.parse::<ListenAddr>()? {
            ListenAddr::Unix(p) => AdminAddr::Unix(p),
            ListenAddr::Tcp(a) => AdminAddr::Tcp(a),
        })
    }
}

impl fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminAddr::Off => f.write_str("off"),
            AdminAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            AdminAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}
string_serde!(AdminAddr);

/// Where llama-server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamAddr {
    /// `host:port` of an `http://` URL.
    Tcp(String),
    Unix(PathBuf),
}

impl FromStr for UpstreamAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("`unix:` needs a socket path".into());
            }
            return Ok(UpstreamAddr::Unix(PathBuf::from(path)));
        }
        let Some(rest) = s.strip_prefix("http://") else {
            return Err(format!(
                "`{s}` must be http://HOST:PORT or unix:PATH (https is not supported)"
            ));
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("`{s}` must be http://HOST:PORT with no path"));
        }
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| format!("`{s}` needs an explicit port"))?;
        // Digits only: `u16` parsing alone takes `+80`, which a URI does not read as a port.
        let digits = port.bytes().all(|b| b.is_ascii_digit());
        if host.is_empty() || !digits || port.parse::<u16>().is_err() {
            return Err(format!("`{s}` needs a host and a numeric port"));
        }
        // The upstream client puts the address into every request's URI, so it must be a URI
        // authority as it stands: `http://a b:1` would send every request nowhere, and in
        // `http://h#x:1` a URI sees host `h` and no port at all.
        match authority.parse::<http::uri::Authority>() {
            Ok(a) if a.as_str() == authority && a.port_u16().is_some() => {}
            _ => return Err(format!("`{s}` is not a valid http://HOST:PORT")),
        }
        Ok(UpstreamAddr::Tcp(authority.to_owned()))
    }
}

impl fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamAddr::Tcp(a) => write!(f, "http://{a}"),
            UpstreamAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}
string_serde!(UpstreamAddr);

/// How many requests are forwarded at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// As many as llama-server has (`total_slots` in `/props`).
    Auto,
    Fixed(usize),
}

impl Slots {
    /// Before llama-server has said: the fixed number, or one (nothing is lost by starting narrow;
    /// `/props` is read as soon as the server is ready).
    pub fn initial(self) -> usize {
        match self {
            Slots::Auto => 1,
            Slots::Fixed(n) => n,
        }
    }
}

impl FromStr for Slots {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Slots::Auto),
            n => n.parse().map(Slots::Fixed).map_err(|_| {
                format!("`{s}` is not a number of slots; use auto or a number such as 4")
            }),
        }
    }
}

impl fmt::Display for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slots::Auto => f.write_str("auto"),
            Slots::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// `slots = 4` or `slots = "auto"`, and printed back the same way.
impl Serialize for Slots {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Slots::Auto => s.serialize_str("auto"),
            Slots::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Slots {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = StringOrInt::deserialize(d)?;
        raw.0.parse().map_err(serde::de::Error::custom)
    }
}

/// How llama-server's slots hold their context (see `--kv-pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPool {
    /// Learned from llama-server.
    Auto,
    /// Each slot has a context of its own.
    PerSlot,
    /// One pool of this many tokens, shared by all slots.
    Tokens(u64),
}

impl FromStr for KvPool {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(KvPool::Auto),
            "per-slot" => Ok(KvPool::PerSlot),
            n => n.parse().map(KvPool::Tokens).map_err(|_| {
                format!(
                    "`{s}` is not a KV pool; use auto, per-slot or a number of tokens such as 8192"
                )
            }),
        }
    }
}

impl fmt::Display for KvPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvPool::Auto => f.write_str("auto"),
            KvPool::PerSlot => f.write_str("per-slot"),
            KvPool::Tokens(n) => write!(f, "{n}"),
        }
    }
}

/// `kv-pool = 8192` or `kv-pool = "per-slot"`.
impl Serialize for KvPool {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvPool::Tokens(n) => s.serialize_u64(*n),
            other => s.collect_str(other),
        }
    }
}

impl<'de> Deserialize<'de> for KvPool {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = StringOrInt::deserialize(d)?;
        raw.0.parse().map_err(serde::de::Error::custom)
    }
}

/// A duration in human units (`500ms`, `60s`, `2m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        humantime::parse_duration(s.trim())
            .map(Dur)
            .map_err(|e| format!("`{s}` is not a duration ({e}); use units such as 500ms, 60s, 2m"))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}
string_serde!(Dur);

/// A size in bytes (`1048576`, `512KiB`, `8MiB`, `1GiB`; `KB`/`MB` are decimal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub usize);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let bad = || format!("`{s}` is not a size; use bytes or KiB, MiB, GiB (e.g. 8MiB)");
        let n: usize = num.parse().map_err(|_| bad())?;
        let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            _ => return Err(bad()),
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match n {
            _ if n >= 1 << 30 && n % (1 << 30) == 0 => write!(f, "{}GiB", n >> 30),
            _ if n >= 1 << 20 && n % (1 << 20) == 0 => write!(f, "{}MiB", n >> 20),
            _ if n >= 1 << 10 && n % (1 << 10) == 0 => write!(f, "{}KiB", n >> 10),
            _ => write!(f, "{n}"),
        }
    }
}
string_serde!(ByteSize);

/// An octal file mode such as `0660`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketMode(pub u32);

impl FromStr for SocketMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let digits = s.trim().trim_start_matches("0o");
        match u32::from_str_radix(digits, 8) {
            Ok(m) if m <= 0o777 => Ok(SocketMode(m)),
            _ => Err(format!("`{s}` is not an octal file mode such as 0660")),
        }
    }
}

impl fmt::Display for SocketMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}
string_serde!(SocketMode);

/// The `[cost]` table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CostTable {
    /// `upstream` or `estimate` (see `--cost-tokenizer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<Tokenizer>,
    /// Count every request before the chain (see `--cost-count-first`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_first: Option<bool>,
}

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
}

impl StateTable {
    /// Keys set in `self` (the flags) win; the rest come from `lower` (the file).
    fn over(self, lower: StateTable) -> StateTable {
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

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            horizon: Duration::from_secs(1),
            max_share: 0.1,
            idle: Duration::from_secs(5),
            max_age: Duration::from_secs(30),
        }
    }
}

impl StateConfig {
    fn from_table(t: StateTable) -> Result<StateConfig, ConfigError> {
        let backend = t.backend.unwrap_or(StateBackend::Memory);
        let redis_url = t.redis_url.filter(|u| !u.is_empty());
        if backend == StateBackend::Redis && redis_url.is_none() {
            return Err(invalid(
                "state.redis-url",
                "the redis backend needs the store's URL (redis://HOST:PORT, rediss://... or unix:///path/redis.sock)",
            ));
        }
        if let Some(url) = &redis_url {
            redis::Client::open(url.as_str())
                .map_err(|e| invalid("state.redis-url", format!("`{url}`: {e}")))?;
        }
        let name = |key: &'static str, v: Option<String>, default: &str| {
            let v = v.unwrap_or_else(|| default.to_owned());
            if v.is_empty() || v.contains(char::is_whitespace) {
                Err(invalid(
                    key,
                    format!("`{v}` must be a non-empty name without spaces"),
                ))
            } else {
                Ok(v)
            }
        };
        let positive = |key: &'static str, d: Option<Dur>, default: Duration| match d {
            Some(Dur(d)) if d.is_zero() => Err(invalid(key, "must be longer than 0s")),
            Some(Dur(d)) => Ok(d),
            None => Ok(default),
        };
        let defaults = LeaseSettings::default();
        let fetch_timeout = positive(
            "state.fetch-timeout",
            t.fetch_timeout,
            Duration::from_millis(5),
        )?;
        if !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&fetch_timeout) {
            return Err(invalid(
                "state.fetch-timeout",
                format!(
                    "`{}` is outside 1ms to 1s: a take waits this long on the request path",
                    Dur(fetch_timeout)
                ),
            ));
        }
        let max_share = t.lease_max_share.unwrap_or(defaults.max_share);
        if !(max_share > 0.0 && max_share <= 1.0) {
            return Err(invalid(
                "state.lease-max-share",
                format!("`{max_share}` must be a fraction of the capacity in (0, 1]"),
            ));
        }
        Ok(StateConfig {
            backend,
            redis_url,
            prefix: name("state.prefix", t.prefix, "slotgate")?,
            fleet: name("state.fleet", t.fleet, "default")?,
            on_unavailable: t.on_unavailable.unwrap_or(OnUnavailable::LocalShare),
            fetch_timeout,
            lease: LeaseSettings {
                horizon: positive("state.lease-horizon", t.lease_horizon, defaults.horizon)?,
                max_share,
                idle: positive("state.lease-idle", t.lease_idle, defaults.idle)?,
                max_age: positive("state.lease-max-age", t.lease_max_age, defaults.max_age)?,
            },
        })
    }

    fn table(&self) -> StateTable {
        StateTable {
            backend: Some(self.backend),
            redis_url: self.redis_url.clone(),
            prefix: Some(self.prefix.clone()),
            fleet: Some(self.fleet.clone()),
            on_unavailable: Some(self.on_unavailable),
            fetch_timeout: Some(Dur(self.fetch_timeout)),
            lease_horizon: Some(Dur(self.lease.horizon)),
            lease_max_share: Some(self.lease.max_share),
            lease_idle: Some(Dur(self.lease.idle)),
            lease_max_age: Some(Dur(self.lease.max_age)),
        }
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

/// How prompt tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// llama-server's own template and tokenizer, with the estimate as fallback.
    Upstream,
    /// Characters / 4.
    Estimate,
}

impl FromStr for Tokenizer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "upstream" => Ok(Tokenizer::Upstream),
            "estimate" => Ok(Tokenizer::Estimate),
            _ => Err(format!(
                "`{s}` is not a tokenizer; use upstream or estimate"
            )),
        }
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tokenizer::Upstream => "upstream",
            Tokenizer::Estimate => "estimate",
        })
    }
}
string_serde!(Tokenizer);

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("`{s}` is not a log format; use text or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}
string_serde!(LogFormat);

/// What one request's body may be: its size, and how long it may take to arrive.
pub struct Limits {
    pub max_body: usize,
    pub body_timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_human_values() {
        assert_eq!(
            "500ms".parse::<Dur>().unwrap().0,
            Duration::from_millis(500)
        );
        assert_eq!("2m".parse::<Dur>().unwrap().0, Duration::from_secs(120));
        assert!("soon".parse::<Dur>().is_err());
        assert_eq!("8MiB".parse::<ByteSize>().unwrap().0, 8 << 20);
        assert_eq!("1024".parse::<ByteSize>().unwrap().0, 1024);
        assert!("8 parsecs".parse::<ByteSize>().is_err());
        assert_eq!("0660".parse::<SocketMode>().unwrap().0, 0o660);
        assert!("999".parse::<SocketMode>().is_err());
    }

    #[test]
    fn parses_addresses() {
        assert_eq!(
            "unix:/tmp/a.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/tmp/a.sock".into())
        );
        assert!(matches!(
            "tcp:127.0.0.1:8081".parse::<ListenAddr>(),
            Ok(ListenAddr::Tcp(_))
        ));
        assert!("tcp:localhost".parse::<ListenAddr>().is_err());
        assert_eq!(
            "http://127.0.0.1:8080/".parse::<UpstreamAddr>().unwrap(),
            UpstreamAddr::Tcp("127.0.0.1:8080".into())
        );
        assert!("https://x:1".parse::<UpstreamAddr>().is_err());
        assert!("http://x".parse::<UpstreamAddr>().is_err());
        assert_eq!("off".parse::<AdminAddr>().unwrap(), AdminAddr::Off);
    }

    #[test]
    fn layers_merge_and_file_rejects_unknown_keys() {
        let file: Settings =
            toml::from_str("slots = 2\nqueue-depth = 3\nmax-body = 4096\n").unwrap();
        let flags = Settings {
            slots: Some(Slots::Fixed(5)),
            ..Settings::default()
        };
        let cfg = Config::from_settings(flags.over(file)).unwrap();
        assert_eq!(
            (cfg.slots, cfg.queue_depth, cfg.max_body),
            (Slots::Fixed(5), 3, 4096)
        );
        assert!(toml::from_str::<Settings>("slot = 2").is_err());
        assert!(toml::from_str::<Settings>("queue-timeout = \"forever\"").is_err());
    }

    #[test]
    fn effective_settings_round_trip_through_toml() {
        let cfg = Config::from_settings(Settings::default()).unwrap();
        let text = toml::to_string(&cfg.effective()).unwrap();
        let again = Config::from_settings(toml::from_str(&text).unwrap()).unwrap();
        assert_eq!(toml::to_string(&again.effective()).unwrap(), text);
        assert!(text.contains("queue-timeout = \"1m\""), "{text}");
    }

    #[test]
    fn fairness_keys_parse_validate_and_derive_the_tenant_limit() {
        let cfg = Config::from_settings(Settings::default()).unwrap();
        assert_eq!(cfg.priority_aging, Some(Duration::from_secs(10)));
        assert_eq!(
            (cfg.tenant_queue_share, cfg.tenant_queue_limit()),
            (0.5, Some(4))
        );
        let file: Settings =
            toml::from_str("priority-aging = \"0s\"\ntenant-queue-share = 0.3\nqueue-depth = 5\n")
                .unwrap();
        let cfg = Config::from_settings(file).unwrap();
        assert_eq!(cfg.priority_aging, None);
        assert_eq!(cfg.tenant_queue_limit(), Some(2));
        let off = Settings {
            tenant_queue_share: Some(1.0),
            ..Settings::default()
        };
        assert_eq!(
            Config::from_settings(off).unwrap().tenant_queue_limit(),
            None
        );
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let s = Settings {
                tenant_queue_share: Some(bad),
                ..Settings::default()
            };
            let err = Config::from_settings(s).unwrap_err().to_string();
            assert!(err.contains("tenant-queue-share"), "{err}");
        }
    }

    #[test]
    fn rejects_zero_slots() {
        let s = Settings {
            slots: Some(Slots::Fixed(0)),
            ..Settings::default()
        };
        assert!(Config::from_settings(s)
            .unwrap_err()
            .to_string()
            .contains("slots"));
    }
}
