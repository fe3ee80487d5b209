//! JSON in, JSON out: each ABI call as bytes, independent of where the bytes live. The wasm32 glue
//! and the native test helper both go through here, so tests exercise the exact wire path.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::policy::Policy;
use crate::types::{Completion, EvaluateInput, SettingsValidation, ABI_VERSION};

/// `slotgate_evaluate`: the decision's JSON, or why there is none (the glue logs it and returns 0,
/// which the host counts as a policy error). `kept`: the settings this instance started with (see
/// [`validate_settings`]); the input's are parsed only without them.
pub fn evaluate<P: Policy>(input: &[u8], kept: Option<&P::Settings>) -> Result<Vec<u8>, String> {
    let wire: Wire<'_> =
        serde_json::from_slice(input).map_err(|e| format!("evaluate input: {e}"))?;
    check_abi(wire.abi)?;
    let parsed;
    let settings = match kept {
        Some(s) => s,
        None => {
            // Straight from the settings' JSON text to the policy's type: no `Value` tree in
            // between, which would cost more than everything else the call does.
            parsed = match wire.settings {
                Some(raw) if raw.get() != "null" => serde_json::from_str::<P::Settings>(raw.get())
                    .map_err(|e| format!("invalid settings: {e}"))?,
                _ => settings::<P::Settings>(&Value::Null)?,
            };
            &parsed
        }
    };
    let input = EvaluateInput {
        abi: wire.abi,
        request: wire.request,
        settings: Value::Null,
        now_unix_ms: wire.now_unix_ms,
        earlier: wire.earlier,
    };
    let decision = P::evaluate(&input, settings);
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
    #[serde(default)]
    earlier: crate::types::Earlier,
}

/// `slotgate_validate_settings`: always answers; anything wrong is an invalid result. With `keep`,
/// valid settings are also returned, for the glue to keep in the instance's memory, and the answer
/// says so (`keeps_settings`): the host then snapshots the instance and starts every later one from
/// it, with the settings already parsed.
pub fn validate_settings<P: Policy>(input: &[u8], keep: bool) -> (Vec<u8>, Option<P::Settings>) {
    let result = serde_json::from_slice::<Value>(input)
        .map_err(|e| format!("settings are not JSON: {e}"))
        .and_then(|raw| settings::<P::Settings>(&raw))
        .and_then(|s| P::validate(&s).map(|()| s));
    match result {
        Ok(s) => {
            let answer = SettingsValidation {
                needs_prompt_tokens: P::needs_prompt_tokens(&s),
                keeps_settings: keep,
                ..SettingsValidation::ok()
            };
            (json(&answer), keep.then_some(s))
        }
        Err(message) => (json(&SettingsValidation::invalid(message)), None),
    }
}

fn json(answer: &SettingsValidation) -> Vec<u8> {
    serde_json::to_vec(answer).expect("a SettingsValidation always serializes")
}

/// `slotgate_on_complete`: nothing to return; a bad input is logged. `kept` as for [`evaluate`].
pub fn on_complete<P: Policy>(input: &[u8], kept: Option<&P::Settings>) -> Result<(), String> {
    let completion: Completion =
        serde_json::from_slice(input).map_err(|e| format!("on_complete input: {e}"))?;
    check_abi(completion.abi)?;
    match kept {
        Some(s) => P::on_complete(&completion, s),
        None => P::on_complete(&completion, &settings::<P::Settings>(&completion.settings)?),
    }
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
