//! The subcommands: `run` (the default), `check`, `policy`, `wrap`, `top`, and the command line
//! itself.

pub mod cli;
pub mod policy;
pub mod run;
pub mod top;
pub mod wrap;
