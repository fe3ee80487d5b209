//! Text completion: OpenAI's `/v1/completions` and llama-server's native `/completion`
//! (`/completions`). A list of prompts is one task per prompt.

use serde_json::Value;

use super::{
    generating, piece, prompt_list, text_chars, Ask, Count, Dialect, Output, OPENAI_OUTPUT_KEYS,
};

/// llama-server's native `/completion`: `n_predict`, `content` events, `"stop": true` at the end.
pub static COMPLETION: &Completion = &Completion { openai: false };
/// OpenAI's `/v1/completions`: `max_tokens`, `text` events, `data: [DONE]` at the end.
pub static OAI_COMPLETIONS: &Completion = &Completion { openai: true };

pub struct Completion {
    openai: bool,
}

impl Dialect for Completion {
    fn name(&self) -> &'static str {
        match self.openai {
            true => "completions",
            false => "completion",
        }
    }

    fn ask(&self, body: &Value) -> Ask {
        let prompts = prompt_list(body.get("prompt"));
        let prompts = match prompts.is_empty() {
            true => vec![0],
            false => prompts.iter().map(|p| text_chars(Some(p))).collect(),
        };
        generating(body, &self.output(), prompts)
    }

    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        let pieces: Option<Vec<_>> = prompt_list(body.get("prompt"))
            .into_iter()
            .map(piece)
            .collect();
        match pieces {
            Some(p) if !p.is_empty() => Count::Prompts(p),
            _ => Count::None,
        }
    }

    fn output(&self) -> Output {
        Output {
            keys: OPENAI_OUTPUT_KEYS,
            add: if self.openai {
                "max_tokens"
            } else {
                "n_predict"
            },
            default: None,
            none: false,
        }
    }

    fn is_token_event(&self, data: &[u8]) -> bool {
        match self.openai {
            true => super::contains(data, b"\"text\":\""),
            false => super::contains(data, b"\"content\":\""),
        }
    }

    fn is_end_event(&self, data: &[u8]) -> bool {
        match self.openai {
            true => data.trim_ascii() == b"[DONE]",
            // The native stream has no [DONE]: its last event says `"stop":true`.
            false => super::contains(data, b"\"stop\":true"),
        }
    }
}
