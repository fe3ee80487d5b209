//! llama-server's `/infill` (fill-in-the-middle, for editors: llama.vim, llama.vscode): a prefix, a
//! suffix, optional extra context and prompt, joined with the model's FIM markers.

use serde_json::Value;

use super::{generating, text_chars, Ask, Count, Dialect, Output, Piece, OPENAI_OUTPUT_KEYS};

pub static INFILL: &Infill = &Infill;

pub struct Infill;

/// The FIM prefix, suffix and middle markers llama-server puts around the parts.
const FIM_MARKERS: u64 = 3;

impl Dialect for Infill {
    fn name(&self) -> &'static str {
        "infill"
    }

    fn ask(&self, body: &Value) -> Ask {
        let extra: u64 = body
            .get("input_extra")
            .and_then(Value::as_array)
            .map_or(0, |chunks| {
                chunks
                    .iter()
                    .map(|c| text_chars(c.get("text")) + text_chars(c.get("filename")))
                    .sum()
            });
        let prompt = text_chars(body.get("input_prefix"))
            + text_chars(body.get("input_suffix"))
            + text_chars(body.get("prompt"))
            + extra;
        generating(body, &self.output(), vec![prompt])
    }

    /// The parts tokenized one by one plus the three markers and the model's BOS (llama-server's
    /// `format_prompt_infill`); it may trim a prefix or suffix too long for its batch, so this is
    /// an upper bound there. Extra context chunks are not counted exactly.
    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        let has_extra = body
            .get("input_extra")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        let text = |k: &str| body.get(k).and_then(Value::as_str);
        match (text("input_prefix"), text("input_suffix"), has_extra) {
            (Some(prefix), Some(suffix), false) => {
                let mut parts = vec![prefix, suffix];
                parts.extend(text("prompt").filter(|p| !p.is_empty()));
                Count::Prompts(vec![Piece::Parts(parts, FIM_MARKERS)])
            }
            _ => Count::None,
        }
    }

    fn output(&self) -> Output {
        Output {
            keys: OPENAI_OUTPUT_KEYS,
            add: "n_predict",
            default: None,
            none: false,
        }
    }

    fn is_end_event(&self, data: &[u8]) -> bool {
        super::contains(data, b"\"stop\":true")
    }
}
