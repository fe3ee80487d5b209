//! OpenTelemetry traces, off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set (docs/observability.md#traces).
//!
//! Each request is a server span continuing the caller's W3C `traceparent`, with a child per phase
//! (`intake`, `count`, `policy`, `queue`, and the `upstream` client span whose context goes to
//! llama-server as its `traceparent`, with `first_token` as an event), GenAI semantic-convention
//! attributes and slotgate's own. The spans are `tracing` spans of target [`TARGET`], exported by
//! tracing-opentelemetry through the SDK's batch processor (a thread of its own, a bounded queue:
//! a slow collector drops spans, never blocks a request) over OTLP/HTTP with protobuf.
//!
//! Integers are recorded as `i64`: tracing-opentelemetry turns a `u64` into a string.
//!
//! Off, the global filter disables [`TARGET`] outright: every span macro of it is one disabled
//! callsite check, and nothing is registered.

use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the spans that are exported, and only of those.
pub const TARGET: &str = "slotgate::otel";

/// How long the exporter may take to send what is queued at exit.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether traces are on: an OTLP endpoint is set, and neither `OTEL_SDK_DISABLED=true` nor
/// `OTEL_TRACES_EXPORTER=none` says otherwise.
pub fn wanted() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT");
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    let none = std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none");
    endpoint && !disabled && !none
}

/// Why traces cannot be exported as configured.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0} is not supported: slotgate exports OTLP over HTTP with \
         protobuf (http/protobuf)"
    )]
    Protocol(String),
    #[error("the OTLP trace exporter could not be built: {0}")]
    Exporter(String),
}

/// The exporter, while traces are on; [`Traces::shutdown`] sends what is queued.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// The exporter as the standard `OTEL_*` variables configure it (the exporter reads
    /// `OTEL_EXPORTER_OTLP_{TRACES_,}{ENDPOINT,HEADERS,TIMEOUT}`, the SDK `OTEL_SERVICE_NAME`,
    /// `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)` and `OTEL_BSP_*`). The service is
    /// `slotgate` unless named.
    pub fn start() -> Result<Traces, OtelError> {
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Ok(p) = std::env::var(name) {
                if !p.trim().is_empty() && p.trim() != "http/protobuf" {
                    return Err(OtelError::Protocol(p));
                }
            }
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| OtelError::Exporter(e.to_string()))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("slotgate");
        }
        let resource = resource
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        Ok(Traces { provider })
    }

    /// The layer that turns [`TARGET`]'s spans into exported ones.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("slotgate"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TARGET, tracing::Level::TRACE),
            )
    }

    /// Sends what is still queued (at most [`SHUTDOWN_TIMEOUT`]) and stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(error = %e, "traces still queued at exit may be lost");
        }
    }
}

/// The request's server span: `METHOD path`, continuing the caller's `traceparent` (and
/// `tracestate`) when it sent one. Disabled (free) while traces are off.
pub fn request(method: &http::Method, path: &str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = tracing::field::Empty,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        "http.request.method" = method.as_str(),
        "url.path" = path,
        "http.response.status_code" = tracing::field::Empty,
        "slotgate.request_id" = tracing::field::Empty,
        "slotgate.outcome" = tracing::field::Empty,
        "slotgate.tenant" = tracing::field::Empty,
        "slotgate.priority" = tracing::field::Empty,
        "slotgate.queue_wait_ms" = tracing::field::Empty,
        "slotgate.retry_after" = tracing::field::Empty,
        "gen_ai.operation.name" = tracing::field::Empty,
        "gen_ai.provider.name" = tracing::field::Empty,
        "gen_ai.request.model" = tracing::field::Empty,
        "gen_ai.request.max_tokens" = tracing::field::Empty,
        "gen_ai.usage.input_tokens" = tracing::field::Empty,
        "gen_ai.usage.output_tokens" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    span.record("otel.name", format!("{} {path}", method.as_str()));
    if headers.contains_key("traceparent") {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let _ = span.set_parent(parent);
    }
    span
}

/// A phase of the request (`intake`, `count`, `policy`, `queue`): a child of `parent`, ended when
/// dropped.
pub fn phase(parent: &Span, name: &'static str) -> Span {
    if parent.is_disabled() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, parent: parent, "phase", otel.name = name)
}

/// The request to llama-server: a client span, `gen_ai.operation.name model`, whose context goes
/// to llama-server as `traceparent` (written into `headers`, replacing the caller's).
pub fn upstream(
    parent: &Span,
    dialect: Option<&str>,
    model: Option<&str>,
    headers: &mut http::HeaderMap,
) -> Span {
    if parent.is_disabled() {
        return Span::none();
    }
    let operation = dialect.map(operation);
    let name = match (operation, model) {
        (Some(op), Some(m)) => format!("{op} {m}"),
        (Some(op), None) => op.to_owned(),
        _ => "upstream".to_owned(),
    };
    let span = tracing::info_span!(
        target: TARGET,
        parent: parent,
        "upstream",
        otel.name = name,
        otel.kind = "client",
        "gen_ai.operation.name" = operation,
        "gen_ai.provider.name" = "llama.cpp",
        "gen_ai.request.model" = model,
        "http.response.status_code" = tracing::field::Empty,
        "gen_ai.usage.input_tokens" = tracing::field::Empty,
        "gen_ai.usage.output_tokens" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    headers.remove("tracestate");
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
    span
}

/// The first token (the first bytes of llama-server's answer) on the upstream span.
pub fn first_token(span: &Span) {
    if !span.is_disabled() {
        span.add_event("gen_ai.first_token", Vec::new());
    }
}

/// The GenAI operation name of a dialect (`dialect::Dialect::name`).
pub fn operation(dialect: &str) -> &'static str {
    match dialect {
        "chat" | "messages" | "responses" => "chat",
        "embeddings" => "embeddings",
        "rerank" => "rerank",
        _ => "text_completion",
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
