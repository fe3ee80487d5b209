//! The client: one keep-alive pool to llama-server over TCP or a Unix socket per worker runtime,
//! fresh upstream requests built from an allow-list of headers, and the retry rule that never resends
//! a request whose bytes may have reached the upstream. slotgate's own calls (`/props`, counting,
//! `/slots`, `/metrics`) carry the upstream's API key when it wants one; clients' requests carry
//! their own. The in-flight count is an [`InflightGuard`] that travels with the answer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full, Limited};

use super::health::Health;
use super::pool::{self, Pool, PoolError};
use super::scrape::Scrape;
use crate::config::UpstreamAddr;
use crate::metrics as m;
use crate::respond::{self, Body, BodyError};
use crate::router::{self, Control};

/// Headers that describe one hop, not the message, and are never copied across (RFC 9110 §7.6.1),
/// plus the framing and routing headers that hyper sets for the new hop itself.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "expect",
];

/// Identifies slotgate's own requests (token counting, `/props`) in llama-server's logs.
pub(super) const USER_AGENT: &str = concat!("slotgate/", env!("CARGO_PKG_VERSION"));

/// Largest answer read of slotgate's own calls and probes, and of a 503 (to tell "Loading model"
/// from other failures).
pub(super) const PROBE_BODY_LIMIT: usize = 64 * 1024;

#[derive(Clone)]
pub struct Upstream {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) target: UpstreamAddr,
    /// The scheme and authority of every upstream URI, built once (for a Unix socket hyperlocal's
    /// hex-encoded path, which is costly to make per request).
    base: (http::uri::Scheme, http::uri::Authority),
    /// Keep-alive pools for whole answers and passthroughs (model lists, tokenizer, props): one per
    /// worker runtime, so a request and its upstream connection stay on one thread (see `pool`).
    clients: Vec<Pool>,
    /// No idle connections kept: a request that must have a connection of its own (a stream, or any
    /// slot request with reuse off) connects afresh (see `send`).
    pub(super) fresh: Pool,
    /// The admin scrape's copy of llama-server's `/metrics` (see `scrape`).
    pub(super) scrape: Scrape,
    /// What the `/health` probes have learnt (see `health`).
    pub(super) health: Health,
    inflight: AtomicUsize,
    /// `Bearer <key>`, built once: the key slotgate's own calls carry (`--upstream-api-key-file`, or
    /// the wrapped command's), and admin requests of callers who brought the admin token.
    bearer: Option<http::HeaderValue>,
    /// llama-server refused slotgate's own call for want of a (valid) key; logged once a change.
    unauthorized: AtomicBool,
}

/// Why an attempt failed, and whether it may be retried.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The request never left slotgate (connect refused or reset, pooled connection closed first).
    #[error("upstream not reachable: {0}")]
    NotSent(String),
    /// llama-server answered 503 "Loading model": it did not start the work.
    #[error("upstream is loading the model")]
    Loading,
    /// The request may have reached the upstream; resending could run it twice.
    #[error("{0}")]
    Failed(String),
}

impl SendError {
    pub fn retryable(&self) -> bool {
        !matches!(self, SendError::Failed(_))
    }
}

impl Upstream {
    pub fn new(
        target: UpstreamAddr,
        connect_timeout: Duration,
        pool_size: usize,
        api_key: Option<&str>,
    ) -> Self {
        let bearer = api_key.and_then(|key| {
            match http::HeaderValue::try_from(format!("Bearer {key}")) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    Some(v)
                }
                Err(_) => {
                    tracing::error!("the upstream API key holds bytes a header cannot carry; slotgate's own calls go without it");
                    None
                }
            }
        });
        // Idle connections are dropped well before llama-server's own keep-alive timeout (5 s), so
        // a reused connection is rarely one the server is closing at that moment.
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let base = base_of(&target);
        let pool = |idle, counted| Pool::new(&target, &base.1, connect_timeout, idle, counted);
        let clients = (0..workers)
            .map(|_| pool(pool_size.div_ceil(workers), true))
            .collect();
        // A pool that keeps no idle connection: a connection of its own for each request.
        let fresh = pool(0, true);
        // For the admin scrape: not counted in `slotgate_upstream_connections_total`, which is
        // about the request path.
        let scrape = Scrape::new(pool(0, false));
        Upstream {
            inner: Arc::new(Inner {
                base,
                target,
                clients,
                fresh,
                scrape,
                health: Health::new(),
                inflight: AtomicUsize::new(0),
                bearer,
                unauthorized: AtomicBool::new(false),
            }),
        }
    }

    /// This worker's keep-alive pool: a pooled connection's task runs on the runtime that opened it,
    /// so each runtime keeps its own (threads of no worker share the first).
    fn pool(&self) -> &Pool {
        let clients = &self.inner.clients;
        &clients[WORKER.with(std::cell::Cell::get) % clients.len()]
    }

    pub fn target(&self) -> &UpstreamAddr {
        &self.inner.target
    }

    /// Whether slotgate holds a key for llama-server.
    pub fn has_key(&self) -> bool {
        self.inner.bearer.is_some()
    }

    /// The status llama-server answers `GET path` carrying only a caller's credential header, or
    /// none (never slotgate's key), as slotgate's own call (its user agent) on a connection of its
    /// own, which closes after; `None` when it did not answer within `timeout`. The answer's body
    /// is dropped.
    pub async fn status_for(
        &self,
        path: &str,
        credential: Option<(&HeaderName, &http::HeaderValue)>,
        timeout: Duration,
    ) -> Option<http::StatusCode> {
        let attempt = async {
            let mut req = Request::builder()
                .method(Method::GET)
                .uri(self.uri(path))
                .header(header::USER_AGENT, USER_AGENT)
                .header(header::CONNECTION, "close")
                .body(Full::new(Bytes::new()))
                .ok()?;
            if let Some((name, value)) = credential {
                req.headers_mut().insert(name, value.clone());
            }
            let resp = self.inner.fresh.request(req).await.ok()?;
            Some(resp.status())
        };
        tokio::time::timeout(timeout, attempt).await.ok().flatten()
    }

    /// For `/status`: whether slotgate's own calls carry a key, and whether llama-server refused it
    /// (or wanted one and had none).
    pub fn auth_status(&self) -> serde_json::Value {
        let refused = self.inner.unauthorized.load(Ordering::Relaxed);
        serde_json::json!({
            "api_key": if self.inner.bearer.is_some() { "set" } else { "none" },
            "refused": refused,
            "hint": refused.then_some(match self.inner.bearer {
                Some(_) => "llama-server refuses slotgate's key: check --upstream-api-key-file against llama-server's --api-key",
                None => "llama-server wants an API key (--api-key): give it to slotgate with --upstream-api-key-file",
            }),
        })
    }

    /// Puts slotgate's own key on `headers`, in place of any the caller brought. Only for a caller
    /// who authenticated to slotgate (the admin token, or under `--client-auth keys` a key slotgate
    /// issued): the key is never lent to anyone else, so a caller without it meets llama-server
    /// exactly as if it called directly. Says whether slotgate has a key to put.
    pub fn attach_key(&self, headers: &mut HeaderMap) -> bool {
        let Some(bearer) = &self.inner.bearer else {
            return false;
        };
        headers.remove("x-api-key");
        headers.insert(header::AUTHORIZATION, bearer.clone());
        true
    }

    /// Records how llama-server answered one of slotgate's own calls to `path`.
    fn note_auth(&self, path: &str, status: http::StatusCode) {
        let refused = status == http::StatusCode::UNAUTHORIZED;
        if status.is_success() || refused {
            let was = self.inner.unauthorized.swap(refused, Ordering::Relaxed);
            if refused && !was {
                match self.inner.bearer {
                    Some(_) => tracing::error!(path, "llama-server answered 401 to slotgate's own request: it refuses the key of --upstream-api-key-file; slot counts, exact prompt counts and llama-server's metrics are unavailable until it is right"),
                    None => tracing::error!(path, "llama-server answered 401 to slotgate's own request: it runs with --api-key; give slotgate the key with --upstream-api-key-file (slotgate wrap reads it from the command line); until then slot counts, exact prompt counts and llama-server's metrics are unavailable"),
                }
            } else if !refused && was {
                tracing::info!("llama-server accepts slotgate's key again");
            }
        }
    }

    pub fn inflight(&self) -> usize {
        self.inner.inflight.load(Ordering::Relaxed)
    }

    /// Counts one request as forwarded until the guard (carried by the response body) drops.
    pub fn inflight_guard(&self) -> InflightGuard {
        let n = self.inner.inflight.fetch_add(1, Ordering::Relaxed) + 1;
        m::hot().inflight.set(n as f64);
        InflightGuard {
            upstream: self.clone(),
        }
    }

    pub(super) fn uri(&self, path_and_query: &str) -> Uri {
        let (scheme, authority) = &self.inner.base;
        Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query(path_and_query)
            .build()
            .unwrap_or_else(|_| Uri::from_static("http://invalid/"))
    }

    /// One attempt. A fresh request is built every time from the parts the client sent.
    ///
    /// An `own_connection` request (a streamed generation request, or any with reuse off) goes out on
    /// a new connection with `Connection: close`. Reusing a pooled one is unsafe for it: llama-server
    /// closes the connection after every streamed answer while announcing keep-alive, and a request
    /// written onto a connection at the instant it closes fails with "connection closed before
    /// message completed", which cannot be told apart from a server that read the request and died,
    /// so it could be neither retried nor answered honestly. On a connection of its own, a close
    /// before the answer always means the server failed. Other requests reuse the pool: llama-server
    /// (cpp-httplib) keeps a connection alive for 5 s after a whole answer, up to 100 requests (the
    /// last says `Connection: close`), and the pool drops a connection idle for 2 s, so a reused
    /// connection is never one the server is closing for idleness; one closed by a dying server
    /// before it read the request fails with EPIPE or ECONNRESET, which is retried as never sent.
    pub async fn send(
        &self,
        method: &Method,
        path_and_query: &str,
        client_headers: &HeaderMap,
        body: Bytes,
        own_connection: bool,
    ) -> Result<Response<Body>, SendError> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(self.uri(path_and_query))
            .body(Full::new(body))
            .map_err(|e| SendError::Failed(e.to_string()))?;
        copy_end_to_end(client_headers, req.headers_mut());
        if own_connection {
            req.headers_mut()
                .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        let pool = match own_connection {
            true => &self.inner.fresh,
            false => self.pool(),
        };
        let resp = pool.request(req).await.map_err(classify)?;
        self.inner.health.answered();
        if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE {
            return self.check_loading(resp).await;
        }
        Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BodyError).boxed_unsync()))
    }

    /// llama-server answers 503 `{"error":{"message":"Loading model","type":"unavailable_error"}}`
    /// before it can work; that answer is safe to retry. Any other 503 goes back to the client as is.
    async fn check_loading(
        &self,
        resp: Response<pool::Pooled>,
    ) -> Result<Response<Body>, SendError> {
        let (parts, body) = resp.into_parts();
        let bytes = Limited::new(body, PROBE_BODY_LIMIT)
            .collect()
            .await
            .map_err(|e| SendError::Failed(format!("reading a 503 body: {e}")))?
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        if text.contains("Loading model") || text.contains("unavailable_error") {
            return Err(SendError::Loading);
        }
        Ok(Response::from_parts(parts, respond::full(bytes)))
    }

    /// One small JSON exchange with llama-server (`/props`, `/tokenize`, `/apply-template`): never
    /// retried, bounded by `timeout`, the answer read up to [`PROBE_BODY_LIMIT`]. `Err` says why in
    /// words; a 404 is `Err("404 ...")`.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        let bytes = self
            .exchange(&self.inner.fresh, method, path, body, timeout)
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{path} answered non-JSON: {e}"))
    }

    /// [`Upstream::json`] with a body sent exactly as given (a client's bytes, whose key order a
    /// chat template may print).
    pub async fn raw_json(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        let bytes = self
            .exchange_bytes(&self.inner.fresh, method, path, body, timeout)
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{path} answered non-JSON: {e}"))
    }

    pub(super) async fn exchange(
        &self,
        pool: &Pool,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Result<Bytes, String> {
        let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        self.exchange_bytes(pool, method, path, bytes, timeout)
            .await
    }

    async fn exchange_bytes(
        &self,
        pool: &Pool,
        method: Method,
        path: &str,
        bytes: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, String> {
        let attempt = async {
            let mut req = Request::builder()
                .method(method)
                .uri(self.uri(path))
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::USER_AGENT, USER_AGENT)
                // Own connection, closed after: these calls never leave a pooled connection behind
                // that llama-server might be closing as a generation request picks it up.
                .header(header::CONNECTION, "close")
                .body(Full::new(bytes))
                .map_err(|e| e.to_string())?;
            if let Some(bearer) = &self.inner.bearer {
                req.headers_mut()
                    .insert(header::AUTHORIZATION, bearer.clone());
            }
            let resp = pool.request(req).await.map_err(|e| error_chain(&e))?;
            let status = resp.status();
            self.note_auth(path, status);
            let bytes = Limited::new(resp.into_body(), PROBE_BODY_LIMIT)
                .collect()
                .await
                .map_err(|e| format!("reading {path}: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("{} from {path}", status.as_u16()));
            }
            Ok(bytes)
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(format!("{path}: no answer within {timeout:?}")))
    }
}

/// Sorts a failed attempt into "never reached llama-server" (safe to resend) or "may have".
///
/// Safe: the connect failed; hyper dropped the request before writing it; or the peer reset the
/// connection (EPIPE / ECONNRESET). A reset means the peer closed its socket with our bytes still
/// unread, so it never received the whole request, and llama-server acts only on a whole request.
/// That is the race of a pooled keep-alive connection the server closed as we reused it.
/// Not safe: anything else, notably a clean close after the request was written
/// ("connection closed before message completed"): the server may have read it all.
fn classify(e: PoolError) -> SendError {
    let mut never_reached = e.never_sent();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            never_reached |= h.is_canceled();
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            never_reached |= matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            );
        }
        cur = err.source();
    }
    let text = error_chain(&e);
    if never_reached {
        SendError::NotSent(text)
    } else {
        SendError::Failed(text)
    }
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        text.push_str(": ");
        text.push_str(&s.to_string());
        cur = s.source();
    }
    text
}

/// Copies every end-to-end header: not hop-by-hop, and not named in `Connection` (but for the
/// credential headers, which always go as they came).
pub fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    let named_in_connection: Vec<HeaderName> = connection_tokens(from)
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for (name, value) in from {
        // A credential named in `Connection` still goes: it is the one that decided the tenant
        // (the client listener refuses such a request before; see `pipeline::caller`).
        let credential = name == header::AUTHORIZATION || name == "x-api-key";
        if HOP_BY_HOP.contains(&name.as_str())
            || (named_in_connection.contains(name) && !credential)
        {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

/// The tokens of `headers`' `Connection` values, trimmed (`close`, `keep-alive`, header names).
pub fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Decrements the in-flight count when the response (or the attempt) is over.
pub struct InflightGuard {
    upstream: Upstream,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let n = self.upstream.inner.inflight.fetch_sub(1, Ordering::Relaxed) - 1;
        m::hot().inflight.set(n as f64);
    }
}

thread_local! {
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as worker runtime `index`: its requests use keep-alive pool `index`.
pub fn on_worker(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// The scheme and authority of URIs to `target`.
fn base_of(target: &UpstreamAddr) -> (http::uri::Scheme, http::uri::Authority) {
    let root: Uri = match target {
        UpstreamAddr::Tcp(authority) => format!("http://{authority}/")
            .parse()
            .unwrap_or_else(|_| Uri::from_static("http://invalid/")),
        UpstreamAddr::Unix(path) => hyperlocal::Uri::new(path, "/").into(),
    };
    let parts = root.into_parts();
    match (parts.scheme, parts.authority) {
        (Some(scheme), Some(authority)) => (scheme, authority),
        _ => (
            http::uri::Scheme::HTTP,
            http::uri::Authority::from_static("invalid"),
        ),
    }
}

/// Router mode's loads, unloads and model lists go through the same client as everything else.
impl Control for Upstream {
    fn json<'a>(
        &'a self,
        method: Method,
        path: &'a str,
        body: Option<&'a serde_json::Value>,
        timeout: Duration,
    ) -> router::Answer<'a> {
        Box::pin(Upstream::json(self, method, path, body, timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn uris_are_the_ones_hyperlocal_and_http_would_make() {
        let unix = UpstreamAddr::Unix("/run/llama/llama.sock".into());
        let up = Upstream::new(unix, Duration::from_secs(1), 1, None);
        let want: Uri = hyperlocal::Uri::new("/run/llama/llama.sock", "/v1/chat?x=1").into();
        assert_eq!(up.uri("/v1/chat?x=1"), want);
        let tcp = UpstreamAddr::Tcp("127.0.0.1:8080".into());
        let up = Upstream::new(tcp, Duration::from_secs(1), 1, None);
        assert_eq!(
            up.uri("/props"),
            "http://127.0.0.1:8080/props".parse::<Uri>().unwrap()
        );
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_dropped() {
        let mut from = HeaderMap::new();
        from.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        from.insert("x-secret-hop", HeaderValue::from_static("1"));
        from.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        from.insert("content-length", HeaderValue::from_static("12"));
        from.insert("authorization", HeaderValue::from_static("Bearer k"));
        from.insert("content-type", HeaderValue::from_static("application/json"));
        let mut to = HeaderMap::new();
        copy_end_to_end(&from, &mut to);
        let mut names: Vec<_> = to.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["authorization", "content-type"]);
    }
}
