//! One client connection: HTTP/1.1 with a header-read deadline and bounded buffers, the peer's
//! credentials and write watch attached to every request, a cut when the client stops reading, a
//! lingering close after an early answer, and a graceful close when the server stops.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use slotgate_sdk::Peer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::capacity::{Lane, PeerKey, Refusal, SpareRequest, SpareTicket, SPARE_HEAD_TIMEOUT};
use super::listener::Stream;
use super::ServeOpts;
use crate::respond::Body;
use crate::server::write_watch::{Watched, WriteWatch};

/// hyper's read and write buffers per connection (its default is ~400 KiB). Bounds what one response
/// holds in slotgate's memory, and the request head (larger heads get 431).
pub const CONN_BUFFER: usize = 64 * 1024;
/// The kernel send buffer asked for on client sockets (Linux doubles it). With it, a client that
/// stops reading blocks writes after ~128 KiB, and one that reads slowly unblocks them every
/// ~64 KiB it takes: both well inside a stall timeout.
pub const CLIENT_SNDBUF: usize = 64 * 1024;
/// After an early answer, the longest time spent reading and discarding what the client still sends.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
/// ... and the most bytes discarded beyond the body limit.
pub const LINGER_EXTRA_BYTES: u64 = 4 * 1024 * 1024;

/// A TCP client's address, on each of its requests (a Unix socket's peer is its credentials).
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub std::net::SocketAddr);

pub async fn serve<H, F>(
    stream: Stream,
    peer: Option<Peer>,
    key: PeerKey,
    handler: H,
    lane: Lane,
    opts: ServeOpts,
) where
    H: Fn(Request<Incoming>, Option<Peer>) -> F + Clone + Send + Sync + Unpin + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let addr = match &stream {
        Stream::Unix(_) => None,
        Stream::Tcp(s) => s.peer_addr().ok().map(ClientAddr),
    };
    let conn = Conn {
        peer,
        addr,
        key,
        opts,
    };
    match lane {
        Lane::General(places) => {
            let svc = move |req| Box::pin(handler(req, peer).map(infallible)) as Reply;
            conn.run_on(stream, svc, None).await;
            drop(places);
        }
        Lane::Spare(ticket) => {
            let ticket = Arc::new(ticket);
            let svc = {
                let ticket = ticket.clone();
                move |req: Request<Incoming>| spare_request(&ticket, req, peer, &handler)
            };
            conn.run_on(stream, svc, Some(&ticket)).await;
        }
    }
}

/// A request's answer as hyper takes it. Boxed: the connection is polled without hyper's shutdown,
/// which needs an `Unpin` future.
type Reply = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// The one request of a spare-lane connection (see `capacity`): a probe answered, a capped peer's
/// other requests refused, anything else served once a place is free; then the connection closes.
fn spare_request<H, F>(
    ticket: &Arc<SpareTicket>,
    req: Request<Incoming>,
    peer: Option<Peer>,
    handler: &H,
) -> Reply
where
    H: Fn(Request<Incoming>, Option<Peer>) -> F,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    match ticket.request(req.method(), req.uri().path()) {
        SpareRequest::Probe => Box::pin(handler(req, peer).map(closing)),
        SpareRequest::Refuse => {
            ticket.capacity().refused(Refusal::PeerCap, ticket.peer());
            Box::pin(std::future::ready(closing(too_many_connections())))
        }
        SpareRequest::Wait => {
            let promoted = ticket.promotion();
            let served = handler(req, peer);
            Box::pin(async move {
                // Evicted while waiting: the connection is being dropped, this is never sent.
                if !promoted.await {
                    return closing(too_many_connections());
                }
                closing(served.await)
            })
        }
        SpareRequest::Evicted => Box::pin(std::future::ready(closing(too_many_connections()))),
    }
}

/// 429 for a peer past its connection cap.
fn too_many_connections() -> Response<Body> {
    let mut resp = crate::respond::json(
        429,
        &serde_json::json!({"error": {
            "message": "too many open connections from this peer (--max-connections-per-peer); only health probes are answered on this one",
            "type": "rate_limit_error",
            "code": "too_many_connections",
        }}),
    );
    resp.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    resp
}

/// The answer, and the connection closed after it: a spare-lane connection serves one request.
fn closing(mut resp: Response<Body>) -> Result<Response<Body>, Infallible> {
    resp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    Ok(resp)
}

/// What one connection is served with.
struct Conn {
    peer: Option<Peer>,
    addr: Option<ClientAddr>,
    key: PeerKey,
    opts: ServeOpts,
}

impl Conn {
    async fn run_on<Svc>(self, stream: Stream, svc: Svc, spare: Option<&SpareTicket>)
    where
        Svc: Fn(Request<Incoming>) -> Reply + Send + Sync + Unpin + 'static,
    {
        match stream {
            Stream::Unix(s) => self.run(s, svc, spare).await,
            Stream::Tcp(s) => self.run(s, svc, spare).await,
        }
    }

    async fn run<S, Svc>(self, stream: S, handle: Svc, spare: Option<&SpareTicket>)
    where
        S: AsyncRead + AsyncWrite + AsFd + Unpin + Send + 'static,
        Svc: Fn(Request<Incoming>) -> Reply + Send + Sync + Unpin + 'static,
    {
        let Conn {
            peer,
            addr,
            key,
            opts,
        } = self;
        if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(&stream, CLIENT_SNDBUF) {
            tracing::debug!(error = %e, "could not size the client socket's send buffer");
        }
        let watch = WriteWatch::new();
        let io = TokioIo::new(Watched::new(stream, watch.clone()));
        let svc = {
            let watch = watch.clone();
            service_fn(move |mut req: Request<Incoming>| {
                watch.mark_headed();
                req.extensions_mut().insert(watch.clone());
                if let Some(addr) = addr {
                    req.extensions_mut().insert(addr);
                }
                handle(req)
            })
        };
        let header_timeout = match spare {
            Some(_) => opts.header_timeout.min(SPARE_HEAD_TIMEOUT),
            None => opts.header_timeout,
        };
        let mut conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .max_buf_size(CONN_BUFFER)
            // The buffer limit alone is checked only while a head is incomplete: a large head that
            // arrives in one read would pass it.
            .max_header_size(CONN_BUFFER)
            .keep_alive(true)
            // Header names as llama-server writes them: its own answers' as they came (the upstream
            // client keeps their case), slotgate's own in title case as cpp-httplib writes them. A
            // client that reads headers into a plain map (llama.cpp's own test suite does) finds
            // `Access-Control-Allow-Origin` where it would direct, not `access-control-allow-origin`.
            .title_case_headers(true)
            .serve_connection(io, svc);
        let mut stop = opts.stop;
        let stall = async {
            match opts.stall_timeout {
                Some(t) => watch.stalled(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stall);
        let evicted = async {
            match spare {
                Some(t) => t.evicted().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(evicted);
        let mut stopping = false;
        // Polled without hyper's own shutdown, so the socket comes back for a lingering close.
        let result = loop {
            tokio::select! {
                biased;
                r = poll_fn(|cx| {
                    let r = conn.poll_without_shutdown(cx);
                    // Read, and no whole head: the spare lane may now close this one.
                    if let (Poll::Pending, Some(t)) = (&r, spare) {
                        t.reading(watch.heard());
                    }
                    r
                }) => break r,
                // Counted by the lane when it chose this one.
                () = &mut evicted => {
                    reset(conn.into_parts().io.into_inner().into_inner());
                    return;
                }
                _ = super::stopped(&mut stop), if !stopping => {
                    if spare.is_some_and(SpareTicket::unanswered) {
                        return;
                    }
                    stopping = true;
                    std::pin::Pin::new(&mut conn).graceful_shutdown();
                }
                () = &mut stall => {
                    // Dropping the connection drops the response body: the slot is released and the
                    // upstream connection closed, and the body records `client_stalled`.
                    tracing::warn!(peer_uid = ?peer.map(|p| p.uid), "client stopped reading; connection closed");
                    return;
                }
            }
        };
        let slow_head = result
            .as_ref()
            .is_err_and(|e| e.is_timeout() && !watch.headed());
        if let Err(e) = &result {
            tracing::debug!(error = %e, peer_uid = ?peer.map(|p| p.uid), "connection ended with an error");
        }
        let mut stream = conn.into_parts().io.into_inner().into_inner();
        if slow_head {
            opts.capacity.refused(Refusal::HeaderTimeout, key);
            if spare.is_some() {
                return reset(stream);
            }
        }
        // Not while holding a place in the spare lane: a refused body must not keep it for seconds.
        let lingers = spare.is_none_or(SpareTicket::promoted);
        if result.is_ok() && watch.has_unread_body() && lingers {
            linger(&mut stream, opts.linger_bytes).await;
        } else {
            let _ = tokio::time::timeout(LINGER_TIME, stream.shutdown()).await;
        }
    }
}

/// Closes a connection past the limits with a reset: no TIME_WAIT is left on slotgate's side, so a
/// client that reopens as fast as it is closed ties up neither slotgate's ports nor its own.
fn reset<S: AsFd>(stream: S) {
    if let Err(e) = rustix::net::sockopt::set_socket_linger(&stream, Some(Duration::ZERO)) {
        tracing::debug!(error = %e, "could not reset a connection");
    }
}

/// nginx's lingering close: after an answer sent before the request body was read, stop writing
/// and read (discarding) what the client still sends, so a client that writes its whole body before
/// it reads gets to read the answer instead of a broken pipe. Bounded in time and bytes.
async fn linger<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, max_bytes: u64) {
    let until = Instant::now() + LINGER_TIME;
    if tokio::time::timeout_at(until, stream.shutdown())
        .await
        .is_err()
    {
        return;
    }
    let mut scratch = vec![0u8; 16 * 1024];
    let mut discarded = 0u64;
    while discarded < max_bytes {
        match tokio::time::timeout_at(until, stream.read(&mut scratch)).await {
            Ok(Ok(n)) if n > 0 => discarded += n as u64,
            _ => break,
        }
    }
    tracing::debug!(discarded, "lingering close done");
}

fn infallible(resp: Response<Body>) -> Result<Response<Body>, Infallible> {
    Ok(resp)
}
