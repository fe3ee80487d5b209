//! The Anthropic Messages API (`/v1/messages`), as Claude Code and the Anthropic SDKs speak it:
//! llama-server converts it to a chat request (`server_chat_convert_anthropic_to_oai`), answers
//! in Anthropic's shape, and streams `message_start` ... `message_stop` events.

use std::sync::atomic::{AtomicU16, Ordering};

use serde_json::Value;

use super::{
    common, contains, endpoint_if, json_string, text_chars, usage_object, Ask, Count, Dialect,
    Output, Reported, Trust,
};
use crate::error::GateError;

pub static MESSAGES: &Messages = &Messages;

pub struct Messages;

/// What llama-server's converter generates when a request has no `max_tokens` (required by
/// Anthropic's API, optional for llama-server).
const CONVERTER_DEFAULT_MAX_TOKENS: u64 = 4096;

impl Dialect for Messages {
    fn name(&self) -> &'static str {
        "messages"
    }

    fn rate_limit_headers(
        &self,
        limits: &slotgate_sdk::RateLimits,
        _now_ms: i64,
        out: &mut std::collections::BTreeMap<String, String>,
    ) {
        super::ratelimit::anthropic(limits, out);
    }

    /// The converter copies only `max_tokens`, `stream` and a few sampling fields: `n` and
    /// `n_predict` never reach llama-server's schema, so one completion, bounded by `max_tokens`.
    fn ask(&self, body: &Value) -> Ask {
        let mut ask = common(body, &self.output());
        ask.prompts = vec![text_chars(body.get("system")) + text_chars(body.get("messages"))];
        ask
    }

    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        endpoint_if(body, "messages", "/v1/messages/count_tokens", false)
    }

    fn output(&self) -> Output {
        Output {
            keys: &[&["max_tokens"]],
            add: "max_tokens",
            default: Some(CONVERTER_DEFAULT_MAX_TOKENS),
            none: false,
        }
    }

    /// `usage` of the whole answer, of `message_start` (under `message`: the prompt, output 0) and
    /// of `message_delta` (the output only). Anthropic's `input_tokens` leaves out what was read
    /// from the cache (`cache_read_input_tokens`); the prompt is both.
    fn usage(&self, doc: &Value) -> Option<Reported> {
        let Some(u) = usage_object(doc, "message") else {
            return super::timings(doc);
        };
        let count = |key: &str| u.get(key).and_then(Value::as_u64);
        let prompt = match (
            count("input_tokens"),
            count("cache_read_input_tokens"),
            count("cache_creation_input_tokens"),
        ) {
            (None, None, None) => None,
            (a, b, c) => Some(a.unwrap_or(0) + b.unwrap_or(0) + c.unwrap_or(0)),
        };
        let start = doc.get("type").and_then(Value::as_str) == Some("message_start");
        Some(Reported {
            trust: Trust::Reported,
            prompt,
            // `message_start` says 0 before anything was generated: not the final count.
            completion: count("output_tokens").filter(|_| !start),
            cached: count("cache_read_input_tokens"),
        })
    }

    fn is_token_event(&self, data: &[u8]) -> bool {
        contains(data, b"\"type\":\"content_block_delta\"")
    }

    fn is_end_event(&self, data: &[u8]) -> bool {
        contains(data, b"\"type\":\"message_stop\"")
    }

    /// Anthropic's own status for an overloaded server, 529 (`overloaded_error`), for every
    /// refusal made because the server is too busy (or the operator's choice,
    /// `--messages-overload-status`); the Anthropic SDKs retry it, honouring `retry-after-ms`. A
    /// tenant's own limit or a policy's budget stays a 429.
    fn error_status(&self, e: &GateError) -> u16 {
        match e.is_overload() {
            true => OVERLOAD_STATUS.load(Ordering::Relaxed),
            false => e.status(),
        }
    }

    /// `{"type":"error","error":{"type","message"}}`, with Anthropic's error types, so the
    /// Anthropic SDKs raise their typed errors (`RateLimitError` for a 429, ...) and retry where
    /// they should.
    /// `{"error":{"message","type"},"type":"error"}`, written out as `openai_error` is.
    fn error_body(&self, e: &GateError) -> Vec<u8> {
        let message = e.to_string();
        let mut out = Vec::with_capacity(message.len() + 64);
        out.extend_from_slice(b"{\"error\":{\"message\":");
        json_string(&mut out, &message);
        out.extend_from_slice(b",\"type\":");
        json_string(&mut out, anthropic_type(self.error_status(e)));
        out.extend_from_slice(b"},\"type\":\"error\"}");
        out
    }
}

/// The status of an overload refusal on this API: 529 unless the operator chose another.
static OVERLOAD_STATUS: AtomicU16 = AtomicU16::new(529);

/// Sets the status of an overload refusal (`--messages-overload-status`), once, at start.
pub fn set_overload_status(status: u16) {
    OVERLOAD_STATUS.store(status, Ordering::Relaxed);
}

/// Anthropic's error type for an HTTP status.
fn anthropic_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_of_whole_answers_and_of_streams() {
        let whole = json!({"type": "message", "usage": {"cache_read_input_tokens": 3, "input_tokens": 26, "output_tokens": 5}});
        assert_eq!(
            MESSAGES.usage(&whole),
            Some(Reported {
                trust: Trust::Reported,
                prompt: Some(29),
                completion: Some(5),
                cached: Some(3),
            })
        );
        let start = json!({"type": "message_start", "message": {"usage": {"cache_read_input_tokens": 28, "input_tokens": 1, "output_tokens": 0}}});
        assert_eq!(
            MESSAGES.usage(&start).map(|r| (r.prompt, r.completion)),
            Some((Some(29), None))
        );
        let delta = json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 3}});
        assert_eq!(
            MESSAGES.usage(&delta).map(|r| (r.prompt, r.completion)),
            Some((None, Some(3)))
        );
    }

    #[test]
    fn errors_take_anthropics_shape_and_types() {
        let e = GateError::QueueFull {
            depth: 2,
            retry_after: std::time::Duration::from_secs(3),
        };
        let body: Value = serde_json::from_slice(&MESSAGES.error_body(&e)).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(
            MESSAGES.error_status(&e),
            529,
            "a full queue is an overload"
        );
        assert_eq!(body["error"]["type"], "overloaded_error");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue is full"));
        // The very text a JSON value of it would print.
        let want = json!({
            "type": "error",
            "error": { "type": "overloaded_error", "message": e.to_string() }
        });
        assert_eq!(
            String::from_utf8(MESSAGES.error_body(&e)).unwrap(),
            want.to_string()
        );
        // A tenant's own share is its rate limit, not the server's overload.
        let tenant = GateError::TenantBusy {
            in_service: 1,
            waiting: 0,
            retry_after: std::time::Duration::from_secs(1),
        };
        assert_eq!(MESSAGES.error_status(&tenant), 429);
        let body: Value = serde_json::from_slice(&MESSAGES.error_body(&tenant)).unwrap();
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(anthropic_type(503), "overloaded_error");
        assert_eq!(anthropic_type(400), "invalid_request_error");
        assert_eq!(anthropic_type(502), "api_error");
    }
}
