//! slotgate: an admission-control sidecar for one llama-server process.
//!
//! The request path, with the room (module) of each stage:
//!
//! ```text
//!  client ──unix/tcp──▶ server (listener, conn: HTTP/1.1, peer uid/gid/pid, write_watch)
//!                          │
//!                          ▼
//!            pipeline::handle, one phase per file:
//!              routes   slot in a dialect | passthrough | health | admin | host
//!              intake   bounded body, JSON read in its dialect (json_edit keeps the bytes)
//!              count    exact prompt tokens (upstream::tokenize), when a policy asks first
//!              decide   the policy chain (policy: wasm on a fiber), allow | deny | fail
//!              admit    what it holds (admission::demand: slots, KV pool), its claim, a slot
//!                       at once or the fair priority queue (admission), or 429/504
//!              forward  upstream client and pools, retried only while nothing was sent; a
//!                       shed request goes back to admit (admit::again) and is sent again
//!              body     streams, reads usage in its dialect, then frees the slot
//!              reply    the answer with slotgate's headers, or its refusal (respond, dialect)
//!              access   one record per request; policy::complete tells the policies
//!                          │
//!                          ▼
//!                     llama-server
//!
//!  cmd      the subcommands (run, check, policy, wrap) and the command line
//!  app      run = bind → serve → drain; signals, reload, memory
//!  admin    the admin listener: who may ask (tokens, uids), the audit, /metrics /livez /readyz
//!           /status /live, llama-server's admin routes
//!  state    the `App` every request, the admin listener and the reloader share
//!  upstream the client, health, capacity (/props, the command line), cors, tokenize, scrape,
//!           quarantine
//!  router   llama-server's router mode: its model list, a pool per model with its loads and
//!           evictions, the models' turns on the CPUs
//!  budgets  the policies' budgets in plain Rust: buckets, windows, calendar quotas and the
//!           operators' limits, their levels; on a fleet, or kept on disk, through the rooms below
//!  fleet    budgets shared by every sidecar, on Redis/Valkey
//!  store    one sidecar's budgets on disk (state.dir), in an embedded database
//!  otel     OpenTelemetry traces: the exporter, the request's spans, traceparent in and out
//!  live     what is inside now, for `/live` and `slotgate top`: requests, tenant totals, rates
//!  config   flags, env and TOML → one validated `Config`; what llama-server was launched with
//!  leaves   respond, dialect, json_edit, owner_only (files only slotgate's user may touch),
//!           metrics, error
//! ```
//!
//! Dependencies run one way, down that list: `fuzzing → cmd → app → admin → pipeline → server →
//! state → upstream → router → policy → keys → budgets → fleet → store → admission → otel → live →
//! log → config → leaves`
//! (`fuzzing`: the fuzz targets, with the `fuzzing` feature). Inside `pipeline`, a phase uses only
//! the phases above it. `arrows.rs` fails on an arrow back up; docs/architecture.md has the map and
//! the invariants.

pub mod admin;
pub mod admission;
pub mod app;
#[cfg(test)]
mod arrows;
pub mod budgets;
pub mod cmd;
pub mod config;
pub mod dialect;
pub mod error;
pub mod fleet;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod json_edit;
pub mod keys;
pub mod live;
pub mod log;
pub mod metrics;
pub mod otel;
pub mod owner_only;
pub mod pipeline;
pub mod policy;
pub mod respond;
pub mod router;
pub mod server;
pub mod state;
pub mod store;
pub mod upstream;

pub use config::Config;
pub use error::{GateError, Outcome};
