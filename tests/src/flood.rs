//! A slow-loris flood and a one-second probe, for the tests that probes keep answering.
//!
//! The flood runs on a thread and a runtime of its own, so the test's runtime (and its probes) is not
//! starved by it: it holds `n` connections that have each sent part of a request head and nothing
//! more, and opens a new one as soon as slotgate closes one.
//!
//! ```ignore
//! let flood = Flood::start(Target::Tcp(admin), 200, b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Slow: ");
//! flood.wait_held(64, Duration::from_secs(10));
//! assert_eq!(probe(&Target::Tcp(admin), "/readyz", Duration::from_secs(1)).await, Some(200));
//! ```

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UnixStream};

use crate::client::Target;

/// The start of a request head, never finished.
pub const HALF_HEAD: &[u8] = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";

/// A running flood; stopped (and its connections closed) when dropped.
pub struct Flood {
    stop: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Flood {
    /// `n` half-sent heads to `target`, each reopened when slotgate closes it.
    pub fn start(target: Target, n: usize, head: &'static [u8]) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicUsize::new(0));
        let opened = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, held, opened) = (stop.clone(), held.clone(), opened.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the flood's runtime");
                rt.block_on(async move {
                    let tasks: Vec<_> = (0..n)
                        .map(|_| {
                            let c = Holder {
                                target: target.clone(),
                                head,
                                stop: stop.clone(),
                                held: held.clone(),
                                opened: opened.clone(),
                            };
                            tokio::spawn(c.run())
                        })
                        .collect();
                    for t in tasks {
                        let _ = t.await;
                    }
                });
            })
        };
        Flood {
            stop,
            held,
            opened,
            thread: Some(thread),
        }
    }

    /// Connections open now, their half head sent.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Connections opened so far (reopenings included).
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` connections are held; panics after `timeout`.
    pub fn wait_held(&self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.held() < n {
            assert!(
                Instant::now() < deadline,
                "the flood holds {} connections, not {n}, after {timeout:?}",
                self.held()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One of the flood's connections, over and over.
struct Holder {
    target: Target,
    head: &'static [u8],
    stop: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
}

impl Holder {
    async fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            match &self.target {
                Target::Tcp(a) => match TcpStream::connect(a).await {
                    Ok(s) => self.hold(s).await,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                },
                Target::Unix(p) => match UnixStream::connect(p).await {
                    Ok(s) => self.hold(s).await,
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                },
            }
        }
    }

    /// Sends the half head, then waits for the close (or the flood's end).
    async fn hold<S: AsyncRead + AsyncWrite + Unpin>(&self, mut s: S) {
        self.opened.fetch_add(1, Ordering::Relaxed);
        if s.write_all(self.head).await.is_err() {
            return;
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 1024];
        loop {
            tokio::select! {
                r = s.read(&mut buf) => match r {
                    Ok(n) if n > 0 => continue,
                    _ => break,
                },
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    if self.stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            }
        }
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One probe as a kubelet sends it: a fresh connection, `GET path`, the answer's status within
/// `timeout` (connect included); `None` when none came in time.
pub async fn probe(target: &Target, path: &str, timeout: Duration) -> Option<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let exchange = async {
        let got = match target {
            Target::Tcp(a) => exchange(TcpStream::connect(a).await.ok()?, &request).await,
            Target::Unix(p) => exchange(UnixStream::connect(p).await.ok()?, &request).await,
        }?;
        status_of(&got)
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// `path`'s status, asked from the address `from` (a second loopback address is another peer).
pub async fn get_from(from: IpAddr, to: SocketAddr, path: &str) -> Option<(u16, String)> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::new(from, 0)).ok()?;
    let s = socket.connect(to).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let got = tokio::time::timeout(Duration::from_secs(5), exchange(s, &request))
        .await
        .ok()??;
    Some((status_of(&got)?, String::from_utf8_lossy(&got).into_owned()))
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, request: &str) -> Option<Vec<u8>> {
    s.write_all(request.as_bytes()).await.ok()?;
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got).await;
    Some(got)
}

fn status_of(got: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(got.get(..12)?).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}
