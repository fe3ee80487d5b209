//! Every key, as flags (clap), `SLOTGATE_*` variables and a TOML file (serde) give it: each optional,
//! so layers merge key by key. `--help` and the file format are read from here.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::admin::{AuditLog, Uids};
use super::hints::{LoadReport, TierPriorities};
use super::policy::PolicySpec;
use super::state::{OnUnavailable, StateBackend, StateDir, StateTable};
use super::tenants::{OverCap, TeamTable, TenantTable};
use super::values::*;
use super::ConfigError;

/// Declares the keys once: the struct clap and serde read, and `over`, which merges two layers key
/// by key (the keys set in `self` win; the rest come from `lower`).
macro_rules! keys {
    ($(#[$meta:meta])* pub struct $name:ident {
        $($(#[$field_meta:meta])* pub $field:ident: Option<$ty:ty>,)*
    }) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$field_meta])* pub $field: Option<$ty>,)*
        }

        impl $name {
            /// Keys set in `self` win; the rest come from `lower`.
            pub fn over(self, lower: $name) -> $name {
                $name { $($field: self.$field.or(lower.$field)),* }
            }
        }
    };
}

keys! {
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

    /// The llama-server: `http://HOST:PORT` or `unix:/path/llama.sock`. Unset, the first of
    /// 127.0.0.1:9931 (llama-server's default port from the release that moves it) and
    /// 127.0.0.1:8080 (its default before) that the kernel shows is llama-server run by slotgate's
    /// own user and answers its `/health`, within --connect-timeout; none: slotgate does not start
    /// (`slotgate check` prints 8080). [default: http://127.0.0.1:8080]
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

    /// llama-server's admin routes the client listener forwards as they came, with the caller's
    /// own credentials, instead of 403 `admin_endpoint`: `slots` (every slot's prompt and output,
    /// another tenant's included; saving and erasing them), `metrics`, `models` (the router's
    /// loads, unloads and deletes), `lora-adapters`, `props` (`POST`), or `all`. Comma-separated;
    /// they stay served on the admin listener. [default: none]
    #[arg(
        long,
        env = "SLOTGATE_CLIENT_ADMIN_ROUTES",
        value_delimiter = ',',
        value_name = "GROUP,..."
    )]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_admin_routes: Option<Vec<AdminRoutes>>,

    /// Admin endpoints (/metrics, /livez, /readyz, /status): `HOST:PORT`, `tcp:HOST:PORT`, `unix:PATH` or `off`. [default: tcp:127.0.0.1:9464]
    #[arg(long, env = "SLOTGATE_ADMIN_LISTEN", value_name = "ADDR")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<AdminAddr>,

    /// A file holding the admin token. With it, every admin endpoint but /livez and /readyz wants
    /// `Authorization: Bearer <token>` (else 401), and llama-server's admin routes reach it with
    /// slotgate's upstream key for callers that bring the token. The token is the file's first line
    /// that is not a `#` comment, white space around it dropped; at least 16 characters. Re-read on
    /// SIGHUP and when the file changes. Without it, anyone who can connect reads /status, /live
    /// and /metrics, and llama-server's admin routes carry only the caller's own credentials
    /// (docs/security.md). [default: none]
    #[arg(long, env = "SLOTGATE_ADMIN_TOKEN_FILE", value_name = "PATH")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,

    /// A file holding a second, read-only token: it opens /metrics, /status, /live and llama-server's
    /// GET admin routes (/slots, /lora-adapters, /models/sse), and nothing that changes the server. For Prometheus
    /// and `slotgate top`. Needs --admin-token-file. [default: none]
    #[arg(long, env = "SLOTGATE_ADMIN_READ_TOKEN_FILE", value_name = "PATH")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_read_token_file: Option<PathBuf>,

    /// Serve /metrics without a token, for a Prometheus that scrapes with none; every other admin
    /// endpoint keeps the token. [default: false]
    #[arg(long, env = "SLOTGATE_ADMIN_OPEN_METRICS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_open_metrics: Option<bool>,

    /// Octal file mode of a Unix admin socket (0600: slotgate's own user only). [default: 0600]
    #[arg(long, env = "SLOTGATE_ADMIN_SOCKET_MODE", value_name = "MODE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_socket_mode: Option<SocketMode>,

    /// On a Unix admin socket, the uids (comma-separated) allowed besides slotgate's own, as the
    /// kernel reports the peer (SO_PEERCRED); any other gets 403. Unset, any uid the socket's mode
    /// lets connect is served. [default: none]
    #[arg(long, env = "SLOTGATE_ADMIN_ALLOW_UIDS", value_name = "UID,...")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_allow_uids: Option<Uids>,

    /// Where the audit lines go (one for every admin call that changes something, and for each
    /// reload): `stderr`, with the log under the target `slotgate::audit`, or a file they are
    /// appended to, one JSON object a line (made 0600; a link or another user's file is refused).
    /// [default: stderr]
    #[arg(long, env = "SLOTGATE_AUDIT_LOG", value_name = "stderr|PATH")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<AuditLog>,

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

    /// Take priority from the client's hint: the body's `priority` field (lower is served earlier, as
    /// in vLLM), else its `service_tier` by --service-tier-priority. Without it a hint reaches only
    /// the policies (which clamp it to what the tenant may ask).
    #[arg(long, env = "SLOTGATE_TRUST_CLIENT_PRIORITY", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_client_priority: Option<bool>,

    /// The priority hint each `service_tier` of a request body stands for (OpenAI's `priority`,
    /// `default`, `auto`, `scale`, `flex`; Anthropic's `auto`, `standard_only`), used when the body
    /// has no `priority` field; `none` maps no tier. A hint only reaches the queue through
    /// --trust-client-priority or a policy (docs/sessions.md).
    /// [default: priority=-1,default=0,auto=0,standard_only=0,scale=0,flex=10]
    #[arg(long, env = "SLOTGATE_SERVICE_TIER_PRIORITY", value_name = "TIER=P,...|none")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier_priority: Option<TierPriorities>,

    /// Take `x-slo-ttft-ms` (the Gateway API Inference Extension's time-to-first-token objective,
    /// in milliseconds) as the request's deadline, as `X-Slotgate-Deadline-Ms` is: it must start
    /// within it or leave the queue (504), and is refused at once (429) when the wait is already
    /// longer. The shorter of the two wins. [default: false]
    #[arg(long, env = "SLOTGATE_SLO_TTFT_DEADLINE", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_ttft_deadline: Option<bool>,

    /// When a response of a slot route carries an ORCA load report for a router in front
    /// (`endpoint-load-metrics`: slots in use, requests waiting, KV pool use, expected wait;
    /// docs/observability.md): `asked` when the request sends `endpoint-load-metrics-format` (TEXT
    /// or JSON), as vLLM does; `always` on every one (Envoy reads them unasked); `never`, which also
    /// turns off `GET /v1/loads`, the load routers poll (SMG). [default: asked]
    #[arg(long, env = "SLOTGATE_LOAD_REPORT", value_name = "never|asked|always")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_report: Option<LoadReport>,

    /// Waiting this long makes a queued request one priority level more urgent (repeatedly), so less
    /// urgent requests still run once more urgent ones let up. `0s` turns aging off. [default: 10s]
    #[arg(long, env = "SLOTGATE_PRIORITY_AGING", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_aging: Option<Dur>,

    /// Requests of priority P or less urgent (P and above) are sheddable: when a more urgent request
    /// waits and every slot it needs is busy, a sheddable request holding one yields it. Before its
    /// first byte it goes back to its place in the queue, unanswered; after it, its stream ends
    /// with an error event (`shed`) telling it when to retry. Off unless set (docs/scheduling.md).
    #[arg(long, env = "SLOTGATE_SHEDDABLE_PRIORITY", value_name = "P", allow_negative_numbers = true)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sheddable_priority: Option<i64>,

    /// The largest fraction of the queue one tenant may hold (at least one place); its further
    /// requests get 429 `tenant_queue_full` while other tenants can still queue. `1.0` turns the
    /// limit off. [default: 0.5]
    #[arg(long, env = "SLOTGATE_TENANT_QUEUE_SHARE", value_name = "FRACTION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_queue_share: Option<f64>,

    /// What a prompt token llama-server read from its prompt cache counts for in fair scheduling,
    /// from 0 (nothing) to 1 (as much as a token it processed): an agent resending its 20k-token
    /// prefix is then charged for what it adds (docs/scheduling.md#cached-tokens). The quota
    /// policy's token quotas follow it. [default: 1.0]
    #[arg(long, env = "SLOTGATE_CACHED_TOKEN_WEIGHT", value_name = "WEIGHT")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_token_weight: Option<f64>,

    /// The most requests of one tenant in service at once (at least 1); `[tenants."NAME"]` sets a
    /// tenant's own, and a policy's `max_in_service` may lower it for a request. What a request
    /// beyond it gets: --tenant-over-cap (docs/scheduling.md). [default: none]
    #[arg(long, env = "SLOTGATE_TENANT_MAX_IN_SERVICE", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_max_in_service: Option<u32>,

    /// The most requests of one tenant waiting in the queue; beyond it, its requests get 429
    /// `tenant_busy` at once. `[tenants."NAME"]` sets a tenant's own, a policy's `max_waiting` may
    /// lower it. [default: none]
    #[arg(long, env = "SLOTGATE_TENANT_MAX_WAITING", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_max_waiting: Option<u32>,

    /// A request of a tenant at its in-service cap: `wait` (it queues, passed over by other
    /// tenants' requests until one of its tenant's ends) or `refuse` (429 `tenant_busy` at once,
    /// when its tenant's requests in service and waiting reach the cap). [default: wait]
    #[arg(long, env = "SLOTGATE_TENANT_OVER_CAP", value_name = "wait|refuse")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_over_cap: Option<OverCap>,

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

    /// A streaming request that has to wait for a slot is answered at once (200,
    /// `text/event-stream`) and sent an SSE comment at this interval with its place in the queue
    /// and expected start, until its own answer's events follow; a proxy in front with an idle
    /// timeout no longer cuts it while it waits. A refusal after that point is an error event in
    /// the API's shape, not a status. A request's `X-Slotgate-Keepalive-Ms` sets its own (0: none).
    /// `0s` turns it off (docs/scheduling.md#waiting-streams). [default: 0s]
    #[arg(long, env = "SLOTGATE_STREAM_KEEPALIVE", value_name = "DURATION")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_keepalive: Option<Dur>,

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

    /// In front of llama-server's router: whether its models take turns, one model decoding at a
    /// time. `auto`: while the loaded children's threads together exceed the CPUs (two models
    /// decoding at once then run several times slower than one after the other, docs/router.md);
    /// `off` for children that offload every layer to a GPU. [default: auto]
    #[arg(long, env = "SLOTGATE_MODEL_TURNS", value_name = "auto|on|off")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_turns: Option<ModelTurns>,

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

    /// The status of a refusal made because the server is too busy (a full queue, a wait past its
    /// timeout or deadline, a shed) on the Anthropic Messages API: 529 `overloaded_error`, as
    /// Anthropic answers; or 429 `rate_limit_error`, or 503. Claude Code gives up after three 529s
    /// in a row for its own flagship models, where it retries a 429 ten times; the Anthropic SDKs
    /// retry both alike (docs/sessions.md#overload-on-the-messages-api). [default: 529]
    #[arg(long, env = "SLOTGATE_MESSAGES_OVERLOAD_STATUS", value_name = "529|429|503")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_overload_status: Option<u16>,

    /// Open client connections across all listeners; past it, a connection is read briefly: a
    /// health probe (/health) is answered, any other request waits for a place. [default: 1024]
    #[arg(long, env = "SLOTGATE_MAX_CONNECTIONS", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,

    /// The most of --max-connections one peer holds (a TCP client's address, an IPv6 client's /64,
    /// a Unix client's uid; loopback included); past it, its connections get only health probes answered and any other
    /// request 429 `too_many_connections`. The admin listener's is the smaller of this and 16
    /// (docs/failure.md#connection-limits). [default: 256]
    #[arg(long, env = "SLOTGATE_MAX_CONNECTIONS_PER_PEER", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_peer: Option<usize>,

    /// Refusals of callers (no key, a made-up one, a network not allowed, a bad admin token) one
    /// peer may have at once; past them, and past --refusal-rate, its refusals are sent a second
    /// late, so a flood of made-up keys takes no CPU from the callers served (docs/security.md).
    /// [default: 100]
    #[arg(long, env = "SLOTGATE_REFUSAL_BURST", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal_burst: Option<u32>,

    /// Refusals a second one peer may have after its --refusal-burst; 0 sends none late. [default: 20.0]
    #[arg(long, env = "SLOTGATE_REFUSAL_RATE", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal_rate: Option<f64>,

    /// Who may use slotgate, checked before anything is counted, stored or queued (docs/keys.md):
    /// `keys`, a key slotgate issued (`slotgate key create`), whose tenant names the caller
    /// everywhere; `upstream`, whoever llama-server would let in (when it runs with --api-key, a
    /// key it refuses is refused here first); `open`, anyone (only where every peer is trusted).
    /// `upstream` is the default: nothing changes until you issue keys, and nobody gets in whom
    /// llama-server would refuse. [default: upstream]
    #[arg(long, env = "SLOTGATE_CLIENT_AUTH", value_name = "keys|upstream|open")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<crate::config::ClientAuth>,

    /// With --client-auth keys, Unix-socket peers let in without a key, each as a tenant:
    /// `UID=TENANT,...` (the uid as the kernel reports the peer). [default: none]
    #[arg(long, env = "SLOTGATE_CLIENT_AUTH_UIDS", value_name = "UID=TENANT,...")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth_uids: Option<crate::config::UidTenants>,

    /// The networks TCP callers of the client listeners may come from, checked before anything
    /// else: `CIDR,...` (`10.0.0.0/8,2001:db8::/32`, or single addresses); others get 403
    /// `source_not_allowed` in the API's shape. Unix-socket peers are local and always pass. A key
    /// may narrow it further (`key create --allow-from`). [default: any]
    #[arg(long, env = "SLOTGATE_ALLOW_FROM", value_name = "CIDR,...")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_from: Option<crate::config::Networks>,

    /// Keys kept in a file beside the ones `slotgate key create` issues: TOML, one `[[key]]` per
    /// key with its id, secret's digest and tenant (`slotgate key mint` prints one), re-read when
    /// it changes (every --policy-watch, and on SIGHUP); a file that does not read keeps the keys
    /// read before. For operators who keep configuration in git (docs/keys.md#a-keys-file).
    #[arg(long, env = "SLOTGATE_KEYS_FILE", value_name = "PATH")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_file: Option<PathBuf>,

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

    /// `slotgate wrap`: failed starts of llama-server in a row (each exiting within a minute, or
    /// not starting at all) after which slotgate gives up, prints its last lines and exits 1, so
    /// systemd or Kubernetes see the failure. 0: restart forever. [default: 5]
    #[arg(long, env = "SLOTGATE_WRAP_START_LIMIT", value_name = "N")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrap_start_limit: Option<u32>,

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
    /// of the fleet, on Redis or Valkey, through leases; see docs/fleet.md). TOML:
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

    /// Where the memory backend keeps policy budgets (buckets, windows) across restarts and crashes:
    /// a directory, `auto` (systemd's `$STATE_DIRECTORY`, else a directory named after the first
    /// --listen address in `$XDG_STATE_HOME/slotgate` or `~/.local/state/slotgate`, so each
    /// instance on a host has its own) or `off` (memory only: a restart gives every tenant a full
    /// budget). One slotgate per directory; made 0700 (state.redb 0600), and one that is a link,
    /// another user's or writable by others is refused. TOML: `state.dir`. [default: auto]
    #[arg(long = "state-dir", env = "SLOTGATE_STATE_DIR", value_name = "auto|off|DIR")]
    #[serde(skip)]
    pub state_dir: Option<StateDir>,

    /// How often changed budgets are written to `state.dir`, without the request path ever waiting
    /// for the disk: a SIGKILL or a power cut loses at most the charges of the last interval (and
    /// the write under way). TOML: `state.flush-interval`. [default: 100ms]
    #[arg(
        long = "state-flush-interval",
        env = "SLOTGATE_STATE_FLUSH_INTERVAL",
        value_name = "DURATION"
    )]
    #[serde(skip)]
    pub state_flush_interval: Option<Dur>,

    /// Days of the usage ledger kept (requests, tokens and cost per day, tenant, team, key and
    /// model; `GET /usage`): older days are dropped. TOML: `state.usage-retention-days`. [default: 400]
    #[arg(
        long = "state-usage-retention-days",
        env = "SLOTGATE_STATE_USAGE_RETENTION_DAYS",
        value_name = "DAYS"
    )]
    #[serde(skip)]
    pub state_usage_retention_days: Option<u32>,

    /// The time zone whose days the usage ledger's rows are (`Europe/Berlin`), as the quotas'
    /// calendar days can be. TOML: `state.usage-zone`. [default: UTC]
    #[arg(long = "state-usage-zone", env = "SLOTGATE_STATE_USAGE_ZONE", value_name = "ZONE")]
    #[serde(skip)]
    pub state_usage_zone: Option<super::state::Zone>,

    /// In front of llama-server's router: `[models."NAME"]` tables, one model's own slots, queue
    /// depth and queue timeout (NAME: an id or alias of the router's `/models`).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<std::collections::BTreeMap<String, ModelTable>>,

    /// Overload bands: `[bands.NAME]` tables, each a range of priorities with the most of the
    /// slots and queue places it may hold (docs/scheduling.md#overload-bands).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bands: Option<std::collections::BTreeMap<String, BandTable>>,

    /// Per-tenant caps: `[tenants."NAME"]` tables, each a tenant's own `max-in-service` and
    /// `max-waiting` (docs/scheduling.md#per-tenant-concurrency-cap).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<std::collections::BTreeMap<String, TenantTable>>,

    /// Per-team caps: `[teams."NAME"]` tables, each a team's `max-in-service`: the most requests
    /// of all its tenants in service at once (a key's `--team` names the team; docs/keys.md).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teams: Option<std::collections::BTreeMap<String, TeamTable>>,

    /// What tokens cost: the `[prices]` table, per million tokens of input, cached input and
    /// output, by model, with a default and a currency (docs/spend.md).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<super::prices::PricesTable>,

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
    /// engine); made 0700, and one that is a link, another user's or writable by others is
    /// refused. [default: off; modules are still cached in memory, so a reload only compiles what changed]
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
}

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

/// A `[models."NAME"]` table: what differs for one model behind llama-server's router.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ModelTable {
    /// Its requests forwarded at once (default: its child's `total_slots`, as `--slots auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<usize>,
    /// Places in its own queue (default: `queue-depth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<usize>,
    /// How long its requests may wait, loading included (default: `queue-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout: Option<Dur>,
}

/// A `[bands.NAME]` table: a class of work by its priorities, and its limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BandTable {
    /// Its priorities, `[lowest, highest]`, both included (lower is more urgent).
    pub priorities: [i64; 2],
    /// The most of the slots its requests may hold, a share in (0, 1] (at least one slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<f64>,
    /// The most of the queue places its requests may hold, a share in (0, 1] (at least one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<f64>,
}

impl Settings {
    /// Reads a TOML file of settings.
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_owned(), e))?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse(path.to_owned(), e.to_string()))
    }
}
