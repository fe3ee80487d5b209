//! Serving: every runtime accepting on every client socket and the admin listener on this one, from
//! the moment they are bound ([`accept`], answering `starting` until the start is done); then the
//! background tasks started and systemd told slotgate is ready ([`serve`]). What the drain needs to
//! stop it all is handed back as [`Serving`].

use std::sync::Arc;

use futures_util::future::Either;
use http::Request;
use hyper::body::Incoming;
use slotgate_sdk::Peer;
use tokio::runtime::Handle;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use super::bind::Bound;
use super::persist::Persister;
use super::reload::ConfigSource;
use super::signal::Signals;
use super::starting::Starting;
use crate::config::Config;
use crate::server::capacity::{Capacity, Limits};
use crate::server::conn::LINGER_EXTRA_BYTES;
use crate::server::notify::Notifier;
use crate::server::{self, Listener, ServeOpts};
use crate::state::App;
use crate::{admin, pipeline};

/// Connections the admin listener serves at once (its spare lane aside).
const ADMIN_CONNECTIONS: usize = 64;
/// The most of them one peer holds on the admin listener (less when --max-connections-per-peer is).
const ADMIN_CONNECTIONS_PER_PEER: usize = 16;
/// What the spare lane answers past the connection limits, on each listener.
const CLIENT_PROBES: &[&str] = &["/health", "/v1/health"];
const ADMIN_PROBES: &[&str] = &["/livez", "/readyz"];

/// What is running, for the drain to stop.
pub(super) struct Serving {
    pub app: Arc<App>,
    pub notifier: Notifier,
    pub signals: Signals,
    /// Flips to `true` once: the client accept loops stop, their connections close after the
    /// request they are on.
    pub stop: watch::Sender<bool>,
    /// The same, for the admin listener (stopped last).
    pub admin_stop: watch::Sender<bool>,
    /// One permit per open client connection: all of them back means drained.
    pub conns: Arc<Semaphore>,
    /// The client accept loops, on every runtime.
    pub accepting: Vec<JoinHandle<()>>,
    pub admin: Option<JoinHandle<()>>,
    pub background: Vec<JoinHandle<()>>,
    pub persister: Option<Persister>,
}

/// The accept loops, running from the moment the sockets are bound.
pub(super) struct Accepting {
    stop: watch::Sender<bool>,
    admin_stop: watch::Sender<bool>,
    conns: Arc<Semaphore>,
    accepting: Vec<JoinHandle<()>>,
    admin: Option<JoinHandle<()>>,
    /// The sockets served, as systemd's status line names them.
    serving: Vec<String>,
    admin_at: String,
}

impl Accepting {
    /// A start that failed: every accept loop stops, and the sockets close.
    pub(super) fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.admin_stop.send(true);
    }
}

/// Accepts on every socket at once: `starting` answers until the start is done, then the request
/// path and the admin endpoints do.
pub(super) fn accept(
    cfg: &Config,
    sockets: (Vec<Listener>, Option<Listener>),
    starting: &Arc<Starting>,
    workers: &[Handle],
) -> Accepting {
    let (listeners, admin) = sockets;
    let (stop, stop_rx) = watch::channel(false);
    let (admin_stop, admin_stop_rx) = watch::channel(false);
    crate::server::tarpit::configure(cfg.refusal_burst, cfg.refusal_rate);
    let capacity = Capacity::new(Limits {
        listener: "client",
        connections: cfg.max_connections,
        per_peer: cfg.max_connections_per_peer,
        probes: CLIENT_PROBES,
    });
    let conns = capacity.connections();
    let opts = ServeOpts {
        capacity,
        stop: stop_rx,
        header_timeout: cfg.header_timeout,
        stall_timeout: cfg.client_stall_timeout,
        linger_bytes: cfg.max_body as u64 + LINGER_EXTRA_BYTES,
        announce: true,
    };
    let mut accepting = Vec::new();
    let mut serving = Vec::new();
    for listener in listeners {
        serving.push(listener.describe());
        accepting.extend(accept_clients(starting, listener, &opts, workers));
    }
    let admin_at = admin
        .as_ref()
        .map_or_else(|| "off".to_owned(), Listener::describe);
    let admin = admin.map(|listener| serve_admin(cfg, starting, listener, admin_stop_rx));
    Accepting {
        stop,
        admin_stop,
        conns,
        accepting,
        admin,
        serving,
        admin_at,
    }
}

/// Starts the rest on what [`build`](super::bind::build) made, the sockets already accepting;
/// returns at once, with everything running.
pub(super) fn serve(b: Bound, a: Accepting, source: ConfigSource) -> Serving {
    let app = b.app;
    let cfg = &app.config;
    let background = super::background::start(&app, source, b.hangup, b.watchdog);
    warn_if_open(&app, &a.admin_at);
    tracing::info!(
        upstream = %cfg.upstream,
        slots = %cfg.slots,
        queue_depth = cfg.queue_depth,
        queue_timeout = ?cfg.queue_timeout,
        "slotgate started"
    );
    b.notifier.ready(&format!(
        "serving {}; admin {}; upstream {}",
        a.serving.join(", "),
        a.admin_at,
        cfg.upstream
    ));
    Serving {
        app,
        notifier: b.notifier,
        signals: b.signals,
        stop: a.stop,
        admin_stop: a.admin_stop,
        conns: a.conns,
        accepting: a.accepting,
        admin: a.admin,
        background,
        persister: b.persister,
    }
}

/// Accept loops on one client socket: one on each worker runtime and one on this, so whichever is
/// free takes the next connection.
fn accept_clients(
    starting: &Arc<Starting>,
    listener: Listener,
    opts: &ServeOpts,
    workers: &[Handle],
) -> Vec<JoinHandle<()>> {
    tracing::info!(listen = %listener.describe(), "accepting clients");
    let starting = starting.clone();
    let handler = move |req: Request<Incoming>, peer: Option<Peer>| match starting.app() {
        Some(app) => Either::Left(pipeline::handle(app.clone(), req, peer)),
        None => Either::Right(std::future::ready(starting.client_answer(&req))),
    };
    let mut accepting = Vec::new();
    for worker in workers {
        let shared = match listener.share() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(listen = %listener.describe(), error = %e, "a worker cannot accept on this socket; it serves the others");
                continue;
            }
        };
        let (handler, opts) = (handler.clone(), opts.clone());
        accepting.push(worker.spawn(async move {
            match shared.into_listener() {
                Ok(listener) => server::accept_loop(listener, handler, opts.quiet()).await,
                Err(e) => tracing::warn!(error = %e, "a worker cannot accept on a socket"),
            }
        }));
    }
    accepting.push(tokio::spawn(server::accept_loop(
        listener,
        handler,
        opts.clone(),
    )));
    accepting
}

/// The admin listener's accept loop, on this runtime.
fn serve_admin(
    cfg: &Config,
    starting: &Arc<Starting>,
    listener: Listener,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tracing::info!(listen = %listener.describe(), "admin endpoints up");
    let capacity = Capacity::new(Limits {
        listener: "admin",
        connections: ADMIN_CONNECTIONS,
        per_peer: cfg.max_connections_per_peer.min(ADMIN_CONNECTIONS_PER_PEER),
        probes: ADMIN_PROBES,
    });
    let opts = ServeOpts {
        capacity,
        stop,
        header_timeout: cfg.header_timeout,
        stall_timeout: cfg.client_stall_timeout,
        linger_bytes: LINGER_EXTRA_BYTES,
        announce: true,
    };
    let starting = starting.clone();
    let handler = move |req: Request<Incoming>, peer: Option<Peer>| match starting.app() {
        Some(app) => Either::Left(admin::handle(app.clone(), req, peer)),
        None => Either::Right(std::future::ready(starting.admin_answer(&req))),
    };
    tokio::spawn(server::accept_loop(listener, handler, opts))
}

/// Says at start what an unauthenticated caller can do on a TCP admin listener (`listen`, as
/// [`Listener::describe`] names it) without a token.
fn warn_if_open(app: &App, listen: &str) {
    if !listen.starts_with("tcp:") || app.admin_tokens().required() {
        return;
    }
    if app.upstream.has_key() {
        tracing::warn!(listen, "the admin listener is on TCP without --admin-token-file: anyone who can connect reads /status, /live and /metrics (tenants, request ids, paths); llama-server's admin routes (slots, LoRA, props, models) reach it with the caller's own credentials only, never slotgate's key; set --admin-token-file (docs/security.md)");
    } else {
        tracing::warn!(listen, "the admin listener is on TCP without --admin-token-file: anyone who can connect reads /status, /live and /metrics (tenants, request ids, paths) and calls llama-server's admin routes (save, restore and erase slots, LoRA, props, load and unload models) as llama-server allows them without a key; set --admin-token-file (docs/security.md)");
    }
}
