//! OpenAI chat completions (`/v1/chat/completions`): messages through the model's chat template.

use serde_json::Value;

use super::{common, completions, text_chars, Ask, Count, Dialect, Output, OPENAI_OUTPUT_KEYS};

pub static CHAT: &Chat = &Chat;

pub struct Chat;

impl Dialect for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn ask(&self, body: &Value) -> Ask {
        let mut ask = common(body, &self.output());
        ask.prompts = vec![text_chars(body.get("messages"))];
        if let Some(o) = body.as_object() {
            ask.completions = completions(o);
        }
        ask
    }

    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        match body.get("messages") {
            Some(_) => Count::Endpoint {
                path: "/v1/chat/completions/input_tokens",
                chat_fallback: true,
            },
            None => Count::None,
        }
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
