//! A fake llama-server on a Unix socket: scripted timing, honest concurrency and cancellation counts.
//!
//! Requests steer their own answer through body fields the fake reads:
//! - `fake_tag` (string or number): echoed back as `"fake_tag"` in every JSON object and SSE chunk;
//! - `fake_delay_ms`: service time of a non-stream answer (default: the builder's `.delay()`);
//! - `fake_chunks` (count) and `fake_chunk_delay_ms`: shape of a `"stream": true` answer;
//! - `fake_linger_ms`: how long a stream stays open after its `data: [DONE]`;
//! - `fake_split_events: true`: each content event of a stream is sent in two halves, the chunk
//!   delay between them rather than between events (a reader then mostly finds it mid-event);
//! - `fake_prompt_tokens` / `fake_completion_tokens`: the `usage` reported (defaults 10 / chunk count or 5).
//! - `fake_model`: the `model` a non-stream answer names (default `fake`).
//! - `fake_usage: "timings"`: report those counts only as llama-server's `timings` (`prompt_n`,
//!   `cache_n`, `predicted_n`), with no `usage`, the way llama-server ends a stream whose client did not
//!   ask for `stream_options.include_usage`; `fake_cached_tokens` of the prompt tokens (default 0) are
//!   reported as `cache_n`, the rest as `prompt_n` (and, with `usage`, as its
//!   `prompt_tokens_details.cached_tokens`).
//!
//! A generation request is counted in [`RunningUpstream::current`] by an RAII guard that travels inside the
//! response body, so it lives until the body is fully sent or dropped: `max_concurrency` covers streams.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Notify};
use tokio::task::{JoinHandle, JoinSet};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Paths that take a llama-server slot; the fake records these in `requests_seen`.
pub const GENERATION_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/completion",
    "/v1/embeddings",
    "/embeddings",
    "/embedding",
    "/v1/rerank",
    "/rerank",
    "/reranking",
    "/v1/reranking",
];

/// llama-server's count endpoint for chats, which slotgate asks first (older builds: the template and
/// the tokenizer).
pub const CHAT_COUNT: &str = "/v1/chat/completions/input_tokens";

/// The body llama-server answers with while it loads a model.
pub const LOADING_BODY: &str =
    r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#;

#[derive(Clone, Debug)]
enum Mode {
    Normal,
    /// Streams break (connection aborted) after this many content chunks.
    CrashAfter(usize),
    /// Generation requests never get an answer.
    Hang,
    /// Generation requests are read, then the connection is dropped without any response.
    Reset,
    /// Every endpoint answers 503 "Loading model" for this long after start.
    LoadingFor(Duration),
}

/// Builder for a fake llama-server.
#[derive(Clone, Debug)]
pub struct FakeUpstream {
    mode: Mode,
    chunks: Vec<String>,
    chunk_delay: Duration,
    delay: Duration,
    path: Option<PathBuf>,
    one_per_conn: bool,
    n_ctx: u64,
    /// Refuse a prompt of `n_ctx` tokens or more as llama-server does (set by [`FakeUpstream::n_ctx`]).
    refuse_over_ctx: bool,
    /// Answers for the first generation requests, in arrival order; see [`FakeUpstream::errors`].
    script: Vec<Scripted>,
    /// How long `POST /tokenize` and the count endpoint take to answer.
    tokenize_delay: Duration,
    /// How long a client's request outside the slots (a passthrough, an admin route) waits before
    /// its answer.
    passthrough_delay: Duration,
    /// Answer the count endpoint 404, as llama-server builds before it did.
    no_count_endpoint: bool,
    /// `total_slots` in `/props` (llama-server's `-np`).
    total_slots: usize,
    /// As llama-server's `--api-key`: every route but `/health` and a preflight refuses another key
    /// with its 401 (see [`FakeUpstream::api_key`]).
    api_key: Option<String>,
    /// The model it serves, as `/props` names it (`model_alias`: llama-server's `--alias`).
    model_alias: String,
}

/// One generation request as the fake received it.
#[derive(Clone, Debug)]
pub struct SeenRequest {
    /// Arrival order, from 0.
    pub seq: usize,
    pub path: String,
    /// The parsed JSON body (`Null` if it was not JSON).
    pub body: Value,
    /// The body's bytes as they arrived.
    pub raw: Bytes,
    pub tag: Option<String>,
    pub stream: bool,
    pub arrived: Instant,
    /// When the response body was fully sent or dropped.
    pub finished: Option<Instant>,
}

#[derive(Default)]
struct Counters {
    current: AtomicUsize,
    max: AtomicUsize,
    cancelled: AtomicUsize,
    health_checks: AtomicUsize,
    connections: AtomicUsize,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Generation POSTs received once ready, whatever they were answered.
    attempts: AtomicUsize,
}

struct State {
    ready_at: Instant,
    counters: Counters,
    seen: Mutex<Vec<SeenRequest>>,
    passthrough: Mutex<Vec<String>>,
    /// Every request's path and `X-Request-Id`, in arrival order.
    request_ids: Mutex<Vec<(String, Option<String>)>>,
    /// `Authorization` of each request, by path.
    authorizations: Mutex<Vec<(String, Option<String>)>>,
    /// `X-Api-Key` of each request, by path.
    api_keys: Mutex<Vec<(String, Option<String>)>>,
    /// Every request's path and `traceparent`, in arrival order.
    traceparents: Mutex<Vec<(String, Option<String>)>>,
    /// slotgate's own calls (user agent `slotgate/...`): token counting, `/props`.
    internal: Mutex<Vec<String>>,
    /// When each generation request answered "Loading model" arrived.
    rejected_loading: Mutex<Vec<Instant>>,
}

impl State {
    /// Records `usage` that was actually sent in full.
    fn add_usage(&self, prompt_tokens: u64, completion_tokens: u64) {
        let c = &self.counters;
        c.prompt_tokens.fetch_add(prompt_tokens, Ordering::SeqCst);
        c.completion_tokens
            .fetch_add(completion_tokens, Ordering::SeqCst);
    }
}

/// Holds one unit of upstream concurrency; dropped when the response body is done or abandoned.
struct InFlight {
    state: Arc<State>,
    seq: usize,
}

impl InFlight {
    fn enter(state: &Arc<State>, seq: usize) -> Self {
        let now = state.counters.current.fetch_add(1, Ordering::SeqCst) + 1;
        state.counters.max.fetch_max(now, Ordering::SeqCst);
        Self {
            state: state.clone(),
            seq,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(r) = self.state.seen.lock().unwrap().get_mut(self.seq) {
            r.finished = Some(Instant::now());
        }
        self.state.counters.current.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Payload {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Result<Bytes, BoxError>>),
}

/// Response body that carries the request's [`InFlight`] guard until it ends or is dropped.
struct FakeBody {
    payload: Payload,
    guard: Option<InFlight>,
    /// Told when hyper is done with this body (sent or abandoned); see `one_request_per_connection`.
    on_done: Option<Arc<Notify>>,
}

impl Drop for FakeBody {
    fn drop(&mut self) {
        if let Some(n) = &self.on_done {
            n.notify_one();
        }
    }
}

impl FakeBody {
    fn full(bytes: impl Into<Bytes>, guard: Option<InFlight>) -> Self {
        Self {
            payload: Payload::Full(Some(bytes.into())),
            guard,
            on_done: None,
        }
    }
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = match &mut self.payload {
            Payload::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Payload::Channel(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        };
        if let Poll::Ready(None) = polled {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.payload, Payload::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.payload {
            Payload::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Payload::Full(None) => SizeHint::with_exact(0),
            Payload::Channel(_) => SizeHint::default(),
        }
    }
}

impl Default for FakeUpstream {
    fn default() -> Self {
        Self {
            mode: Mode::Normal,
            chunks: vec!["Hello".into(), ", ".into(), "world".into()],
            chunk_delay: Duration::from_millis(10),
            delay: Duration::ZERO,
            path: None,
            one_per_conn: false,
            n_ctx: 4096,
            refuse_over_ctx: false,
            script: Vec::new(),
            tokenize_delay: Duration::ZERO,
            passthrough_delay: Duration::ZERO,
            no_count_endpoint: false,
            total_slots: 1,
            api_key: None,
            model_alias: "fake".into(),
        }
    }
}

impl FakeUpstream {
    /// Answers at once (streams use 3 chunks 10 ms apart).
    pub fn instant() -> Self {
        Self::default()
    }

    /// Streams answer with `chunks`, one every `delay_per_chunk`.
    pub fn sse<I, S>(chunks: I, delay_per_chunk: Duration) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            chunks: chunks.into_iter().map(Into::into).collect(),
            chunk_delay: delay_per_chunk,
            ..Self::default()
        }
    }

    /// Streams break after `after_n_chunks` content chunks: the connection is aborted mid-body.
    pub fn crash_mid_stream(after_n_chunks: usize) -> Self {
        Self {
            mode: Mode::CrashAfter(after_n_chunks),
            chunks: (0..after_n_chunks + 5)
                .map(|i| format!("tok{i} "))
                .collect(),
            chunk_delay: Duration::from_millis(30),
            ..Self::default()
        }
    }

    /// Generation requests are accepted and never answered (health and passthroughs still answer).
    pub fn hang() -> Self {
        Self {
            mode: Mode::Hang,
            ..Self::default()
        }
    }

    /// Generation requests are read in full, then the connection is closed without a response: the
    /// request may have been processed, so it must not be resent.
    pub fn reset_on_request() -> Self {
        Self {
            mode: Mode::Reset,
            ..Self::default()
        }
    }

    /// Every endpoint, `/health` included, answers 503 "Loading model" for `duration` after start.
    pub fn loading_then_ready(duration: Duration) -> Self {
        Self {
            mode: Mode::LoadingFor(duration),
            ..Self::default()
        }
    }

    /// Default service time of non-stream answers.
    /// A client's requests outside the slots (passthroughs, admin routes) are answered after `d`.
    pub fn passthrough_delay(mut self, d: Duration) -> Self {
        self.passthrough_delay = d;
        self
    }

    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }

    /// Default delay between stream chunks.
    pub fn chunk_delay(mut self, d: Duration) -> Self {
        self.chunk_delay = d;
        self
    }

    /// Close every connection right after its first response, without a `Connection: close` header,
    /// the way a server that drops idle keep-alive connections looks to a pooling client.
    pub fn one_request_per_connection(mut self) -> Self {
        self.one_per_conn = true;
        self
    }

    /// The context size per slot `/props` reports. A generation request whose prompt has `n` tokens
    /// or more (counted as `/tokenize` counts them) is then refused as llama-server refuses it: 400
    /// `exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`.
    pub fn n_ctx(mut self, n: u64) -> Self {
        self.n_ctx = n;
        self.refuse_over_ctx = true;
        self
    }

    /// `total_slots` in `/props`, as llama-server started with `-np n` reports it. [default: 1]
    /// Checks callers' keys as llama-server started with `--api-key KEY` does (its
    /// `middleware_validate_api_key`): the first `Authorization`, else `X-Api-Key`, less a leading
    /// `Bearer `, must be `key`; otherwise 401 `Invalid API Key`, on every route but `/health`,
    /// `/v1/health` and a preflight.
    pub fn api_key(mut self, key: &str) -> Self {
        self.api_key = Some(key.to_owned());
        self
    }

    /// The model it serves, as `/props` names it (llama-server's `--alias`; `fake` by default).
    pub fn model_alias(mut self, name: &str) -> Self {
        self.model_alias = name.to_owned();
        self
    }

    pub fn total_slots(mut self, n: usize) -> Self {
        self.total_slots = n;
        self
    }

    /// Listen at this exact path (e.g. one a gate was already pointed at).
    pub fn at(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_path_buf());
        self
    }

    pub async fn start(self) -> RunningUpstream {
        let (path, dir) = match &self.path {
            Some(p) => (p.clone(), None),
            None => {
                let dir = crate::wait::unique_dir("up");
                (dir.join("llama.sock"), Some(dir))
            }
        };
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .unwrap_or_else(|e| panic!("fake upstream bind {}: {e}", path.display()));
        let ready_at = match self.mode {
            Mode::LoadingFor(d) => Instant::now() + d,
            _ => Instant::now(),
        };
        let state = Arc::new(State {
            ready_at,
            counters: Counters::default(),
            seen: Mutex::new(Vec::new()),
            passthrough: Mutex::new(Vec::new()),
            request_ids: Mutex::new(Vec::new()),
            authorizations: Mutex::new(Vec::new()),
            api_keys: Mutex::new(Vec::new()),
            traceparents: Mutex::new(Vec::new()),
            internal: Mutex::new(Vec::new()),
            rejected_loading: Mutex::new(Vec::new()),
        });
        let cfg = Arc::new(self);
        let accept_state = state.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accept_state
                    .counters
                    .connections
                    .fetch_add(1, Ordering::SeqCst);
                let (state, cfg) = (accept_state.clone(), cfg.clone());
                conns.spawn(async move {
                    let done = Arc::new(Notify::new());
                    let one_per_conn = cfg.one_per_conn;
                    let on_done = done.clone();
                    let svc = service_fn(move |req| {
                        let (state, cfg, on_done) = (state.clone(), cfg.clone(), on_done.clone());
                        async move {
                            let mut resp: Response<FakeBody> = match handle(state, cfg, req).await {
                                Ok(r) => r,
                                Err(e) => return Err(e),
                            };
                            if one_per_conn {
                                resp.body_mut().on_done = Some(on_done);
                            }
                            Ok::<_, ResetConnection>(resp)
                        }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => return,
                        _ = done.notified() => {}
                    }
                    // Let hyper flush what it has, then close; no header announces it.
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        RunningUpstream {
            path,
            dir,
            state,
            task,
        }
    }
}

/// A started fake; stops (and removes its socket) on drop.
pub struct RunningUpstream {
    path: PathBuf,
    dir: Option<PathBuf>,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl RunningUpstream {
    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// The value for slotgate's `--upstream`.
    pub fn url(&self) -> String {
        format!("unix:{}", self.path.display())
    }

    /// Highest number of generation requests in progress at once (bodies included).
    pub fn max_concurrency(&self) -> usize {
        self.state.counters.max.load(Ordering::SeqCst)
    }

    /// Generation requests in progress now.
    pub fn current(&self) -> usize {
        self.state.counters.current.load(Ordering::SeqCst)
    }

    /// Streams whose reader went away before the stream finished.
    pub fn cancelled(&self) -> usize {
        self.state.counters.cancelled.load(Ordering::SeqCst)
    }

    /// Generation requests that reached the fake and were served (not answered "loading"), in arrival order.
    pub fn requests_seen(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    /// `fake_tag`s of served generation requests, in arrival order.
    pub fn tags(&self) -> Vec<String> {
        self.requests_seen()
            .into_iter()
            .filter_map(|r| r.tag)
            .collect()
    }

    /// Every tagged generation request reached the fake at most once: nothing was forwarded twice.
    pub fn assert_forwarded_once(&self) {
        let mut tags = self.tags();
        tags.sort_unstable();
        let before = tags.len();
        tags.dedup();
        assert_eq!(
            before,
            tags.len(),
            "a request was forwarded more than once: {:?}",
            self.tags()
        );
    }

    pub fn saw_tag(&self, tag: &str) -> bool {
        self.tags().iter().any(|t| t == tag)
    }

    pub fn request_with_tag(&self, tag: &str) -> Option<SeenRequest> {
        self.requests_seen()
            .into_iter()
            .find(|r| r.tag.as_deref() == Some(tag))
    }

    /// Every request's path and the `X-Request-Id` it carried, in arrival order.
    /// `(path, Authorization, X-Api-Key)` of every request that reached the fake but `/health`, in
    /// arrival order: which credentials llama-server would have seen.
    pub fn credentials_seen(&self) -> Vec<(String, Option<String>, Option<String>)> {
        let auth = self.state.authorizations.lock().unwrap().clone();
        let keys = self.state.api_keys.lock().unwrap().clone();
        auth.into_iter()
            .zip(keys)
            .filter(|((p, _), _)| p != "/health")
            .map(|((p, a), (_, k))| (p, a, k))
            .collect()
    }

    pub fn request_ids_seen(&self) -> Vec<(String, Option<String>)> {
        self.state.request_ids.lock().unwrap().clone()
    }

    /// Every request's path and the W3C `traceparent` it carried, in arrival order.
    pub fn traceparents_seen(&self) -> Vec<(String, Option<String>)> {
        self.state.traceparents.lock().unwrap().clone()
    }

    /// Paths of non-generation requests (passthroughs) in arrival order; `/health` excluded.
    pub fn passthrough_seen(&self) -> Vec<String> {
        self.state.passthrough.lock().unwrap().clone()
    }

    /// Paths slotgate itself asked (token counting, `/props`), in arrival order.
    pub fn internal_seen(&self) -> Vec<String> {
        self.state.internal.lock().unwrap().clone()
    }

    /// Waits (up to 10 s) for the calls slotgate makes when llama-server becomes ready: `/props`,
    /// and `/v1/models` without a credential (whether it checks keys), which comes last.
    pub async fn wait_readiness_calls(&self) {
        crate::wait::eventually(
            Duration::from_secs(10),
            "slotgate's readiness calls",
            || async {
                let seen = self.internal_seen();
                (seen.iter().any(|p| p == "/props") && seen.iter().any(|p| p == "/v1/models"))
                    .then_some(())
            },
        )
        .await;
    }

    /// Paths slotgate itself asked beyond its readiness calls (`/props`, `/v1/models`): token
    /// counting and the like.
    pub fn own_calls_after_readiness(&self) -> Vec<String> {
        self.internal_seen()
            .into_iter()
            .filter(|p| p != "/props" && p != "/v1/models")
            .collect()
    }

    /// Generation requests answered 503 "Loading model".
    pub fn rejected_while_loading(&self) -> usize {
        self.state.rejected_loading.lock().unwrap().len()
    }

    /// When each generation request answered 503 "Loading model" arrived, in order.
    pub fn rejection_times(&self) -> Vec<Instant> {
        self.state.rejected_loading.lock().unwrap().clone()
    }

    /// Connections accepted so far (by anyone: slotgate's requests and health probes alike).
    pub fn connections(&self) -> usize {
        self.state.counters.connections.load(Ordering::SeqCst)
    }

    pub fn health_checks(&self) -> usize {
        self.state.counters.health_checks.load(Ordering::SeqCst)
    }

    /// When the fake started (or will start) answering normally.
    pub fn ready_at(&self) -> Instant {
        self.state.ready_at
    }

    /// Sum of the usage the fake actually sent, as `usage` or as `timings` (prompt = `prompt_n` +
    /// `cache_n`): (prompt_tokens, completion_tokens).
    pub fn usage_totals(&self) -> (u64, u64) {
        (
            self.state.counters.prompt_tokens.load(Ordering::SeqCst),
            self.state.counters.completion_tokens.load(Ordering::SeqCst),
        )
    }

    /// Stops accepting, closes every open connection and removes the socket file.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for RunningUpstream {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Returned by the service to make hyper drop the connection without answering.
#[derive(Debug)]
struct ResetConnection;

impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fake upstream reset the connection")
    }
}

impl std::error::Error for ResetConnection {}

fn json_response(
    status: StatusCode,
    body: impl Into<Bytes>,
    guard: Option<InFlight>,
) -> Response<FakeBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json; charset=utf-8")
        .body(FakeBody::full(body, guard))
        .expect("valid response")
}

fn num(body: &Value, key: &str) -> Option<u64> {
    body.get(key).and_then(Value::as_u64)
}

fn tag_of(body: &Value) -> Option<String> {
    match body.get("fake_tag")? {
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The token counts as the answer reports them: a `usage` object, or (`fake_usage: "timings"`) only
/// llama-server's `timings`, splitting the prompt into cached and processed tokens.
#[derive(Clone, Copy, Debug)]
struct Report {
    timings_only: bool,
    cached: u64,
}

impl Report {
    fn of(body: &Value) -> Self {
        Self {
            timings_only: body.get("fake_usage").and_then(Value::as_str) == Some("timings"),
            cached: num(body, "fake_cached_tokens").unwrap_or(0),
        }
    }

    /// Adds the counts to `answer` (a final JSON body or the last SSE chunk).
    fn add_to(self, answer: &mut Value, prompt_tokens: u64, completion_tokens: u64) {
        if self.timings_only {
            let cached = self.cached.min(prompt_tokens);
            answer["timings"] = json!({
                "cache_n": cached,
                "prompt_n": prompt_tokens - cached, "prompt_ms": 1.0,
                "prompt_per_token_ms": 0.1, "prompt_per_second": 10000.0,
                "predicted_n": completion_tokens, "predicted_ms": 2.0,
                "predicted_per_token_ms": 0.4, "predicted_per_second": 2500.0,
            });
        } else {
            // As llama-server reports it: the cached part of the prompt in its details.
            answer["usage"] = json!({"prompt_tokens": prompt_tokens,
                                     "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens,
                                     "prompt_tokens_details": {"cached_tokens": self.cached.min(prompt_tokens)}});
        }
    }
}

/// llama-server's key check: the first `Authorization`, else (absent or empty) the first
/// `X-Api-Key`, less a leading `Bearer `, compared exactly.
fn key_accepted(headers: &http::HeaderMap, key: &str) -> bool {
    let first = |name: &str| headers.get(name).map(|v| v.as_bytes()).unwrap_or_default();
    let mut given = first("authorization");
    if given.is_empty() {
        given = first("x-api-key");
    }
    let given = given.strip_prefix(b"Bearer ").unwrap_or(given);
    given == key.as_bytes()
}

async fn handle(
    state: Arc<State>,
    cfg: Arc<FakeUpstream>,
    req: Request<Incoming>,
) -> Result<Response<FakeBody>, ResetConnection> {
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let seen = [
        (&state.request_ids, "x-request-id"),
        (&state.authorizations, "authorization"),
        (&state.api_keys, "x-api-key"),
        (&state.traceparents, "traceparent"),
    ];
    for (list, name) in seen {
        list.lock().unwrap().push((path.clone(), header(name)));
    }
    let generation = GENERATION_PATHS.contains(&path.as_str());
    // slotgate's own calls (token counting, /props) are kept apart from the clients' passthroughs.
    let internal = parts
        .headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua.starts_with("slotgate/"));
    let seen = |state: &State, path: &str| {
        let list = if internal {
            &state.internal
        } else {
            &state.passthrough
        };
        list.lock().unwrap().push(path.to_owned());
    };

    if let Some(key) = &cfg.api_key {
        let public = matches!(path.as_str(), "/health" | "/v1/health");
        if !public && parts.method != Method::OPTIONS && !key_accepted(&parts.headers, key) {
            return Ok(json_response(
                StatusCode::UNAUTHORIZED,
                r#"{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}"#,
                None,
            ));
        }
    }

    let now = Instant::now();
    if now < state.ready_at {
        if generation {
            state.rejected_loading.lock().unwrap().push(now);
        }
        return Ok(json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            LOADING_BODY,
            None,
        ));
    }

    if !generation && !internal && path != "/health" && !cfg.passthrough_delay.is_zero() {
        tokio::time::sleep(cfg.passthrough_delay).await;
    }
    if generation && parts.method == Method::POST {
        let attempt = state.counters.attempts.fetch_add(1, Ordering::SeqCst);
        if let Some(scripted) = cfg.script.get(attempt) {
            return Ok(scripted.answer(&state, path, &bytes));
        }
        let resp = generate(state, cfg.clone(), path, &bytes).await;
        if matches!(cfg.mode, Mode::Reset) {
            // An error from the service makes hyper close the connection without answering.
            return Err(ResetConnection);
        }
        return Ok(resp);
    }
    let resp = match (&parts.method, path.as_str()) {
        (&Method::GET, "/health") => {
            state.counters.health_checks.fetch_add(1, Ordering::SeqCst);
            json_response(StatusCode::OK, r#"{"status":"ok"}"#, None)
        }
        (&Method::GET, "/props") => {
            seen(&state, &path);
            let props = json!({"default_generation_settings": {"n_ctx": cfg.n_ctx}, "total_slots": cfg.total_slots,
                               "model_path": "fake.gguf", "model_alias": cfg.model_alias});
            json_response(StatusCode::OK, props.to_string(), None)
        }
        (&Method::GET, "/metrics") => {
            // As llama-server started with --metrics: a few of its series.
            seen(&state, &path);
            let busy = state.counters.current.load(Ordering::SeqCst);
            let text = format!(
                "# HELP llamacpp:requests_processing Number of requests processing.\n\
                 # TYPE llamacpp:requests_processing gauge\n\
                 llamacpp:requests_processing {busy}\n\
                 # HELP llamacpp:requests_deferred Number of requests deferred.\n\
                 # TYPE llamacpp:requests_deferred gauge\n\
                 llamacpp:requests_deferred 0\n"
            );
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/plain; version=0.0.4")
                .body(FakeBody::full(text, None))
                .expect("valid response")
        }
        (&Method::GET, "/v1/models" | "/models") => {
            seen(&state, &path);
            let models = json!({"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]});
            json_response(StatusCode::OK, models.to_string(), None)
        }
        // llama-server answers every preflight itself, whatever the path: its default CORS rule.
        (&Method::OPTIONS, _) => Response::builder()
            .status(StatusCode::OK)
            .header(
                "access-control-allow-origin",
                parts
                    .headers
                    .get("origin")
                    .cloned()
                    .unwrap_or(http::HeaderValue::from_static("")),
            )
            .header("access-control-allow-credentials", "true")
            .header("access-control-allow-methods", "GET, POST, DELETE, OPTIONS")
            .header("access-control-allow-headers", "*")
            .header("content-type", "text/html")
            .body(FakeBody::full(Bytes::new(), None))
            .expect("valid response"),
        (&Method::POST, CHAT_COUNT) if !cfg.no_count_endpoint => {
            // As llama-server counts a chat: its template, then its tokenizer.
            seen(&state, &path);
            if !cfg.tokenize_delay.is_zero() {
                tokio::time::sleep(cfg.tokenize_delay).await;
            }
            let body: Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let n = fake_tokens(&fake_template(&body));
            json_response(
                StatusCode::OK,
                json!({"input_tokens": n, "object": "response.input_tokens"}).to_string(),
                None,
            )
        }
        (&Method::POST, "/tokenize" | "/detokenize" | "/apply-template") => {
            seen(&state, &path);
            if path == "/tokenize" && !cfg.tokenize_delay.is_zero() {
                tokio::time::sleep(cfg.tokenize_delay).await;
            }
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let answer = match path.as_str() {
                "/tokenize" => {
                    json!({"tokens": vec![1; fake_tokens(body["content"].as_str().unwrap_or(""))]})
                }
                "/detokenize" => json!({"content": "fake"}),
                _ => json!({"prompt": fake_template(&body)}),
            };
            json_response(StatusCode::OK, answer.to_string(), None)
        }
        _ => {
            seen(&state, &path);
            json_response(
                StatusCode::NOT_FOUND,
                r#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#,
                None,
            )
        }
    };
    Ok(resp)
}

/// The fake's token count of `text`: one token per 4 characters, plus one for BOS (near the estimate,
/// never equal).
fn fake_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4) + 1
}

/// The fake's chat template: the messages' text, joined.
fn fake_template(body: &Value) -> String {
    let text: Vec<&str> = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .collect();
    text.join("\n")
}

async fn generate(
    state: Arc<State>,
    cfg: Arc<FakeUpstream>,
    path: String,
    raw: &[u8],
) -> Response<FakeBody> {
    let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let tag = tag_of(&body);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let guard = record_seen(&state, &path, &body, raw);

    if matches!(cfg.mode, Mode::Hang) {
        let _guard = guard;
        return std::future::pending().await;
    }
    if body.is_null() {
        return json_response(
            StatusCode::BAD_REQUEST,
            r#"{"error":{"code":400,"message":"invalid JSON","type":"invalid_request_error"}}"#,
            Some(guard),
        );
    }

    if cfg.refuse_over_ctx {
        let text = match body.get("prompt").and_then(Value::as_str) {
            Some(p) => p.to_owned(),
            None => fake_template(&body),
        };
        let n = fake_tokens(&text) as u64;
        if n >= cfg.n_ctx {
            let refusal = json!({"error": {"code": 400, "type": "exceed_context_size_error",
                "message": format!("request ({n} tokens) exceeds the available context size ({} tokens), try increasing it", cfg.n_ctx),
                "n_prompt_tokens": n, "n_ctx": cfg.n_ctx}});
            return json_response(StatusCode::BAD_REQUEST, refusal.to_string(), Some(guard));
        }
    }
    let prompt_tokens = num(&body, "fake_prompt_tokens").unwrap_or(10);
    if stream {
        return stream_response(state, cfg, path, body, tag, prompt_tokens, guard);
    }

    let delay = num(&body, "fake_delay_ms")
        .map(Duration::from_millis)
        .unwrap_or(cfg.delay);
    // Even a zero sleep waits for the next 1 ms timer tick: an instant answer must not sleep at all.
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Mode::CrashAfter(_) = cfg.mode {
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(Err::<Bytes, BoxError>("fake upstream crashed".into()));
        return Response::builder()
            .header("content-type", "application/json")
            .body(FakeBody {
                payload: Payload::Channel(rx),
                guard: Some(guard),
                on_done: None,
            })
            .expect("valid response");
    }

    let embedding = path.contains("embed");
    let completion_tokens = if embedding {
        0
    } else {
        num(&body, "fake_completion_tokens").unwrap_or(5)
    };
    let mut answer = if embedding {
        json!({"object": "list", "model": "fake", "fake_tag": tag,
               "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}]})
    } else if path.contains("rerank") {
        json!({"model": "fake", "fake_tag": tag,
               "results": [{"index": 0, "relevance_score": 0.5}]})
    } else if path.contains("chat") {
        json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake",
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": cfg.chunks.concat()}}],
               "fake_tag": tag})
    } else {
        json!({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake",
               "content": cfg.chunks.concat(),
               "choices": [{"index": 0, "finish_reason": "stop", "text": cfg.chunks.concat()}],
               "fake_tag": tag})
    };
    if let Some(model) = body.get("fake_model") {
        answer["model"] = model.clone();
    }
    Report::of(&body).add_to(&mut answer, prompt_tokens, completion_tokens);
    state.add_usage(prompt_tokens, completion_tokens);
    json_response(StatusCode::OK, answer.to_string(), Some(guard))
}

fn sse_event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream_response(
    state: Arc<State>,
    cfg: Arc<FakeUpstream>,
    path: String,
    body: Value,
    tag: Option<String>,
    prompt_tokens: u64,
    guard: InFlight,
) -> Response<FakeBody> {
    let chunks: Vec<String> = match num(&body, "fake_chunks") {
        Some(n) => (0..n).map(|i| format!("tok{i} ")).collect(),
        None => cfg.chunks.clone(),
    };
    let delay = num(&body, "fake_chunk_delay_ms")
        .map(Duration::from_millis)
        .unwrap_or(cfg.chunk_delay);
    let completion_tokens = num(&body, "fake_completion_tokens").unwrap_or(chunks.len() as u64);
    let linger_ms = num(&body, "fake_linger_ms");
    let split = body.get("fake_split_events").and_then(Value::as_bool) == Some(true);
    let report = Report::of(&body);
    let chat = path.contains("chat");
    let crash_after = match cfg.mode {
        Mode::CrashAfter(n) => Some(n),
        _ => None,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, BoxError>>(1);

    tokio::spawn(async move {
        let cancelled = || {
            state.counters.cancelled.fetch_add(1, Ordering::SeqCst);
        };
        // Waits `delay` unless the reader goes away first; false means it went away.
        let pause = |tx: mpsc::Sender<Result<Bytes, BoxError>>| async move {
            if delay.is_zero() {
                return !tx.is_closed();
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => true,
                _ = tx.closed() => false,
            }
        };
        for (i, text) in chunks.iter().enumerate() {
            if crash_after == Some(i) {
                if !pause(tx.clone()).await {
                    return cancelled();
                }
                let _ = tx
                    .send(Err("fake upstream crashed mid-stream".into()))
                    .await;
                return;
            }
            if i > 0 && !split && !pause(tx.clone()).await {
                return cancelled();
            }
            let event = if chat {
                json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake",
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}],
                       "fake_tag": tag})
            } else {
                json!({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake",
                       "content": text, "stop": false,
                       "choices": [{"index": 0, "text": text, "finish_reason": null}], "fake_tag": tag})
            };
            let bytes = sse_event(&event);
            if split {
                let half = bytes.len() / 2;
                if tx.send(Ok(bytes.slice(..half))).await.is_err() || !pause(tx.clone()).await {
                    return cancelled();
                }
                if tx.send(Ok(bytes.slice(half..))).await.is_err() {
                    return cancelled();
                }
            } else if tx.send(Ok(bytes)).await.is_err() {
                return cancelled();
            }
        }
        if !pause(tx.clone()).await {
            return cancelled();
        }
        let mut last = if chat {
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake",
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "fake_tag": tag})
        } else {
            json!({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake",
                   "content": "", "stop": true,
                   "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
                   "fake_tag": tag})
        };
        report.add_to(&mut last, prompt_tokens, completion_tokens);
        if tx.send(Ok(sse_event(&last))).await.is_err() {
            return cancelled();
        }
        state.add_usage(prompt_tokens, completion_tokens);
        if tx
            .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
            .await
            .is_err()
        {
            cancelled();
            return;
        }
        // The stream ends only after this: a client may close between `[DONE]` and the end.
        if let Some(ms) = linger_ms {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    });

    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(FakeBody {
            payload: Payload::Channel(rx),
            guard: Some(guard),
            on_done: None,
        })
        .expect("valid response")
}

/// Records a generation request that reached the fake and counts it in flight until the guard drops.
fn record_seen(state: &Arc<State>, path: &str, body: &Value, raw: &[u8]) -> InFlight {
    let mut seen = state.seen.lock().unwrap();
    let seq = seen.len();
    seen.push(SeenRequest {
        seq,
        path: path.to_owned(),
        body: body.clone(),
        raw: Bytes::copy_from_slice(raw),
        tag: tag_of(body),
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        arrived: Instant::now(),
        finished: None,
    });
    InFlight::enter(state, seq)
}

/// A scripted failure for one generation request (see [`FakeUpstream::errors`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scripted {
    /// 500 `server_error`: llama-server may have started the work, so it must reach the client as is.
    ServerError,
    /// A 503 that is not "Loading model" (an overloaded server, a proxy in between): may have started
    /// work too, so it must reach the client as is.
    Busy,
    /// 503 "Loading model": nothing was started; slotgate retries it.
    Loading,
    /// 400 `invalid_request_error` (not a context-size refusal): must reach the client as is.
    BadRequest,
}

/// The body of a [`Scripted::BadRequest`] answer (plus `fake_tag`).
pub const BAD_REQUEST_MESSAGE: &str = "fake refused the request";

/// The body of a [`Scripted::ServerError`] answer (plus `fake_tag`).
pub const SERVER_ERROR_MESSAGE: &str = "fake internal error";
/// The body of a [`Scripted::Busy`] answer (plus `fake_tag`): neither "Loading model" nor
/// `unavailable_error`, which is how slotgate recognises a load.
pub const BUSY_MESSAGE: &str = "fake server busy";

impl Scripted {
    fn answer(self, state: &Arc<State>, path: String, raw: &[u8]) -> Response<FakeBody> {
        let body: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
        let (status, message) = match self {
            Scripted::Loading => {
                // Turned away before any work: not a request the fake served.
                state.rejected_loading.lock().unwrap().push(Instant::now());
                return json_response(StatusCode::SERVICE_UNAVAILABLE, LOADING_BODY, None);
            }
            Scripted::ServerError => (StatusCode::INTERNAL_SERVER_ERROR, SERVER_ERROR_MESSAGE),
            Scripted::Busy => (StatusCode::SERVICE_UNAVAILABLE, BUSY_MESSAGE),
            Scripted::BadRequest => (StatusCode::BAD_REQUEST, BAD_REQUEST_MESSAGE),
        };
        let kind = match self {
            Scripted::BadRequest => "invalid_request_error",
            _ => "server_error",
        };
        let guard = record_seen(state, &path, &body, raw);
        let answer = json!({"error": {"code": status.as_u16(), "message": message, "type": kind},
                            "fake_tag": tag_of(&body)});
        json_response(status, answer.to_string(), Some(guard))
    }
}

/// Scripted failures and a slow tokenizer.
impl FakeUpstream {
    /// The first generation requests, in arrival order, get `script`'s answers, one each; later ones
    /// are served normally. A failed request counts in [`RunningUpstream::requests_seen`] (it reached
    /// the fake and may have started work) unless it was answered [`Scripted::Loading`].
    pub fn errors(script: impl IntoIterator<Item = Scripted>) -> Self {
        Self {
            script: script.into_iter().collect(),
            ..Self::default()
        }
    }

    /// `POST /tokenize` and the count endpoint answer only after `d` (slotgate's prompt count
    /// before admission).
    pub fn tokenize_delay(mut self, d: Duration) -> Self {
        self.tokenize_delay = d;
        self
    }

    /// Like a llama-server build older than the count endpoints: `POST` [`CHAT_COUNT`] is a 404,
    /// so slotgate counts a chat with `/apply-template` and `/tokenize`.
    pub fn without_count_endpoint(mut self) -> Self {
        self.no_count_endpoint = true;
        self
    }
}

impl RunningUpstream {
    /// Generation POSTs received once ready, however they were answered (served, scripted failure,
    /// "Loading model"): what slotgate sent, retries included.
    pub fn attempts(&self) -> usize {
        self.state.counters.attempts.load(Ordering::SeqCst)
    }
}
