//! JSON in, JSON out: each ABI call as bytes, independent of where the bytes live. The wasm32 glue
//! and the native test helper both go through here, so tests exercise the exact wire path.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::policy::Policy;
use crate::types::{Completion, EvaluateInput, SettingsValidation, ABI_VERSION};

/// `slotgate_evaluate`: the decision's JSON, or why there is none (the glue logs it and returns 0,
/// which the host counts as a policy error).
pub fn evaluate<P: Policy>(input: &[u8]) -> Result<Vec<u8>, String> {
    let wire: Wire<'_> =
        serde_json::from_slice(input).map_err(|e| format!("evaluate input: {e}"))?;
    check_abi(wire.abi)?;
    // Straight from the settings' JSON text to the policy's type: no `Value` tree in between,
    // which would cost more than everything else the call does.
    let settings = match wire.settings {
        Some(raw) if raw.get() != "null" => serde_json::from_str::<P::Settings>(raw.get())
            .map_err(|e| format!("invalid settings: {e}"))?,
        _ => settings::<P::Settings>(&Value::Null)?,
    };
    let input = EvaluateInput {
        abi: wire.abi,
        request: wire.request,
        settings: Value::Null,
        now_unix_ms: wire.now_unix_ms,
    };
    let decision = P::evaluate(&input, &settings);
    serde_json::to_vec(&decision).map_err(|e| format!("serializing the decision: {e}"))
}

/// [`EvaluateInput`] as it arrives, the settings left as JSON text.
#[derive(serde::Deserialize)]
struct Wire<'a> {
    abi: u32,
    request: crate::types::RequestSummary,
    #[serde(borrow, default)]
    settings: Option<&'a serde_json::value::RawValue>,
    now_unix_ms: u64,
}

/// `slotgate_validate_settings`: always answers; anything wrong is an invalid result.
pub fn validate_settings<P: Policy>(input: &[u8]) -> Vec<u8> {
    let result = serde_json::from_slice::<Value>(input)
        .map_err(|e| format!("settings are not JSON: {e}"))
        .and_then(|raw| settings::<P::Settings>(&raw))
        .and_then(|s| P::validate(&s).map(|()| P::needs_prompt_tokens(&s)));
    let answer = match result {
        Ok(needs_prompt_tokens) => SettingsValidation {
            needs_prompt_tokens,
            ..SettingsValidation::ok()
        },
        Err(message) => SettingsValidation::invalid(message),
    };
    serde_json::to_vec(&answer).expect("a SettingsValidation always serializes")
}

/// `slotgate_on_complete`: nothing to return; a bad input is logged.
pub fn on_complete<P: Policy>(input: &[u8]) -> Result<(), String> {
    let completion: Completion =
        serde_json::from_slice(input).map_err(|e| format!("on_complete input: {e}"))?;
    check_abi(completion.abi)?;
    let settings = settings::<P::Settings>(&completion.settings)?;
    P::on_complete(&completion, &settings);
    Ok(())
}

/// Deserializes settings; `null` (nothing configured) also tries `{}` so all-default structs work.
pub fn settings<S: DeserializeOwned>(raw: &Value) -> Result<S, String> {
    match S::deserialize(raw) {
        Ok(s) => Ok(s),
        Err(e) if raw.is_null() => S::deserialize(&Value::Object(Default::default()))
            .map_err(|_| format!("settings are required: {e}")),
        Err(e) => Err(format!("invalid settings: {e}")),
    }
}

fn check_abi(abi: u32) -> Result<(), String> {
    if abi == ABI_VERSION {
        Ok(())
    } else {
        Err(format!(
            "input is ABI {abi}; this policy speaks {ABI_VERSION}"
        ))
    }
}
