//! The subcommands: `serve` (the default), `check`, `policy`, `wrap`, and the command line itself.

pub mod cli;
pub mod policy;
pub mod serve;
pub mod wrap;
