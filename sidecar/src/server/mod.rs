//! Servers: accept loops that give each connection its lane (`capacity`: the cap, each peer's share,
//! the spare lane that keeps probes answered), back off when the process runs out of file
//! descriptors, and stop accepting (dropping, and so unlinking, their sockets) on shutdown.
//! `activation` takes the sockets systemd passed (never unlinked); `notify` tells systemd how we are.

pub mod activation;
pub mod capacity;
pub mod conn;
pub mod listener;
pub mod notify;
pub mod tarpit;
pub mod write_watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use slotgate_sdk::Peer;
use tokio::sync::watch;

use crate::respond::Body;
use capacity::Capacity;
pub use listener::{BindError, Listener, SharedListener};

const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What every connection of one server shares.
#[derive(Clone)]
pub struct ServeOpts {
    /// The caps, and the spare lane past them (shared by every accept loop of the listener).
    pub capacity: Arc<Capacity>,
    /// Flips to `true` once: stop accepting, finish the request in progress, close.
    pub stop: watch::Receiver<bool>,
    pub header_timeout: Duration,
    /// A client that takes no byte of a waiting response for this long is cut (`None`: never).
    pub stall_timeout: Option<Duration>,
    /// Most bytes read and discarded in a lingering close.
    pub linger_bytes: u64,
    /// Logs when it stops accepting (the one loop of each socket that does; see `quiet`).
    pub announce: bool,
}

impl ServeOpts {
    /// The same, for a second accept loop on a socket: its stop is the first loop's to log.
    pub fn quiet(mut self) -> Self {
        self.announce = false;
        self
    }
}

pub async fn accept_loop<H, F>(listener: Listener, handler: H, opts: ServeOpts)
where
    H: Fn(Request<Incoming>, Option<Peer>) -> F + Clone + Send + Sync + Unpin + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let name = listener.describe();
    let mut stop = opts.stop.clone();
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stopped(&mut stop) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                let key = stream.peer_key(peer);
                let lane = tokio::select! {
                    lane = opts.capacity.admit(key) => lane,
                    _ = stopped(&mut stop) => break,
                };
                tokio::spawn(conn::serve(
                    stream,
                    peer,
                    key,
                    handler.clone(),
                    lane,
                    opts.clone(),
                ));
            }
            Err(e) if is_resource_exhaustion(&e) => {
                tracing::warn!(listener = %name, error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed; backing off");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            }
            Err(e) => tracing::debug!(listener = %name, error = %e, "accept failed"),
        }
    }
    if opts.announce {
        tracing::info!(listener = %name, "stopped accepting");
    }
}

/// Resolves once the stop flag is set (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The borrow guard returned by `wait_for` is not `Send`; drop it here, not across an await.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// EMFILE / ENFILE / ENOBUFS / ENOMEM: retrying at once would spin.
fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(23 | 24 | 105 | 12))
}
