//! Everything slotgate says to llama-server, one concern per file: the client (`Upstream`: its
//! keep-alive pools, the retry rule, slotgate's key on its own calls) and its `pool`; `health` (the
//! `/health` probe, ready or not, reached or never); `capacity` (`/props` and llama-server's
//! command line: slots, context, KV pool) and `process` (the process behind `--upstream`); `cors`
//! (llama-server's rule); `tokenize` (exact counts); `scrape` (the admin scrape's copy of its
//! `/metrics`); `quarantine` (slots llama-server may still hold, until it lets them go); and
//! `discover` (where llama-server is when `--upstream` is not set: 9931 or 8080). Router
//! mode is a room of its own (`crate::router`), which reaches llama-server through this client.

pub mod capacity;
mod client;
pub mod cors;
pub mod discover;
mod health;
mod pool;
pub mod process;
pub mod quarantine;
mod scrape;
pub mod tokenize;
pub mod verdicts;

pub use client::{
    connection_tokens, copy_end_to_end, on_worker, InflightGuard, SendError, Upstream,
};
