//! stack-proxy: a bare reverse proxy on hyper, the stack's limit for slotgate's no-policy path.
//! Every request goes to `--upstream` as it came (minus `Connection`), its body streamed through,
//! and the answer comes back the same way; 502 when the upstream cannot be reached.
//!
//!   stack-proxy --listen tcp:127.0.0.1:8081 --upstream unix:/tmp/mock.sock [--shape per-core]
//!
//! The upstream client: `multi` uses hyper-util's legacy pooled client, as slotgate does; `current`
//! and `per-core` keep a pool of idle hyper HTTP/1 connections per runtime (a `Vec` behind a
//! `RefCell`: no locks, no atomics), each connection handed back when its answer's body has ended.

use std::cell::RefCell;
use std::pin::Pin;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use clap::Parser;
use http::header::CONNECTION;
use http::uri::{Authority, Scheme};
use http::{StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyperlocal::UnixConnector;
use slotgate_bench_stack::{serve_local, serve_multi, Addr, BoxError, Common, Shape};

#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    common: Common,
    /// The upstream: tcp:HOST:PORT or unix:PATH.
    #[arg(long)]
    upstream: Addr,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let served = match args.common.shape {
        Shape::Multi => {
            let legacy = Arc::new(Legacy::new(&args.upstream));
            serve_multi(&args.common, move |req| legacy.clone().forward(req))
        }
        Shape::Current | Shape::PerCore => {
            let upstream = args.upstream.clone();
            serve_local(&args.common, move || {
                let pool = Rc::new(Pool {
                    upstream: upstream.clone(),
                    idle: RefCell::new(Vec::new()),
                });
                move |req| forward_pooled(pool.clone(), req)
            })
        }
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stack-proxy: {e}");
            ExitCode::FAILURE
        }
    }
}

type Answer<B> = Response<Either<B, Full<Bytes>>>;

fn bad_gateway<B>() -> Answer<B> {
    let mut res = Response::new(Either::Right(Full::new(Bytes::from_static(
        b"bad gateway\n",
    ))));
    *res.status_mut() = StatusCode::BAD_GATEWAY;
    res
}

/// The upstream's answer, its hop-by-hop `Connection` header left behind.
fn relay<B, C>(res: Response<B>, wrap: impl FnOnce(B) -> C) -> Answer<C> {
    let (mut parts, body) = res.into_parts();
    parts.headers.remove(CONNECTION);
    Response::from_parts(parts, Either::Left(wrap(body)))
}

// --- multi: hyper-util's legacy client, as slotgate ------------------------------------------------

struct Legacy {
    client: LegacyClient,
    scheme: Scheme,
    authority: Authority,
}

#[derive(Clone)]
enum LegacyClient {
    Tcp(Client<HttpConnector, Incoming>),
    Unix(Client<UnixConnector, Incoming>),
}

impl Legacy {
    fn new(upstream: &Addr) -> Legacy {
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_timer(TokioTimer::new());
        let (client, base): (_, Uri) = match upstream {
            Addr::Tcp(addr) => {
                let mut http = HttpConnector::new();
                http.set_nodelay(true);
                let base = format!("http://{addr}/")
                    .parse()
                    .expect("a socket address is an authority");
                (LegacyClient::Tcp(builder.build(http)), base)
            }
            Addr::Unix(path) => (
                LegacyClient::Unix(builder.build(UnixConnector)),
                hyperlocal::Uri::new(path, "/").into(),
            ),
        };
        // The scheme and authority are made once; each request only gets its own path.
        let base = base.into_parts();
        Legacy {
            client,
            scheme: base.scheme.expect("an absolute URI"),
            authority: base.authority.expect("an absolute URI"),
        }
    }

    async fn forward(self: Arc<Self>, req: Request<Incoming>) -> Answer<Incoming> {
        let (mut parts, body) = req.into_parts();
        let mut uri = std::mem::take(&mut parts.uri).into_parts();
        uri.scheme = Some(self.scheme.clone());
        uri.authority = Some(self.authority.clone());
        let Ok(uri) = Uri::from_parts(uri) else {
            return bad_gateway();
        };
        parts.uri = uri;
        parts.headers.remove(CONNECTION);
        let req = Request::from_parts(parts, body);
        let res = match &self.client {
            LegacyClient::Tcp(c) => c.request(req).await,
            LegacyClient::Unix(c) => c.request(req).await,
        };
        match res {
            Ok(res) => relay(res, |b| b),
            Err(_) => bad_gateway(),
        }
    }
}

// --- current, per-core: one runtime's own pool of HTTP/1 connections -------------------------------

struct Pool {
    upstream: Addr,
    idle: RefCell<Vec<SendRequest<Incoming>>>,
}

impl Pool {
    /// An idle connection that is still open, else a new one.
    async fn checkout(&self) -> Result<SendRequest<Incoming>, BoxError> {
        loop {
            let Some(mut sender) = self.idle.borrow_mut().pop() else {
                break;
            };
            // Handed back when its last answer's body ended: ready once its task has seen that.
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let sender = match &self.upstream {
            Addr::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
                tokio::task::spawn_local(conn);
                sender
            }
            Addr::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await?;
                let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
                tokio::task::spawn_local(conn);
                sender
            }
        };
        Ok(sender)
    }
}

async fn forward_pooled(pool: Rc<Pool>, req: Request<Incoming>) -> Answer<Pooled> {
    let (mut parts, body) = req.into_parts();
    parts.headers.remove(CONNECTION);
    let Ok(mut sender) = pool.checkout().await else {
        return bad_gateway();
    };
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(res) => relay(res, |body| Pooled {
            body,
            home: Some((sender, pool)),
        }),
        Err(_) => bad_gateway(),
    }
}

/// An answer's body that takes its upstream connection back to the pool once it has all been read;
/// dropped before the end, the connection goes with it (its task closes it).
struct Pooled {
    body: Incoming,
    home: Option<(SendRequest<Incoming>, Rc<Pool>)>,
}

impl Body for Pooled {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
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
        if let Some((sender, pool)) = self.home.take() {
            if self.body.is_end_stream() {
                pool.idle.borrow_mut().push(sender);
            }
        }
    }
}
