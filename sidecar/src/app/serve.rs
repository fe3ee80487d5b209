//! Serving: the background tasks started, every runtime accepting on every client socket, the
//! admin listener on this one, and systemd told slotgate is ready. What the drain needs to stop it
//! all is handed back as [`Serving`].

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use super::bind::Bound;
use super::persist::Persister;
use super::reload::ConfigSource;
use super::signal::Signals;
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

/// Starts serving on what [`bind`](super::bind::bind) made; returns at once, with everything running.
pub(super) fn serve(b: Bound, source: ConfigSource, workers: &[Handle]) -> Serving {
    let app = b.app;
    let cfg = &app.config;
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
    let background = super::background::start(&app, source, b.hangup, b.watchdog);
    let mut accepting = Vec::new();
    let mut serving = Vec::new();
    for listener in b.listeners {
        serving.push(listener.describe());
        accepting.extend(accept_clients(&app, listener, &opts, workers));
    }
    let admin_at = (b.admin.as_ref()).map_or_else(|| "off".to_owned(), Listener::describe);
    let admin = (b.admin).map(|listener| serve_admin(&app, listener, admin_stop_rx));
    tracing::info!(
        upstream = %cfg.upstream,
        slots = %cfg.slots,
        queue_depth = cfg.queue_depth,
        queue_timeout = ?cfg.queue_timeout,
        "slotgate started"
    );
    b.notifier.ready(&format!(
        "serving {}; admin {admin_at}; upstream {}",
        serving.join(", "),
        cfg.upstream
    ));
    Serving {
        app,
        notifier: b.notifier,
        signals: b.signals,
        stop,
        admin_stop,
        conns,
        accepting,
        admin,
        background,
        persister: b.persister,
    }
}

/// Accept loops on one client socket: one on each worker runtime and one on this, so whichever is
/// free takes the next connection.
fn accept_clients(
    app: &Arc<App>,
    listener: Listener,
    opts: &ServeOpts,
    workers: &[Handle],
) -> Vec<JoinHandle<()>> {
    tracing::info!(listen = %listener.describe(), "accepting clients");
    let app = app.clone();
    let handler = move |req, peer| pipeline::handle(app.clone(), req, peer);
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
fn serve_admin(app: &Arc<App>, listener: Listener, stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tracing::info!(listen = %listener.describe(), "admin endpoints up");
    warn_if_open(app, &listener);
    let app = app.clone();
    let cfg = &app.config;
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
    let handler = move |req, peer| admin::handle(app.clone(), req, peer);
    tokio::spawn(server::accept_loop(listener, handler, opts))
}

/// Says at start what an unauthenticated caller can do on a TCP admin listener without a token.
fn warn_if_open(app: &App, listener: &Listener) {
    if !matches!(listener, Listener::Tcp(_)) || app.admin_tokens().required() {
        return;
    }
    let listen = listener.describe();
    if app.upstream.has_key() {
        tracing::warn!(listen, "the admin listener is on TCP without --admin-token-file: anyone who can connect reads /status, /live and /metrics (tenants, request ids, paths); llama-server's admin routes (slots, LoRA, props, models) reach it with the caller's own credentials only, never slotgate's key; set --admin-token-file (docs/security.md)");
    } else {
        tracing::warn!(listen, "the admin listener is on TCP without --admin-token-file: anyone who can connect reads /status, /live and /metrics (tenants, request ids, paths) and calls llama-server's admin routes (save, restore and erase slots, LoRA, props, load and unload models) as llama-server allows them without a key; set --admin-token-file (docs/security.md)");
    }
}
