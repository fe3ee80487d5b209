//! Slot endpoints slotgate forwards without reading their requests closely: audio transcription
//! (a multipart form, never parsed) and llama-server's decision models (`/v1/systemone`, whose
//! tasks llama-server spreads over all its slots). They are admitted on the estimate and settled
//! from the usage their answers report.

use serde_json::Value;

use super::{common, Ask, Dialect, Output, Reported, Trust};

/// `/v1/audio/transcriptions`: a `multipart/form-data` body.
pub static TRANSCRIPTION: &Opaque = &Opaque {
    name: "transcription",
    json: false,
    all_slots: false,
};
/// `/v1/systemone`: a decision model scores options; its tasks use every slot.
pub static DECISION: &Opaque = &Opaque {
    name: "decision",
    json: true,
    all_slots: true,
};

pub struct Opaque {
    name: &'static str,
    json: bool,
    all_slots: bool,
}

impl Dialect for Opaque {
    fn name(&self) -> &'static str {
        self.name
    }

    fn ask(&self, body: &Value) -> Ask {
        let mut ask = common(body, &self.output());
        ask.prompts = vec![all_text(body)];
        ask.all_slots = self.all_slots;
        ask
    }

    fn output(&self) -> Output {
        match self.json {
            true => super::NOTHING_GENERATED,
            false => Output {
                keys: super::OPENAI_OUTPUT_KEYS,
                add: "max_tokens",
                default: None,
                none: false,
            },
        }
    }

    /// OpenAI's usage, or `input_tokens` / `output_tokens` (a decision's answer).
    fn usage(&self, doc: &Value) -> Option<Reported> {
        if let Some(u) = doc.get("usage").filter(|u| u.get("input_tokens").is_some()) {
            let count = |key: &str| u.get(key).and_then(Value::as_u64);
            return Some(Reported {
                trust: Trust::Reported,
                prompt: count("input_tokens"),
                completion: count("output_tokens"),
            });
        }
        super::openai_usage(doc)
    }

    fn json_body(&self) -> bool {
        self.json
    }
}

/// Characters of every string in a JSON value.
fn all_text(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(items) => items.iter().map(all_text).sum(),
        Value::Object(o) => o.values().map(all_text).sum(),
        _ => 0,
    }
}
