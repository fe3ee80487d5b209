//! The stack's limit, for `scripts/bench.sh`: what hyper, hyper-util, http-body-util and tokio, at
//! the versions of the workspace's Cargo.lock, can do with nothing of slotgate on top. Two binaries
//! share this: `stack-proxy` (a bare reverse proxy) and `stack-429` (a bare prepared refusal).
//!
//! Each runs in one of three shapes (`--shape`):
//!
//! - `multi`: one multi-thread runtime with a worker per core (or `--threads`), one listener whose
//!   connections are spawned as tasks: slotgate's own shape today.
//! - `current`: one current-thread runtime; everything on one thread, `!Send` state allowed.
//! - `per-core`: one current-thread runtime per core (or `--threads`), each with a listener of its
//!   own on the same TCP port (`SO_REUSEPORT`: the kernel spreads the connections) and state of its
//!   own. Nothing is shared between the threads.
//!
//! No timers (no header-read timeout), no logging, no metrics: those are slotgate's costs, not the
//! stack's.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixListener, UnixStream};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shape {
    Multi,
    Current,
    PerCore,
}

/// `tcp:HOST:PORT` or `unix:PATH`, as slotgate spells its addresses.
#[derive(Clone, Debug)]
pub enum Addr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Addr {
    type Err = String;
    fn from_str(s: &str) -> Result<Addr, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            Ok(Addr::Unix(path.into()))
        } else if let Some(addr) = s.strip_prefix("tcp:") {
            addr.parse()
                .map(Addr::Tcp)
                .map_err(|e| format!("{addr}: {e}"))
        } else {
            Err(format!("{s}: expected tcp:HOST:PORT or unix:PATH"))
        }
    }
}

/// The flags both binaries take.
#[derive(Parser, Debug)]
pub struct Common {
    /// Where to listen: tcp:HOST:PORT or unix:PATH (per-core needs tcp).
    #[arg(long)]
    pub listen: Addr,
    #[arg(long, value_enum, default_value = "multi")]
    pub shape: Shape,
    /// Worker threads (multi) or runtimes (per-core); one per core by default. current: always 1.
    #[arg(long)]
    pub threads: Option<usize>,
}

impl Common {
    fn threads(&self) -> usize {
        self.threads
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1)
            .max(1)
    }
}

/// Serves in the `multi` shape: one multi-thread runtime, every connection a task of its own.
pub fn serve_multi<H, F, B>(common: &Common, handler: H) -> io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(common.threads())
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = Listener::bind(&common.listen, false)?;
        loop {
            tokio::spawn(serve(listener.accept().await?, handler.clone()));
        }
    })
}

/// Serves in the `current` or `per-core` shape: `make` is called once per runtime, so what the
/// handler holds (a connection pool) is that runtime's own and may be `!Send`.
pub fn serve_local<M, H, F, B>(common: &Common, make: M) -> io::Result<()>
where
    M: Fn() -> H + Send + Sync + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + 'static,
    F: Future<Output = Response<B>> + 'static,
    B: Body<Data = Bytes> + 'static,
    B::Error: Into<BoxError>,
{
    let per_core = common.shape == Shape::PerCore;
    if per_core && matches!(common.listen, Addr::Unix(_)) {
        return Err(io::Error::other(
            "per-core listens with SO_REUSEPORT: it needs tcp:",
        ));
    }
    let runtimes = if per_core { common.threads() } else { 1 };
    let make = Arc::new(make);
    for _ in 1..runtimes {
        let (make, listen) = (make.clone(), common.listen.clone());
        std::thread::spawn(move || {
            if let Err(e) = serve_one(&listen, per_core, &*make) {
                eprintln!("stack: {e}");
                std::process::exit(1);
            }
        });
    }
    serve_one(&common.listen, per_core, &*make)
}

fn serve_one<M, H, F, B>(listen: &Addr, reuse_port: bool, make: &M) -> io::Result<()>
where
    M: Fn() -> H,
    H: Fn(Request<Incoming>) -> F + Clone + 'static,
    F: Future<Output = Response<B>> + 'static,
    B: Body<Data = Bytes> + 'static,
    B::Error: Into<BoxError>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let listener = Listener::bind(listen, reuse_port)?;
        let handler = make();
        loop {
            tokio::task::spawn_local(serve(listener.accept().await?, handler.clone()));
        }
    })
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Listener {
    /// Binds inside the runtime it will accept on (the listener registers with its reactor).
    fn bind(addr: &Addr, reuse_port: bool) -> io::Result<Listener> {
        match addr {
            Addr::Tcp(a) => {
                let socket = if a.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                };
                socket.set_reuseaddr(true)?;
                if reuse_port {
                    socket.set_reuseport(true)?;
                }
                socket.bind(*a)?;
                Ok(Listener::Tcp(socket.listen(1024)?))
            }
            Addr::Unix(path) => {
                let _ = std::fs::remove_file(path);
                Ok(Listener::Unix(UnixListener::bind(path)?))
            }
        }
    }

    async fn accept(&self) -> io::Result<Conn> {
        Ok(match self {
            Listener::Tcp(l) => {
                let (stream, _) = l.accept().await?;
                stream.set_nodelay(true)?;
                Conn::Tcp(stream)
            }
            Listener::Unix(l) => Conn::Unix(l.accept().await?.0),
        })
    }
}

/// One client connection: HTTP/1.1 with keep-alive, hyper's defaults otherwise.
async fn serve<H, F, B>(conn: Conn, handler: H)
where
    H: Fn(Request<Incoming>) -> F + 'static,
    F: Future<Output = Response<B>> + 'static,
    B: Body<Data = Bytes> + 'static,
    B::Error: Into<BoxError>,
{
    let service = service_fn(move |req| {
        let answer = handler(req);
        async move { Ok::<_, Infallible>(answer.await) }
    });
    let http = http1::Builder::new();
    // A connection that ends in an error (the client left mid-request) has nobody to tell.
    let _ = match conn {
        Conn::Tcp(s) => http.serve_connection(TokioIo::new(s), service).await,
        Conn::Unix(s) => http.serve_connection(TokioIo::new(s), service).await,
    };
}
