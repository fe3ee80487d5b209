//! slotgate: an admission-control sidecar for one llama-server process.
//!
//! ```text
//!  client ──unix/tcp──▶ server::listener ─▶ server::conn (HTTP/1.1, peer uid/gid/pid)
//!                                              │
//!                                              ▼
//!                                    pipeline::handle
//!          routes (slot in a dialect | passthrough | health | admin | host)
//!              ─▶ intake (bounded body, JSON read in its dialect; json_edit keeps its bytes)
//!              ─▶ count (cost: llama-server's count endpoints) ─▶ policy chain (wasm on a fiber)
//!              ─▶ demand (slots and KV pool tokens it holds) ─▶ admission (slots + pool | the
//!                 priority queue, tenants served fairly by tokens | 429/504)
//!              ─▶ upstream (keep-alive pool, retry only unsent) ─▶ body::GuardedBody
//!                  (streams, usage read in its dialect, then frees slot + records; access:
//!                  on_complete to the policies)
//!                                              ▼
//!                                        llama-server
//!
//!  admin listener: /metrics /livez /readyz /status, llama-server's admin routes   app: wiring, drain
//!  capacity: slots, slot context and KV pool from /props and llama-server's command line (launch,
//!            upstream_process); cors: llama-server's rule, learnt from a preflight
//!  state: the `App` every request, the admin endpoints and the reloader share
//!  reload: SIGHUP / file watch ─▶ policy::set builds a new chain off the request path, swaps it
//! ```
//!
//! Leaves (`error`, `metrics`, `json_edit`, `launch`, `config` (which reads `launch`), and the
//! `slotgate-sdk` wire types) import nothing above them; `dialect` imports only `error`, and
//! `respond` and `usage` only `dialect` and `error`.

pub mod access;
pub mod admin;
pub mod admission;
pub mod app;
pub mod body;
pub mod capacity;
pub mod cli;
pub mod config;
pub mod cors;
pub mod cost;
pub mod dialect;
pub mod error;
pub mod fleet;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod intake;
pub mod json_edit;
pub mod launch;
pub mod memory;
pub mod metrics;
pub mod pipeline;
pub mod policy;
pub mod policy_cli;
pub mod reload;
pub mod respond;
pub mod routes;
pub mod server;
pub mod shutdown;
pub mod stall;
pub mod state;
pub mod stream_usage;
pub mod upstream;
pub mod upstream_process;
pub mod usage;
pub mod wrap;

pub use config::Config;
pub use error::{GateError, Outcome};
