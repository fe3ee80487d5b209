//! The slotgate policy wire contract, compiled into both the sidecar (host) and policies (guest).
//!
//! A policy sees one [`RequestSummary`] per request and answers with one [`Decision`]. Both travel
//! as JSON, so a policy written in any language only has to follow the field names below.

#![cfg_attr(not(test), warn(missing_docs))]

pub mod types;

pub use types::{
    Completion, Decision, EvaluateInput, Mutations, Peer, QueueSnapshot, RequestSummary,
    SettingsValidation, Verdict, ABI_VERSION,
};
