//! The subcommands: `run` (the default), `check`, `policy`, `wrap`, `top`, `quota`, `usage`, and the
//! command line
//! itself.

pub mod admin_client;
pub mod cli;
pub mod key;
pub mod policy;
pub mod policy_cost;
pub mod policy_new;
pub mod policy_test;
pub mod quota;
pub mod run;
pub mod top;
pub mod wrap;
