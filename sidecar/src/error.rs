//! Why a request did not get a normal upstream answer. Each variant knows its HTTP status, its
//! OpenAI error type and code, and the `outcome` label it is counted under.

use std::time::Duration;

/// The request-path error. `respond::error` is the one place that turns it into a response.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("no such endpoint: {method} {path} (slotgate forwards every route llama-server serves; see docs/endpoints.md)")]
    NotFound { method: String, path: String },
    #[error("slotgate serves {method} {path} on its admin listener only: it shows or changes the whole llama-server, not one request; its group in --client-admin-routes forwards it here too (docs/endpoints.md)")]
    AdminOnly { method: String, path: String },
    #[error("slotgate refuses {method} {path}: llama-server's built-in tools and CORS proxy act on the host (read and write files, run commands, fetch URLs); start slotgate with --forward-host-endpoints to forward them")]
    HostEndpoint { method: String, path: String },
    #[error("the model `{model}` is not one llama-server's router serves (it serves: {})", .known.join(", "))]
    ModelNotFound { model: String, known: Vec<String> },
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("request body is larger than the {limit}-byte limit")]
    BodyTooLarge { limit: usize },
    #[error("request body was not received within {0:?}")]
    BodyTimeout(Duration),
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    #[error("request body is not a valid JSON object: {0}")]
    InvalidJson(String),
    // llama-server's own words for this refusal (`exceed_context_size_error`), so a client reads one
    // error whoever refused.
    #[error("request ({prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it")]
    ContextTooLong { prompt: u64, n_ctx: u64 },
    #[error("the request asks for {asked} completions at once; this llama-server runs {slots} slots (n must be between 1 and {slots})")]
    TooManyCompletions { asked: u64, slots: u64 },
    // The queue's refusals carry its estimate unrounded: `Retry-After` gets whole seconds,
    // `retry-after-ms` the milliseconds.
    #[error("the queue is full ({depth} waiting); retry after {}s", whole_seconds(.retry_after))]
    QueueFull { depth: usize, retry_after: Duration },
    #[error(
        "this tenant already has {waiting} requests waiting, its share of the queue; retry after {}s",
        whole_seconds(.retry_after)
    )]
    TenantQueueFull {
        waiting: usize,
        retry_after: Duration,
    },
    #[error(
        "this tenant is at its concurrency cap ({in_service} in service, {waiting} waiting); retry after {}s",
        whole_seconds(.retry_after)
    )]
    TenantBusy {
        in_service: usize,
        waiting: usize,
        retry_after: Duration,
    },
    #[error(
        "requests of band `{band}` already hold its share of the queue ({waiting} waiting); the other places are kept for other work; retry after {}s",
        whole_seconds(.retry_after)
    )]
    BandQueueFull {
        band: String,
        waiting: usize,
        retry_after: Duration,
    },
    #[error(
        "a more urgent request took this request's place in the queue; retry after {}s",
        whole_seconds(.retry_after)
    )]
    Displaced { retry_after: Duration },
    #[error(
        "the estimated wait for a slot ({estimate}s) is longer than the queue timeout ({limit}s); retry after {}s",
        whole_seconds(.retry_after)
    )]
    WaitTooLong {
        estimate: u64,
        limit: u64,
        retry_after: Duration,
    },
    #[error("waited {0:?} in the queue without getting a slot")]
    QueueTimeout(Duration),
    #[error("waited {:.1}s in the queue and reached the request's deadline without getting a slot; it was not sent to llama-server", .0.as_secs_f64())]
    DeadlineExceeded(Duration),
    #[error(
        "the estimated wait for a slot ({:.1}s) is longer than the request's deadline ({:.1}s left); retry after {}s",
        .estimate.as_secs_f64(), .deadline.as_secs_f64(), whole_seconds(.retry_after)
    )]
    DeadlineUnreachable {
        estimate: Duration,
        deadline: Duration,
        retry_after: Duration,
    },
    #[error("{0}")]
    InvalidDeadline(String),
    /// One of slotgate's request headers that is not what it must be (other than a deadline).
    #[error("{0}")]
    InvalidHeader(String),
    /// Credentials that could be read two ways (see `pipeline::caller`).
    #[error("{0}")]
    AmbiguousCredentials(String),
    // Only ever the body of the error event that ends a shed stream (the status line went out
    // with the answer's beginning).
    #[error(
        "this sheddable request yielded its slot to a more urgent one and its answer was ended here; retry after {}s",
        whole_seconds(.retry_after)
    )]
    Shed { retry_after: Duration },
    /// In front of a router that loads models only when asked (`--no-models-autoload`, or the
    /// request's `?autoload=false`): a request for a model not loaded, refused as the router
    /// refuses it.
    #[error("model is not loaded")]
    ModelNotLoaded,
    /// In front of a router with API keys, a request whose model slotgate would load for it
    /// but whose credentials llama-server refuses: refused as llama-server refuses it.
    #[error("Invalid API Key")]
    InvalidApiKey,
    /// `--client-auth keys`: no key slotgate issued, or one revoked or expired (see `keys`).
    #[error("{}", match .0 {
        KeyProblem::Missing => "You didn't provide an API key. Send the key slotgate issued you in an `Authorization: Bearer` or `x-api-key` header.",
        KeyProblem::Unknown => "Incorrect API key provided. Ask your operator for a key (`slotgate key create`).",
        KeyProblem::Revoked => "This API key was revoked. Ask your operator for a new one.",
        KeyProblem::Expired => "This API key has expired. Ask your operator for a new one.",
    })]
    Unauthorized(KeyProblem),
    /// `--allow-from`, or the key's `allow_from`: a TCP peer outside the networks it may call
    /// from, refused before anything is counted or kept.
    #[error("Requests from {addr} are not allowed{}. Ask your operator to allow your network.", if *.by_key { " for this API key" } else { "" })]
    SourceNotAllowed {
        addr: std::net::IpAddr,
        by_key: bool,
    },
    /// `--client-auth keys`: a model outside the key's scope, in OpenAI's words for a model a key
    /// cannot use.
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotAllowed(String),
    /// A request naming a conversation, ended while it waited by llama-server's stop route
    /// (`DELETE /v1/stream?conv_id=`), in the words of llama-server's router for the requests it
    /// parks while it loads their model.
    #[error("request cancelled by a stop while {}", if *.loading { "the model was loading" } else { "it waited for a slot" })]
    Stopped { loading: bool },
    /// A resume (`GET /v1/stream?conv_id=`) of a conversation whose request still waits here: as
    /// llama-server's router answers while it loads that request's model.
    #[error("Stream owner {}, retry later", if *.loading { "model is loading" } else { "request is waiting for a slot" })]
    StreamPending { loading: bool },
    #[error("llama-server did not begin its answer within {0:?} (upstream first-byte timeout)")]
    UpstreamTimeout(Duration),
    #[error("the upstream did not become available before the request's deadline: {reason}")]
    UpstreamUnavailable { reason: String, retry_after: u64 },
    #[error("the model `{model}` could not be loaded by llama-server's router ({reason}); retry after {}s", whole_seconds(.retry_after))]
    ModelUnavailable {
        model: String,
        reason: String,
        retry_after: Duration,
    },
    #[error("upstream request failed: {0}")]
    Upstream(String),
    #[error("slotgate is shutting down")]
    ShuttingDown { retry_after: u64 },
    /// The start is not done: the listeners are bound, the policies still compiling (`doing`).
    #[error("slotgate is starting: {doing}; retry in a moment")]
    Starting { doing: String },
    #[error("{message}")]
    PolicyDenied {
        policy: String,
        status: u16,
        message: String,
        retry_after: Option<u64>,
        /// The policy's error code and the headers its denial carries.
        detail: Box<DenialDetail>,
    },
    #[error(
        "admission policy `{policy}` failed ({kind}); the request was refused (on-error = deny)"
    )]
    PolicyFailed { policy: String, kind: &'static str },
}

/// Why a caller's key was not let in (`--client-auth keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyProblem {
    Missing,
    Unknown,
    Revoked,
    Expired,
}

/// What a policy's denial says beyond its status and message.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DenialDetail {
    /// The error code the client reads (`quota_exceeded`), instead of `policy_denied`.
    pub reason: Option<String>,
    /// Response headers: the policy's, its `x-should-retry`, the rate-limit headers.
    pub headers: std::collections::BTreeMap<String, String>,
}

/// The `outcome` label of `slotgate_requests_total` and of the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    BadRequest,
    QueueFull,
    TenantQueueFull,
    Displaced,
    WaitTooLong,
    QueueTimeout,
    ClientGone,
    ClientStalled,
    UpstreamError,
    UpstreamTimeout,
    /// llama-server answered with a status of 500 or more.
    Upstream5xx,
    /// llama-server refused the request itself (400 to 499).
    Upstream4xx,
    ShuttingDown,
    /// Cut by the shutdown: still in service when the drain timeout ran out (or a second signal
    /// came); the client had not left.
    DrainTimeout,
    PolicyDenied,
    PolicyError,
    DeadlineExceeded,
    BandQueueFull,
    /// A sheddable request's answer, ended after its first byte for a more urgent request.
    Shed,
    /// Refused at arrival: its tenant at its concurrency cap.
    TenantBusy,
    /// Refused at arrival: no key slotgate let in (`--client-auth keys`).
    Unauthorized,
}

impl Outcome {
    pub const ALL: [Outcome; 22] = [
        Outcome::Ok,
        Outcome::BadRequest,
        Outcome::QueueFull,
        Outcome::TenantQueueFull,
        Outcome::Displaced,
        Outcome::WaitTooLong,
        Outcome::QueueTimeout,
        Outcome::ClientGone,
        Outcome::ClientStalled,
        Outcome::UpstreamError,
        Outcome::UpstreamTimeout,
        Outcome::Upstream5xx,
        Outcome::Upstream4xx,
        Outcome::ShuttingDown,
        Outcome::DrainTimeout,
        Outcome::PolicyDenied,
        Outcome::PolicyError,
        Outcome::DeadlineExceeded,
        Outcome::BandQueueFull,
        Outcome::Shed,
        Outcome::TenantBusy,
        Outcome::Unauthorized,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::BadRequest => "bad_request",
            Outcome::QueueFull => "queue_full",
            Outcome::TenantQueueFull => "tenant_queue_full",
            Outcome::Displaced => "displaced",
            Outcome::WaitTooLong => "wait_too_long",
            Outcome::QueueTimeout => "queue_timeout",
            Outcome::ClientGone => "client_gone",
            Outcome::ClientStalled => "client_stalled",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::Upstream5xx => "upstream_5xx",
            Outcome::Upstream4xx => "upstream_4xx",
            Outcome::ShuttingDown => "shutting_down",
            Outcome::DrainTimeout => "drain_timeout",
            Outcome::PolicyDenied => "policy_denied",
            Outcome::PolicyError => "policy_error",
            Outcome::DeadlineExceeded => "deadline_exceeded",
            Outcome::BandQueueFull => "band_queue_full",
            Outcome::Shed => "shed",
            Outcome::TenantBusy => "tenant_busy",
            Outcome::Unauthorized => "unauthorized",
        }
    }
}

/// What a client reads of one refusal, and what it is counted as: a row of [`GateError::row`].
#[derive(Debug, Clone, Copy)]
struct Row {
    status: u16,
    /// OpenAI's `error.type`.
    error_type: &'static str,
    /// OpenAI's `error.code`.
    code: &'static str,
    outcome: Outcome,
}

const fn row(status: u16, error_type: &'static str, code: &'static str, outcome: Outcome) -> Row {
    Row {
        status,
        error_type,
        code,
        outcome,
    }
}

const INVALID: &str = "invalid_request_error";
const RATE: &str = "rate_limit_error";
const TIMEOUT: &str = "timeout_error";
const SERVER: &str = "server_error";
const PERMISSION: &str = "permission_error";

/// How long a refused client should wait before it tries again.
enum Wait {
    /// The queue's estimate, unrounded.
    Estimate(Duration),
    /// Whole seconds.
    Seconds(u64),
}

impl GateError {
    /// The one table of refusals: each variant's status, error type, code and outcome.
    fn row(&self) -> Row {
        use GateError as E;
        use Outcome as O;
        match self {
            E::NotFound { .. } => row(404, "not_found_error", "not_found", O::BadRequest),
            E::ModelNotFound { .. } => row(404, INVALID, "model_not_found", O::BadRequest),
            E::AdminOnly { .. } => row(403, PERMISSION, "admin_endpoint", O::BadRequest),
            E::HostEndpoint { .. } => row(403, PERMISSION, "host_endpoint", O::BadRequest),
            E::MethodNotAllowed { .. } => row(405, INVALID, "method_not_allowed", O::BadRequest),
            E::BodyTooLarge { .. } => row(413, INVALID, "body_too_large", O::BadRequest),
            E::BodyTimeout(_) => row(408, INVALID, "body_timeout", O::BadRequest),
            E::BodyRead(_) => row(400, INVALID, "body_read_error", O::BadRequest),
            E::InvalidJson(_) => row(400, INVALID, "invalid_json", O::BadRequest),
            E::InvalidDeadline(_) => row(400, INVALID, "invalid_deadline", O::BadRequest),
            E::InvalidHeader(_) => row(400, INVALID, "invalid_header", O::BadRequest),
            E::AmbiguousCredentials(_) => row(400, INVALID, "ambiguous_credentials", O::BadRequest),
            E::ContextTooLong { .. } => row(
                400,
                "exceed_context_size_error",
                "context_length_exceeded",
                O::BadRequest,
            ),
            E::TooManyCompletions { .. } => {
                row(400, INVALID, "too_many_completions", O::BadRequest)
            }
            E::QueueFull { .. } => row(429, RATE, "queue_full", O::QueueFull),
            E::TenantQueueFull { .. } => row(429, RATE, "tenant_queue_full", O::TenantQueueFull),
            E::TenantBusy { .. } => row(429, RATE, "tenant_busy", O::TenantBusy),
            E::BandQueueFull { .. } => row(429, RATE, "band_queue_full", O::BandQueueFull),
            E::Displaced { .. } => row(429, RATE, "displaced", O::Displaced),
            E::WaitTooLong { .. } => row(429, RATE, "estimated_wait_too_long", O::WaitTooLong),
            E::DeadlineUnreachable { .. } => row(429, RATE, "deadline_unreachable", O::WaitTooLong),
            E::ModelNotLoaded => row(400, INVALID, "model_not_loaded", O::BadRequest),
            E::InvalidApiKey => row(
                401,
                "authentication_error",
                "invalid_api_key",
                O::Upstream4xx,
            ),
            E::Unauthorized(_) => row(401, INVALID, "invalid_api_key", O::Unauthorized),
            E::SourceNotAllowed { .. } => {
                row(403, PERMISSION, "source_not_allowed", O::Unauthorized)
            }
            E::ModelNotAllowed(_) => row(404, INVALID, "model_not_found", O::BadRequest),
            E::Stopped { .. } => row(400, INVALID, "stream_stopped", O::ClientGone),
            E::StreamPending { .. } => {
                row(503, "unavailable_error", "stream_pending", O::Upstream5xx)
            }
            E::QueueTimeout(_) => row(504, TIMEOUT, "queue_timeout", O::QueueTimeout),
            E::DeadlineExceeded(_) => row(504, TIMEOUT, "deadline_exceeded", O::DeadlineExceeded),
            E::UpstreamTimeout(_) => row(504, TIMEOUT, "upstream_timeout", O::UpstreamTimeout),
            E::Upstream(_) => row(502, SERVER, "upstream_error", O::UpstreamError),
            E::UpstreamUnavailable { .. } => {
                row(503, SERVER, "upstream_unavailable", O::UpstreamError)
            }
            E::ModelUnavailable { .. } => row(503, SERVER, "model_unavailable", O::UpstreamError),
            E::ShuttingDown { .. } => row(503, SERVER, "shutting_down", O::ShuttingDown),
            // Never counted: nothing is, before the start is done (`app::starting`).
            E::Starting { .. } => row(503, SERVER, "starting", O::ShuttingDown),
            E::Shed { .. } => row(503, SERVER, "shed", O::Shed),
            E::PolicyFailed { .. } => row(503, SERVER, "policy_error", O::PolicyError),
            // A policy names its own status; its 429 reads as a rate limit.
            E::PolicyDenied { status: 429, .. } => row(429, RATE, "policy_denied", O::PolicyDenied),
            E::PolicyDenied { status, .. } => {
                row(*status, PERMISSION, "policy_denied", O::PolicyDenied)
            }
        }
    }

    pub fn status(&self) -> u16 {
        self.row().status
    }

    /// A refusal of the caller itself, before anything was charged: no key or one not taken, a
    /// network not allowed, credentials read two ways (held back for a peer refused too often,
    /// `server::tarpit`).
    pub fn refuses_caller(&self) -> bool {
        matches!(
            self,
            GateError::Unauthorized(_)
                | GateError::InvalidApiKey
                | GateError::SourceNotAllowed { .. }
                | GateError::AmbiguousCredentials(_)
        )
    }

    /// OpenAI's `error.type`.
    pub fn error_type(&self) -> &'static str {
        self.row().error_type
    }

    /// The `error.code` the client reads: [`GateError::code`], or a denying policy's own reason.
    pub fn client_code(&self) -> &str {
        match self {
            GateError::PolicyDenied { detail, .. } => {
                detail.reason.as_deref().unwrap_or(self.code())
            }
            _ => self.code(),
        }
    }

    /// OpenAI's `error.code`: a stable string clients can switch on.
    pub fn code(&self) -> &'static str {
        self.row().code
    }

    /// The server as a whole is too busy for it (as opposed to its tenant's own share, a policy's
    /// budget or a fault): what Anthropic's API answers 529 `overloaded_error` for.
    pub fn is_overload(&self) -> bool {
        matches!(
            self,
            GateError::QueueFull { .. }
                | GateError::BandQueueFull { .. }
                | GateError::Displaced { .. }
                | GateError::WaitTooLong { .. }
                | GateError::DeadlineUnreachable { .. }
                | GateError::Shed { .. }
        )
    }

    pub fn outcome(&self) -> Outcome {
        self.row().outcome
    }

    /// How long to wait before trying again, where retrying can help.
    fn wait(&self) -> Option<Wait> {
        use GateError as E;
        match self {
            E::QueueFull { retry_after, .. }
            | E::TenantQueueFull { retry_after, .. }
            | E::TenantBusy { retry_after, .. }
            | E::BandQueueFull { retry_after, .. }
            | E::Displaced { retry_after }
            | E::WaitTooLong { retry_after, .. }
            | E::DeadlineUnreachable { retry_after, .. }
            | E::Shed { retry_after }
            | E::ModelUnavailable { retry_after, .. } => Some(Wait::Estimate(*retry_after)),
            E::UpstreamUnavailable { retry_after, .. } | E::ShuttingDown { retry_after } => {
                Some(Wait::Seconds(*retry_after))
            }
            E::Starting { .. } => Some(Wait::Seconds(1)),
            E::PolicyDenied { retry_after, .. } => retry_after.map(Wait::Seconds),
            _ => None,
        }
    }

    /// Whole seconds for `Retry-After`, where retrying can help: rounded up, at least 1 (RFC 9110
    /// allows no fraction).
    pub fn retry_after(&self) -> Option<u64> {
        Some(match self.wait()? {
            Wait::Estimate(d) => whole_seconds(&d),
            Wait::Seconds(s) => s.max(1),
        })
    }

    /// Milliseconds for `retry-after-ms` (read before `Retry-After` by the OpenAI SDKs): the queue's
    /// estimate unrounded, else the whole seconds. Always within the second before `Retry-After`:
    /// `Retry-After - 1 < ms / 1000 <= Retry-After`, and at least 1.
    pub fn retry_after_ms(&self) -> Option<u64> {
        Some(match self.wait()? {
            Wait::Estimate(d) => {
                let ms = d.as_nanos().div_ceil(1_000_000);
                u64::try_from(ms).unwrap_or(u64::MAX).max(1)
            }
            Wait::Seconds(s) => s.max(1).saturating_mul(1000),
        })
    }
}

/// `d` in whole seconds, rounded up, at least 1: what `Retry-After` says.
fn whole_seconds(d: &Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}
