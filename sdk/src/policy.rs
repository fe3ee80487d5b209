//! The `Policy` trait: what a policy author implements. The export glue and the test helper call it.

use serde::de::DeserializeOwned;

use crate::types::{Completion, Decision, EvaluateInput};

/// An admission policy. Implement it on a unit struct and export it with
/// [`export_policy!`](crate::export_policy).
///
/// The trait has no `self` because a policy keeps nothing in memory from one call to the next: a v1
/// module runs every call in a fresh WebAssembly instance, and a v2 component's instance is a cache
/// of one caller's at most (docs/policies.md, "Isolation"). State that must persist lives in the
/// host, behind [`host`](crate::host).
pub trait Policy {
    /// The policy's settings, deserialized from the JSON the operator configured. When no settings
    /// are configured the host sends `null`; the SDK then also tries `{}`, so a struct whose fields
    /// all have `#[serde(default)]` needs no configuration. `()` accepts only `null`;
    /// [`serde::de::IgnoredAny`] accepts anything.
    type Settings: DeserializeOwned;

    /// Checks settings that deserialized but may still be unusable (a zero capacity, a key listed
    /// twice). Runs at load, in `slotgate_validate_settings`; the message goes to the operator.
    fn validate(settings: &Self::Settings) -> Result<(), String> {
        let _ = settings;
        Ok(())
    }

    /// Whether, with these settings, [`evaluate`](Policy::evaluate) needs the exact prompt count
    /// (`request.prompt_tokens`) to decide. Asked once at load, in `slotgate_validate_settings`.
    ///
    /// By default `false`: a request that can be forwarded at once is then decided on the estimate
    /// (`prompt_tokens` absent) and forwarded without waiting for llama-server to count it; its real
    /// usage reaches [`on_complete`](Policy::on_complete). Say `true` only when a decision depends on
    /// the exact count (a hard prompt limit, say): every request through the chain then waits for
    /// the count (two llama-server round trips, about 1-2 ms) before it is decided.
    fn needs_prompt_tokens(settings: &Self::Settings) -> bool {
        let _ = settings;
        false
    }

    /// Decides one request.
    fn evaluate(input: &EvaluateInput, settings: &Self::Settings) -> Decision;

    /// Learns what really happened to a request once its response has ended. Exported only with
    /// `export_policy!(MyPolicy, on_complete)`: without that flag the host never calls it.
    fn on_complete(completion: &Completion, settings: &Self::Settings) {
        let _ = (completion, settings);
    }
}
