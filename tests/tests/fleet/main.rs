//! Fleet state on a real store: each test starts its own redis-server (and Valkey, `$VALKEY_SERVER`)
//! on a Unix socket.
//!
//! Needs redis-server on PATH and `$VALKEY_SERVER` (`scripts/setup-valkey.sh`), and the Rust example
//! policies. Not in the fast tier.

mod fleet_budget;
mod fleet_keys;
mod fleet_quota;
mod fleet_store;
