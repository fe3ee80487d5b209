//! `slotgate run` (the default) and `slotgate check`: load and validate the configuration once,
//! set up logging and metrics, and run until a signal; or print the effective settings and exit.

use std::process::ExitCode;

use anyhow::Context;
use tracing_subscriber::EnvFilter;

use super::cli::ConfigArgs;
use super::wrap::Wrap;
use crate::config::{Config, LogFormat, Settings, UpstreamAddr};
use crate::upstream::discover::{self, Found};

/// Serves (or with `check`, validates) the configuration `args` give, with `wrapped`'s
/// llama-server as the upstream when `slotgate wrap` started one.
pub fn run(args: ConfigArgs, wrapped: Option<Wrap>, check: bool) -> ExitCode {
    // Wrapped, the upstream is the child's private socket, on every (re)load, and what its command
    // line says (the KV pool, its API key, where its clients reach it) is known.
    let upstream = wrapped.as_ref().map(crate::cmd::wrap::Wrap::upstream);
    let launch = wrapped.as_ref().map(crate::cmd::wrap::Wrap::launch);
    let clients = wrapped
        .as_ref()
        .and_then(|w| w.clients().map(<[_]>::to_vec));
    // Without --upstream, where llama-server answers: looked for once, at the first load.
    let discovered = std::sync::Arc::new(std::sync::OnceLock::new());
    let found = discovered.clone();
    let load = move |args: ConfigArgs| {
        load(args).and_then(|(mut config, set)| {
            if let Some(up) = &upstream {
                config.upstream = up.clone();
            } else if !set.upstream && !check {
                let window = config.connect_timeout;
                let found = discovered.get_or_init(|| discover(window));
                config.upstream = found
                    .as_ref()
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .0
                    .clone();
            }
            if let (Some(clients), false) = (&clients, set.listen) {
                config.listen = clients.clone();
            }
            if let Some(launch) = &launch {
                if config.upstream_api_key.is_none() {
                    config.upstream_api_key = launch.api_key().map(crate::config::Secret);
                }
                config.launch = Some(launch.clone());
            }
            Ok(config)
        })
    };
    let source = crate::app::reload::ConfigSource {
        file: args.config.clone(),
        load: {
            let args = args.clone();
            let load = load.clone();
            std::sync::Arc::new(move || load(args.clone()))
        },
    };
    let config = match load(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("slotgate: {e:#}");
            return ExitCode::from(2);
        }
    };
    crate::dialect::set_messages_overload_status(config.messages_overload_status);
    if check {
        if let Err(e) = crate::policy::PolicySet::load(&config.policies, None) {
            eprintln!("slotgate: {e:#}");
            return ExitCode::from(2);
        }
        return match toml::to_string(&config.effective()) {
            Ok(text) => {
                println!("# slotgate: configuration is valid; effective settings:\n{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("slotgate: cannot print the settings: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let traces = match init_logging(config.log_format) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("slotgate: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Ok((upstream, found))) = found.get() {
        for s in &found.skipped {
            tracing::warn!(port = %s.addr, "no --upstream: passed over {}: {} (set --upstream to choose)", s.addr, s.why);
        }
        let (pid, uid) = (found.process.pid, found.process.uids.1);
        tracing::info!(%upstream, pid, uid, "no --upstream: llama-server answers here, run by slotgate's user; forwarding to it");
    }
    let served = serve(config, source, wrapped);
    // What the exporter still holds goes out before the process ends.
    if let Some(t) = traces {
        t.shutdown();
        crate::log::flush();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        // Once, through the log (which goes to stderr): the log's format is the operator's choice.
        Err(e) => {
            tracing::error!("{e:#}");
            // Lines are batched (see `log`): this one must be out before the process is.
            crate::log::flush();
            let refused = e
                .downcast_ref::<crate::app::StartError>()
                .is_some_and(crate::app::StartError::is_refusal);
            match refused {
                true => ExitCode::from(2),
                false => ExitCode::FAILURE,
            }
        }
    }
}

/// Which keys with a default some layer (flag, environment, file) set.
struct Set {
    upstream: bool,
    listen: bool,
}

fn load(args: ConfigArgs) -> anyhow::Result<(Config, Set)> {
    let file = match &args.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    let settings = args.settings.over(file);
    let set = Set {
        upstream: settings.upstream.is_some(),
        listen: settings.listen.is_some(),
    };
    Ok((Config::from_settings(settings)?, set))
}

/// The llama-server on this host's default ports, 9931 first, else 8080 (its default until it
/// moves), proven to be run by slotgate's user (logged once logging is up); else why not.
fn discover(window: std::time::Duration) -> Result<(UpstreamAddr, Found), String> {
    let found =
        discover::find(&discover::default_candidates(), window).map_err(|e| e.to_string())?;
    Ok((UpstreamAddr::Tcp(found.addr.to_string()), found))
}

fn serve(
    config: Config,
    source: crate::app::reload::ConfigSource,
    wrapped: Option<crate::cmd::wrap::Wrap>,
) -> anyhow::Result<()> {
    // One runtime per core: this thread's, and the workers' (see `app::workers`).
    let runtime = crate::app::workers::runtime().context("starting the async runtime")?;
    let workers = crate::app::workers::Workers::start(crate::app::workers::count() - 1)
        .context("starting the worker runtimes")?;
    let others = workers.handles();
    crate::log::batch();
    let served = runtime.block_on(async {
        let prometheus = crate::metrics::install().context("installing the metrics recorder")?;
        // The wrapped llama-server starts first (it loads its model while slotgate binds) and stops
        // last, once slotgate has drained.
        let (stop_child, stop) = tokio::sync::watch::channel(false);
        let limit = config.wrap_start_limit;
        let mut child = wrapped.map(|w| w.start(stop, limit)).transpose()?;
        // The supervisor's task ended (a JoinHandle may not be awaited twice).
        let ended = std::cell::Cell::new(false);
        let gave_up = async {
            match child.as_mut() {
                Some(task) => {
                    let result = task.await;
                    ended.set(true);
                    match result {
                        Ok(Err(e)) => e,
                        // The task itself failed: nothing to give up on, slotgate serves on.
                        _ => std::future::pending().await,
                    }
                }
                None => std::future::pending().await,
            }
        };
        // A child that will not start ends slotgate too, with its reason: a supervisor (systemd,
        // Kubernetes) then sees a failed service instead of one that never serves.
        let served = tokio::select! {
            served = crate::app::run(config, prometheus, source, others) => served,
            e = gave_up => return Err(anyhow::Error::new(e)),
        };
        let _ = stop_child.send(true);
        if let Some(child) = child.filter(|_| !ended.get()) {
            let _ = child.await;
        }
        served?;
        Ok(())
    });
    workers.stop();
    drop(runtime);
    crate::log::flush();
    served
}

/// The log (`SLOTGATE_LOG`, else `RUST_LOG`, else `info`) and, when the `OTEL_*` variables ask for
/// it, the trace exporter (`otel`). The global filter enables the traces' target only while there
/// is an exporter, so with traces off their spans are never even created; the log never shows them.
fn init_logging(format: LogFormat) -> Result<Option<crate::otel::Traces>, crate::otel::OtelError> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;

    let traces = match crate::otel::wanted() {
        true => Some(crate::otel::Traces::start()?),
        false => None,
    };
    let filter = EnvFilter::try_from_env("SLOTGATE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let level = if traces.is_some() { "trace" } else { "off" };
    let filter = match format!("{}={level}", crate::otel::TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    crate::log::set_format(format);
    let not_traces =
        tracing_subscriber::filter::filter_fn(|m| !m.target().starts_with(crate::otel::TARGET));
    let fmt = tracing_subscriber::fmt::layer().with_writer(crate::log::Sink);
    let fmt = match format {
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_filter(not_traces)
            .boxed(),
        LogFormat::Text => fmt.with_ansi(false).with_filter(not_traces).boxed(),
    };
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    match &traces {
        Some(t) => {
            let layer = t.layer();
            registry.with(layer).init();
            tracing::info!(
                endpoint = %std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT"))
                    .unwrap_or_default(),
                "traces are exported over OTLP/HTTP"
            );
        }
        None => registry.init(),
    }
    Ok(traces)
}
