//! The start, in its order: SIGHUP taken over, systemd's sockets taken, the watchdog pinging,
//! every socket bound ([`listen`]); then, while those sockets answer `starting`
//! (`app::starting`), the policies compiled, the budgets' state opened and the `App` built
//! ([`build`]). Anything wrong fails the start ([`StartError`]) before a request is served.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::task::JoinHandle;

use super::persist::Persister;
use super::signal::Signals;
use super::starting::Starting;
use crate::config::{AdminAddr, Config, ListenAddr, StateBackend};
use crate::fleet::Fleet;
use crate::owner_only::FileError;
use crate::policy::{PolicyLoadError, PolicySet};
use crate::server::activation::{self, ActivationError};
use crate::server::notify::{self, Notifier};
use crate::server::{BindError, Listener};
use crate::state::App;
use crate::store::ledger::Ledger;

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
    #[error("audit-log: {0}")]
    AuditLog(FileError),
    #[error("policy-cache-dir: {0}")]
    PolicyCache(FileError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("cannot start the thread that writes policy budgets: {0}")]
    Persister(std::io::Error),
    /// The keys slotgate issued could not be read, or `--client-auth keys` has nowhere to keep them.
    #[error("keys: {0}")]
    Keys(String),
}

impl StartError {
    /// A path refused because another user could read or replace it: like an invalid setting,
    /// the operator's to fix (exit 2), not a failure while running.
    pub fn is_refusal(&self) -> bool {
        use crate::store::StoreError;
        matches!(
            self,
            StartError::AuditLog(FileError::Unsafe { .. })
                | StartError::PolicyCache(FileError::Unsafe { .. })
                | StartError::Store(StoreError::File(FileError::Unsafe { .. }))
                | StartError::Keys(_)
        )
    }
}

/// The sockets and signals the start takes first.
pub(super) struct Sockets {
    /// SIGHUP, for the reloader.
    pub hangup: Signal,
    pub notifier: Notifier,
    /// The watchdog's pings, running since the start.
    pub watchdog: Option<JoinHandle<()>>,
    /// The client sockets: systemd's, or `--listen`'s.
    pub listeners: Vec<Listener>,
    pub admin: Option<Listener>,
}

/// What the start made, ready to serve.
pub(super) struct Bound {
    pub app: Arc<App>,
    /// SIGHUP, for the reloader.
    pub hangup: Signal,
    pub notifier: Notifier,
    /// The watchdog's pings, running since the start.
    pub watchdog: Option<JoinHandle<()>>,
    /// SIGTERM and SIGINT, listened for from the end of the start.
    pub signals: Signals,
    /// Writes the budgets to `state.dir`; once more when dropped.
    pub persister: Option<Persister>,
}

/// Takes the signals and binds every socket: a bad address fails the start before anything else
/// is done. Sockets inherited from systemd take the place of the configured ones (see
/// `server::activation`).
pub(super) async fn listen(config: &Config) -> Result<Sockets, StartError> {
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
    let listeners = client_listeners(config, inherited.clients).await?;
    let admin = admin_listener(config, inherited.admin).await?;
    Ok(Sockets {
        hangup,
        notifier,
        watchdog,
        listeners,
        admin,
    })
}

/// Makes everything slotgate serves with, in the order the start needs, while `starting` answers
/// on the sockets.
pub(super) async fn build(
    config: Config,
    prometheus: PrometheusHandle,
    sockets: (Signal, Notifier, Option<JoinHandle<()>>),
    starting: &Starting,
) -> Result<Bound, StartError> {
    let (hangup, notifier, watchdog) = sockets;
    // Compile, validate and canary every policy: a bad policy fails the start. Checked (made 0700)
    // first, so a cache another user could write refuses the start as such.
    if let Some(dir) = &config.policy_cache_dir {
        crate::owner_only::dir(dir).map_err(StartError::PolicyCache)?;
    }
    let policies = compile(&config, starting).await?;
    // Compiling the chain freed megabytes into malloc's arenas (see `memory::trim`).
    crate::app::memory::trim();
    let fleet = fleet(&config, &policies)?;
    let ledger = Arc::new(Ledger::priced(
        config.state.usage_retention_days,
        config.state.usage_zone.0.clone(),
        config.prices.clone(),
    ));
    let (persister, store) = state_on_disk(&config, &policies, &ledger)?;
    let keys = keys(&config, store)?;
    if let (Some(fleet), crate::config::ClientAuth::Keys) = (&fleet, config.client_auth) {
        keys.share();
        fleet.share_keys(keys.clone());
    }
    crate::admin::audit::open(&config.admin.audit_log).map_err(StartError::AuditLog)?;
    let mut app = App::new(config, prometheus, policies, fleet, ledger);
    app.keys = keys;
    let app = Arc::new(app);
    // Taken last: a SIGTERM while the policies compile ends the process as it always does.
    let signals = Signals::new().map_err(StartError::Signals)?;
    Ok(Bound {
        app,
        hangup,
        notifier,
        watchdog,
        signals,
        persister,
    })
}

/// Compiles, validates and canaries the chain on the blocking pool (this runtime's accept loops
/// answer meanwhile), one log line per policy before and one for the chain after: how long it
/// took and how much of it the compile cache held.
async fn compile(config: &Config, starting: &Starting) -> Result<PolicySet, StartError> {
    let specs = config.policies.clone();
    let cache = config.policy_cache_dir.clone();
    if specs.is_empty() {
        return Ok(PolicySet::load(&specs, cache)?);
    }
    let names: Vec<String> = specs.iter().map(|s| s.display_name()).collect();
    for (spec, name) in specs.iter().zip(&names) {
        let bytes = std::fs::metadata(&spec.path).map_or(0, |m| m.len());
        tracing::info!(policy = %name, path = %spec.path.display(), bytes, compile_cache = %cache.as_ref().map_or("off".to_owned(), |d| d.display().to_string()), "compiling policy");
    }
    starting.doing(&format!("compiling policy `{}`", names.join("`, `")));
    let started = std::time::Instant::now();
    let load = tokio::task::spawn_blocking(move || PolicySet::load(&specs, cache));
    let policies = match load.await {
        Ok(loaded) => loaded?,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    let disk = &policies.cache_status()["disk"];
    let cached = match (disk["hits"].as_u64(), disk["misses"].as_u64()) {
        (Some(hits), Some(misses)) => format!(
            "{hits} of {} modules read from the compile cache",
            hits + misses
        ),
        _ => "no compile cache (--policy-cache-dir)".to_owned(),
    };
    tracing::info!(
        policies = %names.join(","),
        ms = started.elapsed().as_millis() as u64,
        cached = %cached,
        "policies compiled, validated and canaried"
    );
    Ok(policies)
}

/// With the redis backend, budgets are the fleet's: leases, synced in the background. The store
/// need not be up to start: the failure mode applies until it is.
fn fleet(config: &Config, policies: &PolicySet) -> Result<Option<Arc<Fleet>>, StartError> {
    match config.state.backend {
        StateBackend::Redis => {
            let fleet = Fleet::new(&config.state).map_err(StartError::State)?;
            policies.shared().use_fleet(fleet.clone());
            Ok(Some(fleet))
        }
        StateBackend::Memory => Ok(None),
    }
}

/// The keys slotgate issued, from the state store. `--client-auth keys` needs one: a key, or its
/// revocation, that a restart forgot would let the wrong callers in.
fn keys(
    config: &Config,
    store: Option<Arc<crate::store::Store>>,
) -> Result<Arc<crate::keys::Keys>, StartError> {
    if config.client_auth == crate::config::ClientAuth::Keys && store.is_none() {
        return Err(StartError::Keys(
            "--client-auth keys keeps the keys it issues in state.dir, which is off; give --state-dir (or leave it auto)".into(),
        ));
    }
    let keys = crate::keys::Keys::open(store).map_err(StartError::Keys)?;
    if let Some(path) = &config.keys_file {
        let n = keys
            .load_file(path, crate::budgets::wall_ms())
            .map_err(StartError::Keys)?
            .unwrap_or(0);
        tracing::info!(file = %path.display(), keys = n, "keys file read; re-read when it changes");
    }
    if config.client_auth == crate::config::ClientAuth::Keys {
        tracing::info!(
            keys = keys.len(),
            "client-auth keys: every caller needs a key slotgate issued (slotgate key create)"
        );
    }
    Ok(Arc::new(keys))
}

/// The memory backend's budgets, kept on disk and read back (`state.dir`); with either backend the
/// usage ledger, the operators' quota limits and the keys slotgate issued.
#[allow(
    clippy::type_complexity,
    reason = "the persister and the store it writes, both or neither"
)]
fn state_on_disk(
    config: &Config,
    policies: &PolicySet,
    ledger: &Arc<Ledger>,
) -> Result<(Option<Persister>, Option<Arc<crate::store::Store>>), StartError> {
    let first_listen = config
        .listen
        .first()
        .map(ToString::to_string)
        .unwrap_or_default();
    match (
        config.state.backend,
        config.state.dir.resolve(&first_listen),
    ) {
        (backend, Some(dir)) => {
            let store = Arc::new(crate::store::Store::open(&dir)?);
            let file = store.file().display().to_string();
            let (buckets, windows) = policies.shared().use_store(store.clone())?;
            ledger.use_store(store.clone());
            match backend {
                StateBackend::Memory => tracing::info!(file, buckets, windows, flush_interval = ?config.state.flush_interval, "policy budgets and the usage ledger kept on disk"),
                // The fleet's budgets are on its store; the usage ledger and the operators' quota
                // limits of this sidecar are kept here.
                StateBackend::Redis => tracing::info!(file, "the usage ledger and operators' quota limits kept on disk; budgets on the fleet's store"),
            }
            let persister = Persister::start(
                policies.shared().clone(),
                ledger.clone(),
                config.state.flush_interval,
            )
            .map_err(StartError::Persister)?;
            Ok((Some(persister), Some(store)))
        }
        (StateBackend::Memory, None) => {
            tracing::warn!("state.dir is off: policy budgets live in memory only, and a restart or a crash gives every tenant a full budget again");
            Ok((None, None))
        }
        (StateBackend::Redis, None) => Ok((None, None)),
    }
}

/// The client sockets: those systemd passed, else one bound for each `--listen`.
async fn client_listeners(
    cfg: &Config,
    inherited: Vec<Listener>,
) -> Result<Vec<Listener>, StartError> {
    if !inherited.is_empty() {
        let ignored: Vec<String> = cfg.listen.iter().map(ToString::to_string).collect();
        tracing::info!(ignored = ?ignored, "client sockets inherited from systemd replace --listen");
        return Ok(inherited);
    }
    let mut listeners = Vec::new();
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
    Ok(listeners)
}

/// The admin socket: the one systemd passed, else `--admin-listen`'s (none when off).
async fn admin_listener(
    cfg: &Config,
    inherited: Option<Listener>,
) -> Result<Option<Listener>, StartError> {
    let (addr, mode) = match (inherited, &cfg.admin_listen) {
        (Some(l), configured) => {
            tracing::info!(ignored = %configured, "admin socket inherited from systemd replaces --admin-listen");
            return Ok(Some(l));
        }
        (None, AdminAddr::Off) => return Ok(None),
        (None, AdminAddr::Tcp(a)) => (ListenAddr::Tcp(*a), 0o660),
        (None, AdminAddr::Unix(p)) => (ListenAddr::Unix(p.clone()), cfg.admin.socket_mode),
    };
    let listener = Listener::bind(&addr, mode)
        .await
        .map_err(|error| StartError::Bind {
            flag: "--admin-listen",
            error,
        })?;
    Ok(Some(listener))
}
