//! ABI v1's JSON, both ways: the request a module is asked about (serialised once for a whole
//! chain, each policy's settings and what earlier policies decided spliced in), the completion it
//! is told, and the decision and settings verdict it answers, checked as every decision is.

use serde_json::Value;
use slotgate_sdk::{Completion, Decision, SettingsValidation, ABI_VERSION};

use crate::policy::error::{EvalError, LoadError};
use crate::policy::guest::{Ask, Encoded, Tell};
use crate::policy::sandbox::{check_decision, SettingsVerdict};

/// The whole `evaluate` input for the policy `ask` is for: the request, its settings unless it
/// holds them, what earlier policies decided, and the time.
pub fn input<'x>(ask: &'x mut Ask<'_>) -> Result<&'x [u8], EvalError> {
    use std::io::Write;
    let (request, now) = (ask.request(), ask.now_unix_ms());
    let head = ask.encoded.get_or_insert_with(|| {
        let mut buf = Vec::with_capacity(1024);
        buf.extend_from_slice(format!("{{\"abi\":{ABI_VERSION},\"request\":").as_bytes());
        serde_json::to_writer(&mut buf, request).map_err(|e| EvalError::Abi(e.to_string()))?;
        let head = buf.len();
        Ok(Encoded {
            bytes: buf,
            shared: head,
        })
    });
    // `bytes[..shared]` is `{"abi":1,"request":{...}`: what every policy of the chain gets
    // before its own settings.
    let Encoded {
        bytes: buf,
        shared: head,
    } = match head {
        Ok(h) => h,
        Err(e) => return Err(e.clone()),
    };
    buf.truncate(*head);
    if let Some(s) = ask.settings {
        buf.extend_from_slice(b",\"settings\":");
        buf.extend_from_slice(s.text.get().as_bytes());
    }
    if !ask.earlier.is_empty() {
        buf.extend_from_slice(b",\"earlier\":");
        // An `Earlier` always serialises.
        let _ = serde_json::to_writer(&mut *buf, &ask.earlier);
    }
    // Writing to a Vec cannot fail.
    let _ = write!(buf, ",\"now_unix_ms\":{}}}", now);
    Ok(buf)
}

/// What the policy `tell` is for gets: the completion with its own decision (the chain's as
/// `chain_decision`), and its settings unless it holds them.
pub fn completion(tell: &Tell<'_>) -> Result<Vec<u8>, EvalError> {
    let completion = tell.completion();
    let told = Completion {
        settings: tell.settings.map_or(Value::Null, |s| s.value.clone()),
        decision: tell.mine().clone(),
        chain_decision: completion.decision.clone(),
        ..completion.clone()
    };
    serde_json::to_vec(&told).map_err(|e| EvalError::Abi(e.to_string()))
}

/// A policy's `evaluate` output as the host accepts it: ABI v1 JSON, a deny's status 403 or 429, a
/// weight usable as a divisor. Apart from the module so the fuzz target reaches it without wasm.
pub fn parse_decision(out: &[u8]) -> Result<Decision, EvalError> {
    let decision: Decision = serde_json::from_slice(out).map_err(|e| {
        EvalError::InvalidOutput(format!("decision is not valid JSON for ABI v1: {e}"))
    })?;
    check_decision(decision)
}

/// A policy's `validate_settings` output: `Ok` when it accepts its settings, with whether it needs
/// the exact prompt count to decide.
pub fn settings_verdict(out: &[u8]) -> Result<SettingsVerdict, LoadError> {
    let v: SettingsValidation = serde_json::from_slice(out)
        .map_err(|e| EvalError::InvalidOutput(format!("validate_settings output: {e}")))?;
    if v.valid {
        Ok(SettingsVerdict {
            needs_prompt_tokens: v.needs_prompt_tokens,
            keeps_settings: v.keeps_settings,
            wants_completions: false,
        })
    } else {
        Err(LoadError::Settings(
            v.message.unwrap_or_else(|| "invalid settings".into()),
        ))
    }
}
