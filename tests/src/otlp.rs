//! An OTLP/HTTP trace receiver on a real TCP socket: the spans slotgate exports, kept for asserts.
//!
//! `POST /v1/traces` with `Content-Type: application/x-protobuf` (what opentelemetry-otlp's
//! `http-proto` sends) or `application/json` (OTLP/JSON) is decoded as an `ExportTraceServiceRequest`
//! and answered 200 with an empty `ExportTraceServiceResponse` in the same encoding. The exporter
//! compresses nothing unless told (`OTEL_EXPORTER_OTLP_COMPRESSION`), so a compressed body is refused
//! with 415 rather than decoded.
//!
//! The receiver runs on a thread of its own with its own runtime, so a test blocked in a
//! synchronous wait does not stall it:
//!
//! ```ignore
//! let otlp = OtlpReceiver::start();
//! let gate = Gate::new().env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp.endpoint()).start().await;
//! // ... requests ...
//! let spans = otlp.wait_for(|s| s.iter().any(|s| s.name == "upstream"), ms(5000)).await;
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span, status};
use prost::Message;
use serde_json::Value;

/// The OTLP/HTTP path for traces (the exporter appends it to `OTEL_EXPORTER_OTLP_ENDPOINT`).
pub const TRACES_PATH: &str = "/v1/traces";

/// The largest export body taken, the limit the OTLP/HTTP specification recommends.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One span as the receiver decoded it; ids are lowercase hex as in a `traceparent` header.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    /// The span's name (`otel.name` if the code set one, else the tracing span's name).
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, or empty for a root span.
    pub parent_span_id: String,
    /// `internal`, `server`, `client`, `producer`, `consumer` or `unspecified`.
    pub kind: String,
    /// When the span started, in nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// When the span ended, in nanoseconds since the Unix epoch.
    pub end_unix_nanos: u64,
    /// Strings, integers, doubles and booleans as JSON scalars; arrays and key-value lists as JSON
    /// arrays and objects; bytes as a hex string.
    pub attributes: BTreeMap<String, Value>,
    /// The span's events, in the order they were recorded.
    pub events: Vec<ReceivedEvent>,
    /// `unset`, `ok` or `error`.
    pub status: String,
    /// The status description (set only with `error`).
    pub status_message: String,
    /// The resource's `service.name`, empty if it had none.
    pub service_name: String,
    /// The instrumentation scope's name (the tracer's name).
    pub scope: String,
}

impl ReceivedSpan {
    /// The attribute `key`, if the span has it.
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }

    /// The string attribute `key`, if the span has it as a string.
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attr(key)?.as_str()
    }

    /// The integer attribute `key`, if the span has it as an integer.
    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attr(key)?.as_i64()
    }

    /// The span's events named `name`.
    pub fn events_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a ReceivedEvent> {
        self.events.iter().filter(move |e| e.name == name)
    }

    /// Wall time between start and end.
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.end_unix_nanos.saturating_sub(self.start_unix_nanos))
    }
}

/// An event recorded on a span.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedEvent {
    /// The event's name (a tracing event's message).
    pub name: String,
    /// When it was recorded, in nanoseconds since the Unix epoch.
    pub time_unix_nanos: u64,
    /// Mapped as [`ReceivedSpan::attributes`].
    pub attributes: BTreeMap<String, Value>,
}

/// One export request as it arrived, whatever it was answered.
#[derive(Clone, Debug)]
pub struct ReceivedExport {
    /// The request's headers (`OTEL_EXPORTER_OTLP_HEADERS` shows up here).
    pub headers: http::HeaderMap,
    /// The number of spans in it (0 if it could not be decoded).
    pub spans: usize,
    /// What the receiver answered.
    pub status: StatusCode,
}

#[derive(Default)]
struct Store {
    spans: Vec<ReceivedSpan>,
    exports: Vec<ReceivedExport>,
    /// Answer for the next exports instead of 200 (their spans are not kept).
    fail_with: Option<StatusCode>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("spans", &self.spans.len())
            .field("exports", &self.exports.len())
            .finish()
    }
}

/// A running OTLP/HTTP trace receiver on `127.0.0.1:<port>`; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    port: u16,
    store: Arc<Mutex<Store>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Binds `127.0.0.1:0` and serves on a thread of its own (callable with or without a runtime).
    pub fn start() -> OtlpReceiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("otlp receiver bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("local addr").port();
        let store = Arc::new(Mutex::new(Store::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let served = store.clone();
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("otlp receiver runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    tokio::select! {
                        () = accept_loop(listener, served) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here ends every connection task.
            })
            .expect("spawn otlp receiver");
        OtlpReceiver {
            port,
            store,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The base URL for `OTEL_EXPORTER_OTLP_ENDPOINT`: `http://127.0.0.1:PORT` (no path).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The full traces URL, for `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as given, no path added).
    pub fn traces_endpoint(&self) -> String {
        format!("{}{TRACES_PATH}", self.endpoint())
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store.lock().unwrap().spans.clone()
    }

    /// Every export request received so far, in arrival order.
    pub fn exports(&self) -> Vec<ReceivedExport> {
        self.store.lock().unwrap().exports.clone()
    }

    /// Answer the next exports `status` (e.g. 503) instead of 200, keeping none of their spans;
    /// `None` goes back to accepting.
    pub fn fail_with(&self, status: Option<StatusCode>) {
        self.store.lock().unwrap().fail_with = status;
    }

    /// Waits until `done` holds for the spans received so far and returns them; panics after
    /// `timeout` listing what did arrive. Polls, so it never holds the store across an await.
    pub async fn wait_for(
        &self,
        mut done: impl FnMut(&[ReceivedSpan]) -> bool,
        timeout: Duration,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if Instant::now() >= deadline {
                panic!("{}", self.timed_out(timeout, &spans));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn timed_out(&self, timeout: Duration, spans: &[ReceivedSpan]) -> String {
        let names: Vec<String> = spans
            .iter()
            .map(|s| format!("{} ({}/{})", s.name, s.trace_id, s.span_id))
            .collect();
        format!(
            "timed out after {timeout:?} waiting for spans at {}; {} exports, {} spans: {names:?}",
            self.endpoint(),
            self.store.lock().unwrap().exports.len(),
            spans.len()
        )
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A W3C `traceparent` value taken apart: version `00`, lowercase hex ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traceparent {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits: the caller's span, the parent of the callee's.
    pub span_id: String,
    /// The `sampled` trace flag.
    pub sampled: bool,
}

impl Traceparent {
    /// Parses `00-<32 hex>-<16 hex>-<2 hex>`; `None` for anything else.
    pub fn parse(value: &str) -> Option<Traceparent> {
        let mut parts = value.trim().split('-');
        let (version, trace_id, span_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if parts.next().is_some() || version != "00" || !hex(trace_id, 32) || !hex(span_id, 16) {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16)
            .ok()
            .filter(|_| flags.len() == 2)?;
        Some(Traceparent {
            trace_id: trace_id.to_owned(),
            span_id: span_id.to_owned(),
            sampled: flags & 1 == 1,
        })
    }

    /// The header value, sampled flag set or not.
    pub fn header(&self) -> String {
        let flags = if self.sampled { "01" } else { "00" };
        format!("00-{}-{}-{flags}", self.trace_id, self.span_id)
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, store: Arc<Mutex<Store>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let store = store.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let store = store.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&store, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Protobuf,
    Json,
}

async fn handle(store: &Mutex<Store>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != TRACES_PATH {
        return plain(StatusCode::NOT_FOUND, "only POST /v1/traces is served");
    }
    if req.method() != Method::POST {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "POST only");
    }
    let headers = req.headers().clone();
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    let encoding = match media.as_deref() {
        Some("application/x-protobuf") => Encoding::Protobuf,
        Some("application/json") => Encoding::Json,
        _ => return record(store, headers, 0, unsupported("content type")),
    };
    let compressed = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.eq_ignore_ascii_case("identity"));
    if compressed {
        return record(store, headers, 0, unsupported("content encoding"));
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return record(
                store,
                headers,
                0,
                plain(StatusCode::BAD_REQUEST, e.to_string()),
            )
        }
    };
    let decoded = match encoding {
        Encoding::Protobuf => ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string()),
        Encoding::Json => serde_json::from_slice(&body).map_err(|e| e.to_string()),
    };
    let export = match decoded {
        Ok(r) => r,
        Err(e) => {
            let resp = plain(
                StatusCode::BAD_REQUEST,
                format!("not an ExportTraceServiceRequest: {e}"),
            );
            return record(store, headers, 0, resp);
        }
    };
    let spans = flatten(export);
    let mut s = store.lock().unwrap();
    let count = spans.len();
    let status = s.fail_with.unwrap_or(StatusCode::OK);
    s.exports.push(ReceivedExport {
        headers,
        spans: count,
        status,
    });
    if status != StatusCode::OK {
        return plain(status, "failing on purpose");
    }
    s.spans.extend(spans);
    drop(s);
    let answer = ExportTraceServiceResponse::default();
    let (content_type, body) = match encoding {
        Encoding::Protobuf => (
            "application/x-protobuf",
            Bytes::from(answer.encode_to_vec()),
        ),
        Encoding::Json => ("application/json", Bytes::from_static(b"{}")),
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body))
        .expect("valid response")
}

fn record(
    store: &Mutex<Store>,
    headers: http::HeaderMap,
    spans: usize,
    resp: Response<Full<Bytes>>,
) -> Response<Full<Bytes>> {
    store.lock().unwrap().exports.push(ReceivedExport {
        headers,
        spans,
        status: resp.status(),
    });
    resp
}

fn unsupported(what: &str) -> Response<Full<Bytes>> {
    plain(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("unsupported {what}: send uncompressed application/x-protobuf or application/json"),
    )
}

fn plain(status: StatusCode, text: impl Into<String>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(text.into())))
        .expect("valid response")
}

fn flatten(export: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in export.resource_spans {
        let resource = rs
            .resource
            .map(|r| attributes(r.attributes))
            .unwrap_or_default();
        let service_name = resource
            .get("service.name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        for ss in rs.scope_spans {
            let scope = ss.scope.map(|s| s.name).unwrap_or_default();
            for sp in ss.spans {
                let status = sp.status.unwrap_or_default();
                out.push(ReceivedSpan {
                    name: sp.name,
                    trace_id: hex(&sp.trace_id),
                    span_id: hex(&sp.span_id),
                    parent_span_id: hex(&sp.parent_span_id),
                    kind: kind_name(sp.kind),
                    start_unix_nanos: sp.start_time_unix_nano,
                    end_unix_nanos: sp.end_time_unix_nano,
                    attributes: attributes(sp.attributes),
                    events: sp
                        .events
                        .into_iter()
                        .map(|e| ReceivedEvent {
                            name: e.name,
                            time_unix_nanos: e.time_unix_nano,
                            attributes: attributes(e.attributes),
                        })
                        .collect(),
                    status: match status::StatusCode::try_from(status.code) {
                        Ok(status::StatusCode::Ok) => "ok",
                        Ok(status::StatusCode::Error) => "error",
                        _ => "unset",
                    }
                    .to_owned(),
                    status_message: status.message,
                    service_name: service_name.clone(),
                    scope: scope.clone(),
                });
            }
        }
    }
    out
}

fn kind_name(kind: i32) -> String {
    match span::SpanKind::try_from(kind) {
        Ok(span::SpanKind::Internal) => "internal",
        Ok(span::SpanKind::Server) => "server",
        Ok(span::SpanKind::Client) => "client",
        Ok(span::SpanKind::Producer) => "producer",
        Ok(span::SpanKind::Consumer) => "consumer",
        _ => "unspecified",
    }
    .to_owned()
}

fn attributes(kvs: Vec<KeyValue>) -> BTreeMap<String, Value> {
    kvs.into_iter()
        .map(|kv| (kv.key, kv.value.map_or(Value::Null, value)))
        .collect()
}

fn value(v: AnyValue) -> Value {
    match v.value {
        Some(any_value::Value::StringValue(s)) => Value::String(s),
        Some(any_value::Value::BoolValue(b)) => Value::Bool(b),
        Some(any_value::Value::IntValue(i)) => Value::from(i),
        // NaN and infinities have no JSON number: they become null.
        Some(any_value::Value::DoubleValue(d)) => Value::from(d),
        Some(any_value::Value::ArrayValue(a)) => {
            Value::Array(a.values.into_iter().map(value).collect())
        }
        Some(any_value::Value::KvlistValue(l)) => {
            Value::Object(attributes(l.values).into_iter().collect())
        }
        Some(any_value::Value::BytesValue(b)) => Value::String(hex(&b)),
        // An index into a profiles string table; spans never carry it.
        Some(any_value::Value::StringValueStrindex(i)) => Value::from(i),
        None => Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

    fn kv(key: &str, v: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    fn request() -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv(
                        "service.name",
                        any_value::Value::StringValue("slotgate".into()),
                    )],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "slotgate".into(),
                        ..Default::default()
                    }),
                    spans: vec![Span {
                        trace_id: (1..=16).collect(),
                        span_id: vec![0xab; 8],
                        parent_span_id: vec![0x01; 8],
                        name: "POST /v1/chat/completions".into(),
                        kind: span::SpanKind::Server as i32,
                        start_time_unix_nano: 1_000,
                        end_time_unix_nano: 3_000,
                        attributes: vec![
                            kv("s", any_value::Value::StringValue("x".into())),
                            kv("i", any_value::Value::IntValue(42)),
                            kv("d", any_value::Value::DoubleValue(0.5)),
                            kv("b", any_value::Value::BoolValue(true)),
                        ],
                        events: vec![span::Event {
                            time_unix_nano: 2_000,
                            name: "first_token".into(),
                            attributes: vec![kv("n", any_value::Value::IntValue(1))],
                            dropped_attributes_count: 0,
                        }],
                        status: Some(Status {
                            message: "boom".into(),
                            code: status::StatusCode::Error as i32,
                        }),
                        ..Default::default()
                    }],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }

    async fn post(url: &str, content_type: &str, body: Vec<u8>) -> (StatusCode, Bytes) {
        let uri: http::Uri = url.parse().unwrap();
        let stream = tokio::net::TcpStream::connect((uri.host().unwrap(), uri.port_u16().unwrap()))
            .await
            .unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::post(uri.path())
            .header(header::HOST, uri.authority().unwrap().as_str())
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    }

    fn check(spans: &[ReceivedSpan]) {
        assert_eq!(spans.len(), 1, "{spans:?}");
        let s = &spans[0];
        assert_eq!(s.name, "POST /v1/chat/completions");
        assert_eq!(s.trace_id, "0102030405060708090a0b0c0d0e0f10");
        assert_eq!(s.span_id, "abababababababab");
        assert_eq!(s.parent_span_id, "0101010101010101");
        assert_eq!(s.kind, "server");
        assert_eq!(s.duration(), Duration::from_nanos(2_000));
        assert_eq!(s.attr_str("s"), Some("x"));
        assert_eq!(s.attr_i64("i"), Some(42));
        assert_eq!(s.attr("d"), Some(&serde_json::json!(0.5)));
        assert_eq!(s.attr("b"), Some(&Value::Bool(true)));
        assert_eq!(s.events_named("first_token").count(), 1);
        assert_eq!(s.events[0].attributes["n"], serde_json::json!(1));
        assert_eq!(
            (s.status.as_str(), s.status_message.as_str()),
            ("error", "boom")
        );
        assert_eq!(s.service_name, "slotgate");
        assert_eq!(s.scope, "slotgate");
    }

    #[tokio::test]
    async fn decodes_protobuf_and_answers_an_empty_response() {
        let otlp = OtlpReceiver::start();
        let (status, body) = post(
            &otlp.traces_endpoint(),
            "application/x-protobuf",
            request().encode_to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            ExportTraceServiceResponse::decode(body).unwrap(),
            ExportTraceServiceResponse::default()
        );
        check(
            &otlp
                .wait_for(|s| !s.is_empty(), Duration::from_secs(5))
                .await,
        );
    }

    #[tokio::test]
    async fn decodes_json() {
        let otlp = OtlpReceiver::start();
        let json = serde_json::to_vec(&request()).unwrap();
        let (status, _) = post(&otlp.traces_endpoint(), "application/json", json).await;
        assert_eq!(status, StatusCode::OK);
        check(&otlp.spans());
    }

    /// The OTLP/JSON example of the specification (hex ids, integer kind, string nanos).
    #[tokio::test]
    async fn decodes_the_specifications_json_example() {
        let otlp = OtlpReceiver::start();
        let json = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"my.service"}}]},
            "scopeSpans":[{"scope":{"name":"my.library","version":"1.0.0"},"spans":[{
            "traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","parentSpanId":"EEE19B7EC3C1B173",
            "name":"I'm a server span","startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000",
            "kind":2,"attributes":[{"key":"my.span.attr","value":{"stringValue":"some value"}},
            {"key":"n","value":{"intValue":"7"}}]}]}]}]}"#;
        let (status, body) = post(
            &otlp.traces_endpoint(),
            "application/json; charset=utf-8",
            json.into(),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body:?}");
        let s = &otlp.spans()[0];
        assert_eq!(s.trace_id, "5b8efff798038103d269b633813fc60c");
        assert_eq!(s.parent_span_id, "eee19b7ec3c1b173");
        assert_eq!(
            (s.kind.as_str(), s.service_name.as_str()),
            ("server", "my.service")
        );
        assert_eq!(s.attr_i64("n"), Some(7));
        assert_eq!(s.duration(), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_read_and_can_fail_on_purpose() {
        let otlp = OtlpReceiver::start();
        let url = otlp.traces_endpoint();
        let (status, _) = post(&url, "text/plain", b"x".to_vec()).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let (status, _) = post(&url, "application/x-protobuf", b"\xff\xff".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = post(
            &format!("{}/v1/logs", otlp.endpoint()),
            "application/x-protobuf",
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        otlp.fail_with(Some(StatusCode::SERVICE_UNAVAILABLE));
        let (status, _) = post(&url, "application/x-protobuf", request().encode_to_vec()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(otlp.spans().is_empty());
        let statuses: Vec<u16> = otlp.exports().iter().map(|e| e.status.as_u16()).collect();
        assert_eq!(statuses, [415, 400, 503]);
    }

    #[test]
    fn traceparent_round_trips() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let parsed = Traceparent::parse(tp).unwrap();
        assert_eq!(parsed.trace_id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(parsed.span_id, "b7ad6b7169203331");
        assert!(parsed.sampled);
        assert_eq!(parsed.header(), tp);
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7-b7-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
        ] {
            assert_eq!(Traceparent::parse(bad), None, "{bad}");
        }
    }
}
