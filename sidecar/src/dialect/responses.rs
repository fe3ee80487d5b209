//! The OpenAI Responses API (`/v1/responses`): llama-server converts it to a chat request
//! (`server_chat_convert_responses_to_chatcmpl`: the body is copied, `input` and `instructions`
//! become messages, `max_output_tokens` becomes `max_tokens`) and streams `response.*` events.

use serde_json::Value;

use super::{
    contains, endpoint_if, generating, text_chars, usage_object, Ask, Count, Dialect, Output,
    Reported, Trust,
};

pub static RESPONSES: &Responses = &Responses;

pub struct Responses;

impl Dialect for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn ask(&self, body: &Value) -> Ask {
        let prompt = text_chars(body.get("instructions")) + text_chars(body.get("input"));
        generating(body, &self.output(), vec![prompt])
    }

    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        endpoint_if(body, "input", "/v1/responses/input_tokens", false)
    }

    /// `n_predict` first; then `max_completion_tokens` beside `max_output_tokens` (which replaces
    /// a `max_tokens` in the converted body).
    fn output(&self) -> Output {
        Output {
            keys: &[
                &["n_predict"],
                &["max_completion_tokens", "max_output_tokens"],
                &["max_tokens"],
            ],
            add: "max_output_tokens",
            default: None,
            none: false,
        }
    }

    /// `usage` of the whole answer, or of `response.completed` (under `response`). Its
    /// `input_tokens` is the whole prompt (`input_tokens_details.cached_tokens` of it from the cache).
    fn usage(&self, doc: &Value) -> Option<Reported> {
        let Some(u) = usage_object(doc, "response") else {
            return super::timings(doc);
        };
        let count = |key: &str| u.get(key).and_then(Value::as_u64);
        Some(Reported {
            trust: Trust::Reported,
            prompt: count("input_tokens"),
            completion: count("output_tokens"),
            cached: u
                .get("input_tokens_details")
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64)
                .or_else(|| super::timings_cached(doc, count("input_tokens"))),
        })
    }

    fn is_token_event(&self, data: &[u8]) -> bool {
        contains(data, b"\"type\":\"response.") && contains(data, b".delta\"")
    }

    fn is_end_event(&self, data: &[u8]) -> bool {
        contains(data, b"\"type\":\"response.completed\"")
            || contains(data, b"\"type\":\"response.failed\"")
            || contains(data, b"\"type\":\"response.incomplete\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_of_whole_answers_and_of_the_completed_event() {
        let whole = json!({"object": "response", "usage": {"input_tokens": 29, "output_tokens": 3, "total_tokens": 32, "input_tokens_details": {"cached_tokens": 28}}});
        let completed = json!({"type": "response.completed", "response": {"usage": {"input_tokens": 29, "output_tokens": 3}}, "timings": {"prompt_n": 1, "cache_n": 28, "predicted_n": 3}});
        for doc in [whole, completed] {
            assert_eq!(
                RESPONSES
                    .usage(&doc)
                    .map(|r| (r.trust, r.prompt, r.completion)),
                Some((Trust::Reported, Some(29), Some(3)))
            );
        }
        assert!(RESPONSES
            .is_token_event(br#"{"type":"response.output_text.delta","item_id":"m","delta":"x"}"#));
        assert!(!RESPONSES.is_token_event(br#"{"type":"response.output_text.done"}"#));
    }
}
