//! Wiring and lifecycle: bind everything, serve, and on a signal stop accepting, turn the queue away,
//! drain in-flight responses for at most the drain timeout, and return.

pub mod memory;
pub mod persist;
pub mod reload;
pub mod signal;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{watch, Semaphore};

use crate::config::{AdminAddr, Config, ListenAddr, StateBackend};
use crate::fleet::Fleet;
use crate::policy::{PolicyLoadError, PolicySet};
use crate::server::activation::{self, ActivationError};
use crate::server::conn::LINGER_EXTRA_BYTES;
use crate::server::notify::{self, Notifier};
use crate::server::{self, BindError, Listener, ServeOpts};
use crate::state::App;
use crate::{admin, pipeline};
use reload::ConfigSource;

/// Connections the admin listener serves at once.
const ADMIN_CONNECTIONS: usize = 64;
/// How often histogram summaries are compacted.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A socket of `flag` could not be bound.
    #[error("{flag}: {error}")]
    Bind {
        flag: &'static str,
        error: BindError,
    },
    #[error(transparent)]
    Activation(#[from] ActivationError),
    #[error("cannot listen for signals: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Policy(#[from] PolicyLoadError),
    #[error("invalid setting `state.redis-url`: {0}")]
    State(redis::RedisError),
    #[error("audit-log: cannot open {0}: {1}")]
    AuditLog(String, std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("cannot start the thread that writes policy budgets: {0}")]
    Persister(std::io::Error),
}

/// Runs until SIGTERM/SIGINT, then shuts down gracefully. SIGHUP (and a change to a watched file)
/// reloads the policy chain from `source`.
/// Client connections are accepted and served on this runtime and on each of `workers`.
pub async fn run(
    config: Config,
    prometheus: PrometheusHandle,
    source: ConfigSource,
    workers: Vec<tokio::runtime::Handle>,
) -> Result<(), StartError> {
    // SIGHUP's default action ends the process: take it over before anything else.
    let hangup = signal(SignalKind::hangup()).map_err(StartError::Signals)?;
    // Sockets systemd passed: made close-on-exec, and LISTEN_* unset, before anything could start a
    // child that would inherit them.
    let inherited = activation::take_from_env()?;
    // The watchdog pings from the start: compiling the policies may outlast its period.
    let notifier = Notifier::from_env();
    let watchdog = notify::watchdog_interval_from_env()
        .filter(|_| notifier.is_enabled())
        .map(|every| tokio::spawn(notify::watchdog_loop(notifier.clone(), every)));
    // Compile, validate and canary every policy before anything is bound: a bad policy fails the start.
    let policies = PolicySet::load(&config.policies, config.policy_cache_dir.clone())?;
    // Compiling the chain freed megabytes into malloc's arenas (see `memory::trim`).
    crate::app::memory::trim();
    // With the redis backend, budgets are the fleet's: leases, synced in the background. The store
    // need not be up to start: the failure mode applies until it is.
    let fleet = match config.state.backend {
        StateBackend::Redis => {
            let fleet = Fleet::new(&config.state).map_err(StartError::State)?;
            policies.shared().use_fleet(fleet.clone());
            Some(fleet)
        }
        StateBackend::Memory => None,
    };
    let ledger = Arc::new(crate::store::ledger::Ledger::new(
        config.state.usage_retention_days,
    ));
    // The memory backend's budgets, kept on disk and read back (`state.dir`).
    let first_listen = config
        .listen
        .first()
        .map(ToString::to_string)
        .unwrap_or_default();
    let _persister = match (
        config.state.backend,
        config.state.dir.resolve(&first_listen),
    ) {
        (backend, Some(dir)) => {
            let store = Arc::new(crate::store::Store::open(&dir)?);
            let file = store.file().display().to_string();
            let (buckets, windows) = policies.shared().use_store(store.clone())?;
            ledger.use_store(store);
            match backend {
                StateBackend::Memory => tracing::info!(file, buckets, windows, flush_interval = ?config.state.flush_interval, "policy budgets and the usage ledger kept on disk"),
                // The fleet's budgets are on its store; the usage ledger and the operators' quota
                // limits of this sidecar are kept here.
                StateBackend::Redis => tracing::info!(file, "the usage ledger and operators' quota limits kept on disk; budgets on the fleet's store"),
            }
            Some(
                persist::Persister::start(
                    policies.shared().clone(),
                    ledger.clone(),
                    config.state.flush_interval,
                )
                .map_err(StartError::Persister)?,
            )
        }
        (StateBackend::Memory, None) => {
            tracing::warn!("state.dir is off: policy budgets live in memory only, and a restart or a crash gives every tenant a full budget again");
            None
        }
        (StateBackend::Redis, None) => None,
    };
    crate::admin::audit::open(&config.admin.audit_log)
        .map_err(|e| StartError::AuditLog(config.admin.audit_log.to_string(), e))?;
    let app = Arc::new(App::new(
        config,
        prometheus,
        policies,
        fleet.clone(),
        ledger,
    ));
    let cfg = &app.config;

    // Bind everything first, so a bad address fails the start before anything is served. Sockets
    // inherited from systemd take the place of the configured ones (see `server::activation`).
    let mut listeners = inherited.clients;
    if listeners.is_empty() {
        for addr in &cfg.listen {
            listeners.push(
                Listener::bind(addr, cfg.socket_mode)
                    .await
                    .map_err(|error| StartError::Bind {
                        flag: "--listen",
                        error,
                    })?,
            );
        }
    } else {
        let ignored: Vec<String> = cfg.listen.iter().map(ToString::to_string).collect();
        tracing::info!(ignored = ?ignored, "client sockets inherited from systemd replace --listen");
    }
    let admin_listener = match (inherited.admin, &cfg.admin_listen) {
        (Some(l), configured) => {
            tracing::info!(ignored = %configured, "admin socket inherited from systemd replaces --admin-listen");
            Some(l)
        }
        (None, AdminAddr::Off) => None,
        (None, AdminAddr::Tcp(a)) => Some(
            Listener::bind(&ListenAddr::Tcp(*a), 0o660)
                .await
                .map_err(|error| StartError::Bind {
                    flag: "--admin-listen",
                    error,
                })?,
        ),
        (None, AdminAddr::Unix(p)) => Some(
            Listener::bind(&ListenAddr::Unix(p.clone()), cfg.admin.socket_mode)
                .await
                .map_err(|error| StartError::Bind {
                    flag: "--admin-listen",
                    error,
                })?,
        ),
    };
    let mut signals = signal::Signals::new().map_err(StartError::Signals)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let (admin_stop_tx, admin_stop_rx) = watch::channel(false);
    let conns = Arc::new(Semaphore::new(cfg.max_connections));
    let opts = ServeOpts {
        conns: conns.clone(),
        stop: stop_rx,
        header_timeout: cfg.header_timeout,
        stall_timeout: cfg.client_stall_timeout,
        linger_bytes: cfg.max_body as u64 + LINGER_EXTRA_BYTES,
        announce: true,
    };

    let mut background = vec![
        tokio::spawn(health_loop(app.clone())),
        tokio::spawn(upkeep_loop(app.prometheus.clone())),
        tokio::spawn(reload::run(app.clone(), source, hangup)),
    ];
    background.extend(watchdog);
    if let Some(fleet) = &app.fleet {
        tracing::info!(fleet = %cfg.state.fleet, on_unavailable = %cfg.state.on_unavailable, "policy budgets shared by the fleet (state backend: redis)");
        background.push(tokio::spawn(fleet.clone().run()));
    }
    let mut accepting = Vec::new();
    let mut serving = Vec::new();
    for listener in listeners {
        serving.push(listener.describe());
        tracing::info!(listen = %listener.describe(), "accepting clients");
        let app = app.clone();
        let handler = move |req, peer| pipeline::handle(app.clone(), req, peer);
        // Every runtime accepts on the socket: whichever is free takes the next connection.
        for worker in &workers {
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
    }
    let admin_at = admin_listener
        .as_ref()
        .map_or_else(|| "off".to_owned(), Listener::describe);
    let admin_task = admin_listener.map(|listener| {
        tracing::info!(listen = %listener.describe(), "admin endpoints up");
        warn_if_open(&app, &listener);
        let app = app.clone();
        let handler = move |req, peer| admin::handle(app.clone(), req, peer);
        let admin_opts = ServeOpts {
            conns: Arc::new(Semaphore::new(ADMIN_CONNECTIONS)),
            stop: admin_stop_rx,
            header_timeout: cfg.header_timeout,
            stall_timeout: cfg.client_stall_timeout,
            linger_bytes: LINGER_EXTRA_BYTES,
            announce: true,
        };
        tokio::spawn(server::accept_loop(listener, handler, admin_opts))
    });
    tracing::info!(
        upstream = %cfg.upstream,
        slots = %cfg.slots,
        queue_depth = cfg.queue_depth,
        queue_timeout = ?cfg.queue_timeout,
        "slotgate started"
    );
    notifier.ready(&format!(
        "serving {}; admin {admin_at}; upstream {}",
        serving.join(", "),
        cfg.upstream
    ));

    let which = signals.next().await;
    tracing::info!(signal = which, drain_timeout = ?cfg.drain_timeout, "shutting down: no new connections, queue turned away, draining in-flight responses");
    notifier.stopping(&format!(
        "{which}: draining in-flight responses for at most {:?}",
        cfg.drain_timeout
    ));

    let drain = async {
        // 1. Stop accepting; each accept loop drops (and so unlinks, unless systemd's) its socket.
        //    Open connections finish the request they are on, then close.
        let _ = stop_tx.send(true);
        for task in accepting {
            let _ = task.await;
        }
        // 2. Everyone still waiting gets a 503 with Retry-After instead of a slot.
        let retry_after = cfg.drain_timeout.as_secs().max(1);
        app.admission.close(retry_after);
        app.models.close(retry_after);
        // 3. Wait for every client connection to finish, for at most the drain timeout.
        let all = u32::try_from(cfg.max_connections).unwrap_or(u32::MAX);
        match tokio::time::timeout(cfg.drain_timeout, conns.acquire_many(all)).await {
            Ok(_) => tracing::info!("drained; exiting"),
            Err(_) => {
                crate::pipeline::access::cut_by_shutdown();
                tracing::warn!(
                    still_open = cfg.max_connections - conns.available_permits(),
                    "drain timeout reached; closing the remaining connections"
                )
            }
        }
    };
    // A second signal during the drain: stop now.
    tokio::select! {
        () = drain => {}
        again = signals.next() => {
            crate::pipeline::access::cut_by_shutdown();
            let _ = stop_tx.send(true);
            app.admission.close(1);
            app.models.close(1);
            tracing::warn!(
                signal = again,
                still_open = cfg.max_connections - conns.available_permits(),
                "second signal: stopping at once, closing the remaining connections"
            );
        }
    }
    // The last requests' settlements, before the budgets are written on the way out.
    let unsettled = app.policies.completions_done(Duration::from_secs(2)).await;
    if unsettled > 0 {
        tracing::warn!(
            unsettled,
            "policy settlements still running at exit: those requests stay charged their estimate"
        );
    }
    // Unused leased tokens go back to the fleet.
    if let Some(fleet) = &app.fleet {
        fleet.release_all(Duration::from_secs(1)).await;
    }
    let _ = admin_stop_tx.send(true);
    if let Some(task) = admin_task {
        let _ = task.await;
    }
    for task in background {
        task.abort();
    }
    Ok(())
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

async fn health_loop(app: Arc<App>) {
    let timeout = app.config.connect_timeout + Duration::from_secs(1);
    let mut tick = tokio::time::interval(app.config.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let was_ready = app.upstream.is_ready();
        let ready = app.upstream.probe_health(timeout).await;
        // The slot context can change only across a restart of llama-server: read it when it
        // becomes ready, and until it has been read.
        // (A router's own /props has no slot context: its models' are read with its list.)
        let router = app.capacity.router.is_on();
        if ready && (!was_ready || (app.capacity.slot_context().is_none() && !router)) {
            app.capacity.refresh().await;
            app.follow_upstream();
            app.cors.learn(&app.upstream).await;
        } else if ready && router {
            // In front of a router: its models' states, every check, and each pool follows.
            app.capacity.router.refresh(&app.upstream).await;
        }
        if ready && app.capacity.router.is_on() {
            app.models.follow();
        }
    }
}

async fn upkeep_loop(handle: PrometheusHandle) {
    let mut tick = tokio::time::interval(METRICS_UPKEEP);
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}
