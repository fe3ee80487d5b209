//! A test policy for the host's tests (`scripts/build-policies.sh` builds it as
//! `probe-policy-v2.wasm`, a component, and `probe-policy.wasm`, ABI v1): `{"do": "..."}` picks
//! what `evaluate` does, for every request or (with `"when_model"`) only for requests of that
//! model, the others echoing.
//!
//! - `echo` (the default): allows, with a response header `x-probe-earlier-v1` or `-v2` (its
//!   contract) holding what earlier policies of the chain decided, as JSON, and
//!   `x-probe-dialect-v1|v2` the request's dialect, `x-probe-calls-v1|v2` how many calls this
//!   instance has served (itself included), `x-probe-pages-v1|v2` its linear memory in pages and
//!   `x-probe-caller-v1|v2` whom the host named the caller (tenant, team, key id, key labels, and
//!   the identity it reads);
//! - `leak`: leaks 1 MiB, then echoes;
//! - `spin`: loops for ever; `bomb`: allocates until it cannot; `trap`: panics;
//! - `huge`: denies with a message of 1 MiB; `host_loop`: calls the host without end;
//! - `long_key`: takes from a bucket whose key is over the host's limit.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use slotgate_sdk::{host, Decision, EvaluateInput, Policy};

pub struct Probe;

#[derive(Deserialize, Default)]
pub struct Settings {
    #[serde(default, rename = "do")]
    action: String,
    #[serde(default)]
    when_model: Option<String>,
}

/// Calls this instance has served.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// The contract it was built for, in its header names.
const CONTRACT: &str = if cfg!(feature = "v2") { "v2" } else { "v1" };

impl Policy for Probe {
    type Settings = Settings;

    fn evaluate(input: &EvaluateInput, s: &Settings) -> Decision {
        let applies = s
            .when_model
            .as_ref()
            .is_none_or(|m| input.request.model.as_ref() == Some(m));
        let action = if applies { s.action.as_str() } else { "echo" };
        let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
        match action {
            "spin" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "bomb" => {
                let mut keep = Vec::new();
                loop {
                    // Reserved, not written: the memory grows without fuel spent filling it.
                    keep.push(std::hint::black_box(Vec::<u8>::with_capacity(1 << 20)));
                }
            }
            "trap" => panic!("the probe traps on purpose"),
            "huge" => Decision::forbidden("x".repeat(1 << 20)),
            "host_loop" => loop {
                std::hint::black_box(host::bucket_level("k", 1.0, 1.0));
            },
            "long_key" => {
                host::bucket_take(&"k".repeat(10_000), 1.0, 1.0, 1.0);
                Decision::allow()
            }
            other => {
                if other == "leak" {
                    std::hint::black_box(Vec::<u8>::with_capacity(1 << 20).leak());
                }
                let mut d = Decision::allow();
                let earlier = serde_json::to_string(&input.earlier).unwrap_or_default();
                d.mutations
                    .response_headers
                    .insert(format!("x-probe-earlier-{CONTRACT}"), earlier);
                d.mutations.response_headers.insert(
                    format!("x-probe-dialect-{CONTRACT}"),
                    input.request.dialect.clone().unwrap_or_default(),
                );
                d.mutations
                    .response_headers
                    .insert(format!("x-probe-calls-{CONTRACT}"), calls.to_string());
                d.mutations
                    .response_headers
                    .insert(format!("x-probe-pages-{CONTRACT}"), pages().to_string());
                let r = &input.request;
                let caller = serde_json::json!({
                    "tenant": r.tenant, "team": r.team, "key_id": r.key_id, "key_labels": r.key_labels,
                    "identity": r.identity().to_string(),
                });
                d.mutations
                    .response_headers
                    .insert(format!("x-probe-caller-{CONTRACT}"), caller.to_string());
                d
            }
        }
    }
}

/// Pages of linear memory (0 natively).
fn pages() -> usize {
    #[cfg(target_arch = "wasm32")]
    return core::arch::wasm32::memory_size(0);
    #[cfg(not(target_arch = "wasm32"))]
    0
}

#[cfg(not(feature = "v2"))]
slotgate_sdk::export_policy!(Probe);
#[cfg(feature = "v2")]
slotgate_sdk::export_component!(Probe);
