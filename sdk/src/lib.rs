//! Write slotgate admission policies in Rust.
//!
//! One [`Policy`] implementation builds two ways: as a v2 component of the world
//! `slotgate:policy@2.0.0` (`wit/policy.wit`, the contract; the `v2` feature and
//! [`export_component!`]), or as an ABI v1 module ([`export_policy!`], below), which every slotgate
//! keeps loading. New policies use v2: `slotgate policy new --lang rust NAME` writes a project.
//!
//! The crate holds the ABI v1 wire contract ([`types`]), compiled into both the sidecar (the host)
//! and every policy (the guest); the [`Policy`] trait a policy implements; [`export_policy!`],
//! which emits the WebAssembly exports on wasm32 only; typed access to the [`host`] functions; and,
//! natively, a [`testing`] helper that runs a policy on JSON fixtures. A policy written in another
//! language only has to follow `docs/policy-abi.md`.
//!
//! # Example
//!
//! A complete policy: at most `per_minute` admitted requests per caller (API key, else uid).
//!
//! ```
//! use serde::Deserialize;
//! use slotgate_sdk::{host, Decision, EvaluateInput, Policy};
//!
//! pub struct RateLimit;
//!
//! #[derive(Deserialize)]
//! pub struct Settings {
//!     per_minute: i64,
//! }
//!
//! impl Policy for RateLimit {
//!     type Settings = Settings;
//!
//!     fn validate(s: &Settings) -> Result<(), String> {
//!         match s.per_minute {
//!             1.. => Ok(()),
//!             _ => Err("per_minute must be positive".into()),
//!         }
//!     }
//!
//!     fn evaluate(input: &EvaluateInput, s: &Settings) -> Decision {
//!         let caller = input.request.identity().to_string();
//!         if host::window_add(&caller, 60_000, 0) >= s.per_minute {
//!             return Decision::too_many_requests("rate limit exceeded", Some(60));
//!         }
//!         host::window_add(&caller, 60_000, 1);
//!         Decision { tenant: Some(caller), ..Decision::allow() }
//!     }
//! }
//!
//! slotgate_sdk::export_policy!(RateLimit);
//!
//! // Natively, test it on partial JSON inputs against the emulated host state:
//! use slotgate_sdk::testing;
//! let alice = r#"{"request": {"peer": {"uid": 1000, "gid": 1000}},
//!                 "settings": {"per_minute": 2}}"#;
//! assert!(testing::run::<RateLimit>(alice).is_allowed());
//! assert!(testing::run::<RateLimit>(alice).is_allowed());
//! assert_eq!(testing::run::<RateLimit>(alice).status, Some(429));
//! testing::advance_ms(60_000);
//! assert_eq!(testing::run::<RateLimit>(alice).tenant.as_deref(), Some("uid:1000"));
//! assert!(!testing::validate::<RateLimit>(r#"{"per_minute": 0}"#).valid);
//! ```
//!
//! Its `Cargo.toml` makes a `cdylib` (the module) and an `rlib` (for native tests), and relaxes the
//! workspace's `unsafe_code = "forbid"` to `deny`, because the exports the macro generates are
//! `#[no_mangle]` (each allowed on its own item):
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//!
//! [dependencies]
//! slotgate-sdk.workspace = true
//! serde.workspace = true
//!
//! [lints.rust]
//! unsafe_code = "deny"
//! ```
//!
//! `cargo test -p rate-limit` runs its tests natively; `scripts/build-policies.sh` (or
//! `cargo build --profile policy --target wasm32-unknown-unknown -p rate-limit`) builds the module.
//!
//! # On wasm32
//!
//! The module imports only the host functions (module `slotgate`) and needs no WASI, and a panic
//! aborts with `unreachable`, which the host reports as a trap. A v1 module runs every call in a
//! fresh instance; a v2 component's instance may serve several calls of one caller, never another
//! caller's (docs/policies.md, "Isolation"). Either way, state that must last lives in the host
//! ([`host::bucket_take`], [`host::window_add`]), not in statics.
//!
//! The SDK installs a bump allocator as the module's global allocator: allocating costs a few
//! instructions (most of a small policy's cost per request went to a general-purpose allocator).
//! In a v1 module nothing is ever freed, since the instance is thrown away after one call: one call
//! can allocate at most the policy's memory limit (16 MiB by default) in total. In a v2 component it
//! starts over after each call, once everything the call allocated is freed, and the parsed
//! settings are kept for the instance's next calls. The evaluate input is parsed straight into
//! your typed settings; `EvaluateInput::settings` is left `null` in the guest.

#![cfg_attr(not(test), warn(missing_docs))]

pub mod bucket;
pub mod calendar;
mod dispatch;
mod export;
pub mod host;
mod identity;
mod policy;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod types;

#[cfg(target_arch = "wasm32")]
mod bump;
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: bump::Bump = bump::Bump::new();
#[cfg(all(target_arch = "wasm32", feature = "v2"))]
#[doc(hidden)]
#[path = "component.rs"]
pub mod __component;
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[path = "guest.rs"]
pub mod __guest;

pub use identity::{
    check_tenant, check_tenant_header, is_hashed_key, is_tenant_name, Identity, CALLER_HEADER,
    KEY_ID_HEADER, KEY_LABELS_HEADER, PRICE_HEADER, TEAM_NAMED_HEADER, TENANT_HEADERS,
    TENANT_NAMED_HEADER, USAGE_HEADER,
};
pub use policy::Policy;
/// The v2 contract (`slotgate policy wit` prints it too).
pub const WIT: &str = include_str!("../wit/policy.wit");

pub use types::{
    Completion, Decision, Earlier, EvaluateInput, Mutations, Peer, Price, QueueSnapshot, RateLimit,
    RateLimits, RequestSummary, SettingsValidation, Verdict, ABI_VERSION,
};
