//! The `slotgate` binary: parse the command line, load and validate the configuration once, set up
//! logging and metrics, and run until a signal.

use std::process::ExitCode;

use anyhow::Context;
use slotgate::cli::{Command, ConfigArgs};
use slotgate::config::{Config, LogFormat, Settings};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    slotgate::memory::limit_arenas();
    let cli = slotgate::cli::parse();
    let mut wrapped = None;
    let (check, args) = match cli.command {
        Some(Command::Check(args)) => (true, args),
        Some(Command::Run(args)) => (false, args),
        Some(Command::Wrap(w)) => match slotgate::wrap::Wrap::prepare(w.command) {
            Ok(wrap) => {
                wrapped = Some(wrap);
                (false, w.run)
            }
            Err(e) => {
                eprintln!("slotgate: {e}");
                return ExitCode::from(2);
            }
        },
        Some(Command::HashKey { key }) => {
            println!("{}", slotgate::intake::hash_api_key(&key));
            return ExitCode::SUCCESS;
        }
        Some(Command::Policy(cmd)) => {
            return match slotgate::policy_cli::run(cmd) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("slotgate: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        None => (false, cli.run),
    };
    // Wrapped, the upstream is the child's private socket, on every (re)load, and what its command
    // line says (the KV pool, its API key) is known.
    let upstream = wrapped.as_ref().map(slotgate::wrap::Wrap::upstream);
    let launch = wrapped.as_ref().map(slotgate::wrap::Wrap::launch);
    let load = move |args: ConfigArgs| {
        load(args).map(|mut config| {
            if let Some(up) = &upstream {
                config.upstream = up.clone();
            }
            if let Some(launch) = &launch {
                if config.upstream_api_key.is_none() {
                    config.upstream_api_key = launch.api_key().map(slotgate::config::Secret);
                }
                config.launch = Some(launch.clone());
            }
            config
        })
    };
    let source = slotgate::reload::ConfigSource {
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
    if check {
        if let Err(e) = slotgate::policy::PolicySet::load(&config.policies, None) {
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
    init_logging(config.log_format);
    match serve(config, source, wrapped) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("slotgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load(args: ConfigArgs) -> anyhow::Result<Config> {
    let file = match &args.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    Ok(Config::from_settings(args.settings.over(file))?)
}

fn serve(
    config: Config,
    source: slotgate::reload::ConfigSource,
    wrapped: Option<slotgate::wrap::Wrap>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let prometheus = slotgate::metrics::install().context("installing the metrics recorder")?;
        // The wrapped llama-server starts first (it loads its model while slotgate binds) and stops
        // last, once slotgate has drained.
        let (stop_child, stop) = tokio::sync::watch::channel(false);
        let child = wrapped.map(|w| w.start(stop)).transpose()?;
        let served = slotgate::app::run(config, prometheus, source).await;
        let _ = stop_child.send(true);
        if let Some(child) = child {
            let _ = child.await;
        }
        served?;
        Ok(())
    })
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("SLOTGATE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(false).init(),
    }
}
