//! One client connection: HTTP/1.1 with a header-read deadline, the peer's credentials attached to
//! every request, and a graceful close when the server stops.

use std::convert::Infallible;
use std::future::Future;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use slotgate_sdk::Peer;
use tokio::sync::OwnedSemaphorePermit;

use super::listener::Stream;
use super::ServeOpts;
use crate::respond::Body;

pub async fn serve<H, F>(
    stream: Stream,
    peer: Option<Peer>,
    handler: H,
    permit: OwnedSemaphorePermit,
    opts: ServeOpts,
) where
    H: Fn(Request<Incoming>, Option<Peer>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    match stream {
        Stream::Unix(s) => run(TokioIo::new(s), peer, handler, opts).await,
        Stream::Tcp(s) => run(TokioIo::new(s), peer, handler, opts).await,
    }
    drop(permit);
}

async fn run<IO, H, F>(io: IO, peer: Option<Peer>, handler: H, opts: ServeOpts)
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    H: Fn(Request<Incoming>, Option<Peer>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let svc = service_fn(move |req| {
        let fut = handler(req, peer);
        async move { Ok::<_, Infallible>(fut.await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .keep_alive(true)
        .serve_connection(io, svc);
    tokio::pin!(conn);
    let mut stop = opts.stop;
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = super::stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, peer_uid = ?peer.map(|p| p.uid), "connection ended with an error");
    }
}
