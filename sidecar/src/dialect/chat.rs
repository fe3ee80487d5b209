//! OpenAI chat completions (`/v1/chat/completions`): messages through the model's chat template.

use serde_json::Value;

use super::{endpoint_if, generating, text_chars, Ask, Count, Dialect, Output, OPENAI_OUTPUT_KEYS};

pub static CHAT: &Chat = &Chat;

pub struct Chat;

impl Dialect for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn ask(&self, body: &Value) -> Ask {
        generating(body, &self.output(), vec![text_chars(body.get("messages"))])
    }

    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        endpoint_if(body, "messages", "/v1/chat/completions/input_tokens", true)
    }

    fn output(&self) -> Output {
        Output {
            keys: OPENAI_OUTPUT_KEYS,
            add: "max_tokens",
            default: None,
            none: false,
        }
    }

    fn asks_for_stream_usage(&self) -> bool {
        true
    }
}
