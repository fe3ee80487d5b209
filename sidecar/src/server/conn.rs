//! One client connection: HTTP/1.1 with a header-read deadline and bounded buffers, the peer's
//! credentials and write watch attached to every request, a cut when the client stops reading, a
//! lingering close after an early answer, and a graceful close when the server stops.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::os::fd::AsFd;
use std::time::Duration;

use futures_util::FutureExt;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use slotgate_sdk::Peer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

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
    handler: H,
    permit: OwnedSemaphorePermit,
    opts: ServeOpts,
) where
    H: Fn(Request<Incoming>, Option<Peer>) -> F + Clone + Send + Sync + Unpin + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    match stream {
        Stream::Unix(s) => run(s, peer, None, handler, opts).await,
        Stream::Tcp(s) => {
            let addr = s.peer_addr().ok().map(ClientAddr);
            run(s, peer, addr, handler, opts).await
        }
    }
    drop(permit);
}

async fn run<S, H, F>(
    stream: S,
    peer: Option<Peer>,
    addr: Option<ClientAddr>,
    handler: H,
    opts: ServeOpts,
) where
    S: AsyncRead + AsyncWrite + AsFd + Unpin + Send + 'static,
    H: Fn(Request<Incoming>, Option<Peer>) -> F + Clone + Send + Sync + Unpin + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    if let Err(e) = rustix::net::sockopt::set_socket_send_buffer_size(&stream, CLIENT_SNDBUF) {
        tracing::debug!(error = %e, "could not size the client socket's send buffer");
    }
    let watch = WriteWatch::new();
    let io = TokioIo::new(Watched::new(stream, watch.clone()));
    let svc = {
        let watch = watch.clone();
        service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(watch.clone());
            if let Some(addr) = addr {
                req.extensions_mut().insert(addr);
            }
            // Boxed: the connection is polled without hyper's shutdown, which needs an `Unpin` future.
            // A `map`, not an `async` block: a block holding the future would be twice its size,
            // and hyper moves it once per request.
            Box::pin(handler(req, peer).map(infallible))
        })
    };
    let mut conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
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
    let mut stopping = false;
    // Polled without hyper's own shutdown, so the socket comes back for a lingering close.
    let result = loop {
        tokio::select! {
            r = poll_fn(|cx| conn.poll_without_shutdown(cx)) => break r,
            _ = super::stopped(&mut stop), if !stopping => {
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
    if let Err(e) = &result {
        tracing::debug!(error = %e, peer_uid = ?peer.map(|p| p.uid), "connection ended with an error");
    }
    let mut stream = conn.into_parts().io.into_inner().into_inner();
    if result.is_ok() && watch.has_unread_body() {
        linger(&mut stream, opts.linger_bytes).await;
    } else {
        let _ = tokio::time::timeout(LINGER_TIME, stream.shutdown()).await;
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
