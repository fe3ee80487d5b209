//! Slot endpoints slotgate forwards without reading their requests closely: audio transcription
//! (a multipart form, never parsed), llama-server's decision models (`/v1/systemone`, whose
//! tasks llama-server spreads over all its slots) and Vertex AI's predict route (a batch of
//! requests to other routes, which llama-server runs all at once). They are admitted on the
//! estimate and settled from the usage their answers report.

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

/// Vertex AI's predict route (`AIP_MODE=PREDICTION`, `register_gcp_compat` in `server-http.cpp`):
/// up to 128 `instances`, each a request to another route, which llama-server runs at once, so it
/// holds every slot.
pub static PREDICT: &Opaque = &Opaque {
    name: "predict",
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

    /// OpenAI's usage, or `input_tokens` / `output_tokens` (a decision's answer), or the sum of
    /// a prediction's.
    fn usage(&self, doc: &Value) -> Option<Reported> {
        if let Some(each) = doc.get("predictions").and_then(Value::as_array) {
            return predictions_usage(each);
        }
        if let Some(u) = doc.get("usage").filter(|u| u.get("input_tokens").is_some()) {
            let count = |key: &str| u.get(key).and_then(Value::as_u64);
            return Some(Reported {
                trust: Trust::Reported,
                prompt: count("input_tokens"),
                completion: count("output_tokens"),
                cached: u
                    .get("input_tokens_details")
                    .and_then(|d| d.get("cached_tokens"))
                    .and_then(Value::as_u64),
            });
        }
        super::openai_usage(doc)
    }

    fn json_body(&self) -> bool {
        self.json
    }
}

/// The usage of every prediction that reports one, summed.
fn predictions_usage(each: &[Value]) -> Option<Reported> {
    let reports: Vec<Reported> = each.iter().filter_map(super::openai_usage).collect();
    let first = reports.first()?;
    let sum =
        |part: fn(&Reported) -> Option<u64>| reports.iter().filter_map(part).reduce(|a, b| a + b);
    Some(Reported {
        trust: first.trust,
        prompt: sum(|r| r.prompt),
        completion: sum(|r| r.completion),
        cached: sum(|r| r.cached),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_is_charged_every_instance() {
        let doc = serde_json::json!({"predictions": [
            {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 8}},
            {"error": {"message": "no handler"}},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}},
        ]});
        let r = PREDICT.usage(&doc).unwrap();
        assert_eq!((r.prompt, r.completion), (Some(12), Some(10)));
        assert!(PREDICT.ask(&serde_json::json!({"instances": []})).all_slots);
        assert_eq!(PREDICT.usage(&serde_json::json!({"predictions": []})), None);
    }
}
