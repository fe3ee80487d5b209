//! Everything slotgate says to llama-server, one concern per file: the client (`Upstream`: its
//! keep-alive pools, the retry rule, slotgate's key on its own calls) and its `pool`; `health` (the
//! `/health` probe, ready or not, reached or never); `capacity` (`/props` and llama-server's
//! command line: slots, context, KV pool) and `process` (the process behind `--upstream`); `cors`
//! (llama-server's rule); `tokenize` (exact counts); `scrape` (the admin scrape's copy of its
//! `/metrics`); `quarantine` (slots llama-server may still hold, until it lets them go); and, in
//! front of a router, `router` and `models`.

pub mod capacity;
mod client;
pub mod cors;
mod health;
pub mod models;
mod pool;
pub mod process;
pub mod quarantine;
pub mod router;
mod scrape;
pub mod tokenize;

pub use client::{copy_end_to_end, on_worker, InflightGuard, SendError, Upstream};
