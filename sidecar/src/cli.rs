//! Command line: subcommands and the flags that mirror every configuration key.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Settings;

/// Admission-control sidecar for llama-server.
///
/// slotgate sits in front of one llama-server process. It forwards at most `--slots` requests at a
/// time, keeps up to `--queue-depth` more waiting in priority order, and answers the rest at once
/// with 429 and an honest Retry-After. Every option is also an environment variable
/// (`SLOTGATE_<NAME>`) and a key of the same name in the `--config` TOML file;
/// a flag beats the environment, which beats the file.
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
    /// Work with policy modules offline: `slotgate policy check P.wasm`, `slotgate policy eval ...`.
    #[command(subcommand)]
    Policy(crate::policy_cli::PolicyCommand),
}

#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// TOML configuration file; its keys are the long flag names.
    #[arg(long, env = "SLOTGATE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}
