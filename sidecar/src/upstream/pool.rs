//! One worker's keep-alive connections to llama-server: HTTP/1 connections of hyper's own
//! (`client::conn::http1`), each driven by a task on the worker that opened it, kept in a plain
//! list. A connection goes back to the list when its answer's body has been read to the end (a body
//! dropped before then takes its connection with it), and is dropped after [`IDLE_TIMEOUT`] unused.
//!
//! It replaces hyper-util's general pool, whose per-request costs (a keyed map hashed twice per
//! request, a lock across runtimes, a task spawned per request to wait for the connection to be
//! ready again) were a tenth of slotgate's instructions per request. See docs/performance.md.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use crate::config::UpstreamAddr;
use crate::metrics as m;

/// A connection unused this long is closed: well before llama-server's own keep-alive timeout
/// (5 s), so a reused connection is rarely one the server is closing at that moment.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

type Sender = SendRequest<Full<Bytes>>;

/// An upstream connection's settings. The answers' header names keep llama-server's case (in the
/// response's extensions, which slotgate's answer to its client takes over), so a client reads
/// them as it would direct.
fn client_conn() -> http1::Builder {
    let mut b = http1::Builder::new();
    b.preserve_header_case(true);
    b
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No connection: the connect failed or timed out, or the HTTP handshake did.
    #[error("connecting to the upstream: {0}")]
    Connect(#[source] std::io::Error),
    #[error("connecting to the upstream: {0}")]
    Handshake(#[source] hyper::Error),
    /// The connection failed with the request: `sent` false when hyper gave the request back
    /// unsent.
    #[error("{error}")]
    Send {
        #[source]
        error: hyper::Error,
        sent: bool,
    },
}

impl PoolError {
    /// Whether the failure was before any connection existed.
    pub fn is_connect(&self) -> bool {
        matches!(self, PoolError::Connect(_) | PoolError::Handshake(_))
    }

    /// Whether the request was surely not written: hyper gave it back, or cancelled it before.
    pub fn never_sent(&self) -> bool {
        match self {
            PoolError::Connect(_) | PoolError::Handshake(_) => true,
            PoolError::Send { error, sent } => !sent || error.is_canceled(),
        }
    }
}

/// Keep-alive connections to one upstream; cloning shares them.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    /// The `Host` every request carries: the URI's authority, as a general client would send it.
    host: HeaderValue,
    connect_timeout: Duration,
    /// Idle connections kept at most; 0: every request on a connection of its own, closed after.
    max_idle: usize,
    /// Opened connections count in `slotgate_upstream_connections_total`.
    counted: bool,
    /// Most recently used last.
    idle: Mutex<VecDeque<Idle>>,
    reaper: AtomicBool,
}

enum Target {
    Tcp(String),
    Unix(PathBuf),
}

struct Idle {
    sender: Sender,
    since: Instant,
}

impl Pool {
    pub fn new(
        target: &UpstreamAddr,
        authority: &http::uri::Authority,
        connect_timeout: Duration,
        max_idle: usize,
        counted: bool,
    ) -> Pool {
        let target = match target {
            UpstreamAddr::Tcp(a) => Target::Tcp(a.clone()),
            UpstreamAddr::Unix(p) => Target::Unix(p.clone()),
        };
        let host = HeaderValue::from_str(authority.as_str())
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Pool {
            shared: Arc::new(Shared {
                target,
                host,
                connect_timeout,
                max_idle,
                counted,
                idle: Mutex::new(VecDeque::new()),
                reaper: AtomicBool::new(false),
            }),
        }
    }

    /// Sends `req` (an absolute URI: it goes out in origin form, its authority as `Host`) on an idle
    /// connection that is still open, else on a new one. A request hyper hands back unsent, because
    /// the idle connection closed as it was taken, goes on the next one.
    pub async fn request(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<Pooled>, PoolError> {
        let keep = self.shared.max_idle > 0 && !asks_close(req.headers());
        prepare(&mut req, &self.shared.host);
        while let Some(mut sender) = self.take_idle() {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(self.answer(resp, keep.then_some(sender))),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => {
                        return Err(PoolError::Send {
                            error: e.into_error(),
                            sent: true,
                        })
                    }
                },
            }
        }
        let mut sender = self.connect().await?;
        match sender.try_send_request(req).await {
            Ok(resp) => Ok(self.answer(resp, keep.then_some(sender))),
            Err(mut e) => {
                let sent = e.take_message().is_none();
                Err(PoolError::Send {
                    error: e.into_error(),
                    sent,
                })
            }
        }
    }

    fn answer(&self, resp: Response<Incoming>, sender: Option<Sender>) -> Response<Pooled> {
        let home = sender.map(|s| (s, self.shared.clone()));
        resp.map(|body| Pooled {
            body,
            home,
            ended: false,
        })
    }

    /// The most recently used idle connection (the likeliest still open), dropping expired ones.
    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.shared.lock();
        while let Some(i) = idle.pop_back() {
            if i.since.elapsed() < IDLE_TIMEOUT && !i.sender.is_closed() {
                return Some(i.sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<Sender, PoolError> {
        let s = &self.shared;
        if s.counted {
            m::hot().upstream_connections.increment(1);
        }
        let (sender, conn) = match &s.target {
            Target::Tcp(addr) => {
                let stream =
                    tokio::time::timeout(s.connect_timeout, tokio::net::TcpStream::connect(addr))
                        .await
                        .map_err(|_| {
                            PoolError::Connect(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("no connection to {addr} within {:?}", s.connect_timeout),
                            ))
                        })?
                        .map_err(PoolError::Connect)?;
                stream.set_nodelay(true).map_err(PoolError::Connect)?;
                let (sender, conn) = client_conn()
                    .handshake(TokioIo::new(stream))
                    .await
                    .map_err(PoolError::Handshake)?;
                (sender, Conn::Tcp(conn))
            }
            Target::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(PoolError::Connect)?;
                let (sender, conn) = client_conn()
                    .handshake(TokioIo::new(stream))
                    .await
                    .map_err(PoolError::Handshake)?;
                (sender, Conn::Unix(conn))
            }
        };
        // The connection's task runs on this worker, as the requests that use it.
        tokio::spawn(async move {
            if let Err(e) = conn.run().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        if s.max_idle > 0 && !s.reaper.swap(true, Ordering::AcqRel) {
            tokio::spawn(reap(Arc::downgrade(&self.shared)));
        }
        Ok(sender)
    }

    /// Idle connections held now.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.shared.lock().len()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn give_back(&self, sender: Sender) {
        let mut idle = self.lock();
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back(Idle {
            sender,
            since: Instant::now(),
        });
    }
}

enum Conn {
    Tcp(http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>),
    Unix(http1::Connection<TokioIo<tokio::net::UnixStream>, Full<Bytes>>),
}

impl Conn {
    async fn run(self) -> hyper::Result<()> {
        match self {
            Conn::Tcp(c) => c.await,
            Conn::Unix(c) => c.await,
        }
    }
}

/// Closes connections idle past [`IDLE_TIMEOUT`] even when no request comes to find them: an idle
/// connection is an fd here and a thread in llama-server. Ends with the pool.
async fn reap(pool: Weak<Shared>) {
    let mut tick = tokio::time::interval(IDLE_TIMEOUT / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = pool.upgrade() else {
            return;
        };
        let mut idle = shared.lock();
        // Oldest first: the expired ones are at the front.
        while idle
            .front()
            .is_some_and(|i| i.since.elapsed() >= IDLE_TIMEOUT || i.sender.is_closed())
        {
            idle.pop_front();
        }
    }
}

/// Whether the request's `Connection` header asks to close after it.
fn asks_close(headers: &http::HeaderMap) -> bool {
    super::client::connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("close"))
}

/// The request as it goes on the wire: origin-form target, `Host` from the URI's authority.
fn prepare(req: &mut Request<Full<Bytes>>, host: &HeaderValue) {
    let origin = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::from(origin);
    req.headers_mut()
        .entry(header::HOST)
        .or_insert_with(|| host.clone());
}

/// An answer's body that takes its connection back to the pool once read to the end; dropped
/// before the end, the connection goes with it (its task closes it).
pub struct Pooled {
    body: Incoming,
    home: Option<(Sender, Arc<Shared>)>,
    /// The body said it ended (a chunked one never says so in `is_end_stream`).
    ended: bool,
}

impl HttpBody for Pooled {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some((sender, shared)) = self.home.take() {
            if self.ended || self.body.is_end_stream() {
                shared.give_back(sender);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;

    /// An HTTP/1 server on a Unix socket of its own: answers every request with `body`, and counts
    /// the connections it accepted. With `close_after_one`, it closes each connection after its first
    /// answer without saying so (as a server that restarts or times out an idle connection).
    async fn server(body: &'static str, close_after_one: bool) -> (UpstreamAddr, Arc<AtomicUsize>) {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-pool-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("up.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|_req| async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            body,
                        ))))
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .keep_alive(!close_after_one)
                        .serve_connection(TokioIo::new(stream), svc);
                    let _ = conn.await;
                });
            }
        });
        (UpstreamAddr::Unix(path), accepted)
    }

    fn pool_to(target: &UpstreamAddr, max_idle: usize) -> Pool {
        let authority = http::uri::Authority::from_static("localhost");
        Pool::new(target, &authority, Duration::from_secs(1), max_idle, false)
    }

    fn get(headers: &[(&'static str, &'static str)]) -> Request<Full<Bytes>> {
        let mut req = Request::get("http://localhost/x")
            .body(Full::new(Bytes::new()))
            .unwrap();
        for (k, v) in headers {
            req.headers_mut().insert(*k, HeaderValue::from_static(v));
        }
        req
    }

    async fn read(resp: Response<Pooled>) -> Bytes {
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_connection_read_to_its_end_is_used_again() {
        let (target, accepted) = server("hello", false).await;
        let pool = pool_to(&target, 4);
        for _ in 0..5 {
            let resp = pool.request(get(&[])).await.unwrap();
            assert_eq!(read(resp).await, "hello");
            assert_eq!(pool.idle(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_early_or_a_close_takes_its_connection_along() {
        let (target, accepted) = server("hello", false).await;
        let pool = pool_to(&target, 4);
        // Dropped before it was read: the connection is not handed to anyone else.
        drop(pool.request(get(&[])).await.unwrap());
        assert_eq!(pool.idle(), 0);
        // The request asked to close after it.
        let resp = pool.request(get(&[("connection", "close")])).await.unwrap();
        assert_eq!(read(resp).await, "hello");
        assert_eq!(pool.idle(), 0);
        // A pool that keeps none: a connection of its own each time.
        let fresh = pool_to(&target, 0);
        let resp = fresh.request(get(&[])).await.unwrap();
        assert_eq!(read(resp).await, "hello");
        assert_eq!(fresh.idle(), 0);
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_never_used_and_nothing_fails() {
        let (target, accepted) = server("hello", true).await;
        let pool = pool_to(&target, 4);
        for _ in 0..4 {
            let resp = pool.request(get(&[])).await.unwrap();
            assert_eq!(read(resp).await, "hello");
            // Let the server's close arrive, as it would between two requests.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let (target, _accepted) = server("hello", false).await;
        let pool = pool_to(&target, 4);
        let resp = pool.request(get(&[])).await.unwrap();
        assert_eq!(read(resp).await, "hello");
        assert_eq!(pool.idle(), 1);
        tokio::time::sleep(IDLE_TIMEOUT + IDLE_TIMEOUT / 2).await;
        assert_eq!(pool.idle(), 0, "the reaper left an expired connection open");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_is_a_connect_error_never_sent() {
        let target = UpstreamAddr::Unix(std::env::temp_dir().join("slotgate-pool-nobody.sock"));
        let Err(err) = pool_to(&target, 4).request(get(&[])).await else {
            panic!("a request reached nobody's socket");
        };
        assert!(err.never_sent(), "{err}");
        assert!(matches!(err, PoolError::Connect(_)), "{err:?}");
    }

    #[test]
    fn requests_go_out_in_origin_form_with_the_authority_as_host() {
        let mut req = Request::post("http://localhost:8080/v1/chat?x=1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        prepare(&mut req, &HeaderValue::from_static("localhost:8080"));
        assert_eq!(req.uri().to_string(), "/v1/chat?x=1");
        assert_eq!(req.headers()[header::HOST], "localhost:8080");
        assert!(asks_close(
            get(&[("connection", "keep-alive, Close")]).headers()
        ));
        assert!(!asks_close(get(&[("connection", "keep-alive")]).headers()));
    }
}
