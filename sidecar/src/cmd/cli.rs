//! Command line: subcommands and the flags that mirror every configuration key.

use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::{PolicySpec, Settings};

/// Admission-control sidecar for llama-server.
///
/// slotgate sits in front of one llama-server process. It forwards at most `--slots` requests at a
/// time, keeps up to `--queue-depth` more waiting in priority order, and answers the rest at once
/// with 429 and an honest Retry-After. Every option is also an environment variable
/// (`SLOTGATE_<NAME>`) and a key of the same name in the `--config` TOML file;
/// a flag beats the environment, which beats the file.
///
/// Logging: `SLOTGATE_LOG` (e.g. `debug`, a line per phase of each request). Traces: set
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (OTLP/HTTP, e.g. `http://127.0.0.1:4318`) and the other standard
/// `OTEL_*` variables; off without it. Watch a running slotgate with `slotgate top`.
#[derive(Debug, Parser)]
#[command(
    name = "slotgate",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: ConfigArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar (the default when no subcommand is given).
    Run(ConfigArgs),
    /// Validate the configuration and print the effective settings as TOML.
    Check(ConfigArgs),
    /// Run llama-server as a child and serve in front of it, in one step:
    /// `slotgate wrap [OPTIONS] -- llama-server -m model.gguf -np 2 ...`.
    ///
    /// slotgate adds `--host <private socket>` to the command (so it must not have --host or
    /// --port), forwards to that socket (--upstream is ignored), passes the child's output through
    /// prefixed with its name, restarts it with backoff (1 s doubling to 30 s) when it exits while
    /// requests wait as during a model load, and on SIGTERM drains, then stops the child (SIGTERM,
    /// SIGKILL after 10 s). `--slots auto` follows its `-np`.
    Wrap(WrapArgs),
    /// Print the form in which policies see an API key (`sha256:<hex>`), for policy settings.
    HashKey {
        /// The API key, as clients send it after `Bearer `.
        key: String,
    },
    /// Work with policy modules offline: `slotgate policy check P.wasm`, `slotgate policy eval ...`.
    #[command(subcommand)]
    Policy(crate::cmd::policy::PolicyCommand),
    /// A live view of a running slotgate: its slots and the requests on them, the queue in service
    /// order, tenants, rates and the upstream, refreshed every second from the admin listener
    /// (`GET /live`, docs/live.md). Keys: tab focus, s sort, r reverse, / filter, p pause, q quit.
    /// `--once` prints the picture as text.
    Top(crate::cmd::top::TopArgs),
    /// The calendar quotas of a running slotgate, from its admin listener: `list` them with what
    /// is left, `set` a tenant's limit, `top-up` or `reset` its current window (docs/quotas.md).
    #[command(subcommand)]
    Quota(crate::cmd::quota::QuotaCommand),
    /// The usage ledger of a running slotgate: requests and tokens per UTC day, tenant and model
    /// (`GET /usage`), as a table, JSON or CSV.
    Usage(crate::cmd::quota::UsageArgs),
    /// The keys a running slotgate issues to its callers (with --client-auth keys): `create` one
    /// for a person (its secret printed once), `list`, `show`, `revoke`, `rotate` (docs/keys.md).
    #[command(subcommand)]
    Key(crate::cmd::key::KeyCommand),
}

#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// TOML configuration file; its keys are the long flag names.
    #[arg(long, env = "SLOTGATE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Debug, Clone, Args)]
pub struct WrapArgs {
    #[command(flatten)]
    pub run: ConfigArgs,
    /// The llama-server command line, after `--`.
    #[arg(last = true, required = true, value_name = "LLAMA_SERVER_COMMAND")]
    pub command: Vec<String>,
}

/// Parses the command line, pairing each `--policy-settings` with the `--policy` just before it.
pub fn parse() -> Cli {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let (sub, args) = match (&mut cli.command, matches.subcommand()) {
        (Some(Command::Run(a)), Some((_, m))) | (Some(Command::Check(a)), Some((_, m))) => (m, a),
        (Some(Command::Wrap(w)), Some((_, m))) => (m, &mut w.run),
        (None, _) => (&matches, &mut cli.run),
        _ => return cli,
    };
    let flags = pair_policy_settings(sub).unwrap_or_else(|msg| {
        Cli::command()
            .error(ErrorKind::ArgumentConflict, msg)
            .exit()
    });
    args.settings.policy_flags = flags;
    cli
}

fn pair_policy_settings(m: &ArgMatches) -> Result<Option<Vec<PolicySpec>>, String> {
    let indexed = |id: &str| -> Vec<(usize, PathBuf)> {
        match (m.indices_of(id), m.get_many::<PathBuf>(id)) {
            (Some(i), Some(v)) => i.zip(v.cloned()).collect(),
            _ => Vec::new(),
        }
    };
    let paths = indexed("policy_paths");
    let settings = indexed("policy_settings");
    if paths.is_empty() && settings.is_empty() {
        return Ok(None);
    }
    let mut specs: Vec<PolicySpec> = paths
        .iter()
        .map(|(_, p)| PolicySpec::from_path(p.clone(), None))
        .collect();
    for (at, file) in settings {
        let owner = paths.iter().rposition(|(i, _)| *i < at).ok_or_else(|| {
            format!(
                "--policy-settings {} comes before any --policy",
                file.display()
            )
        })?;
        if specs[owner].settings_file.is_some() {
            return Err(format!(
                "--policy {} has two --policy-settings",
                specs[owner].path.display()
            ));
        }
        specs[owner].settings_file = Some(file);
    }
    Ok(Some(specs))
}
