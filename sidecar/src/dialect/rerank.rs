//! Rerank (`/v1/rerank`, `/rerank`, Jina's `documents` or TEI's `texts`): the query beside each
//! document is a task of its own; nothing is generated.

use serde_json::Value;

use super::{common, text_chars, Ask, Dialect, Output, NOTHING_GENERATED};

pub static RERANK: &Rerank = &Rerank;

pub struct Rerank;

impl Dialect for Rerank {
    fn name(&self) -> &'static str {
        "rerank"
    }

    /// Not counted exactly: llama-server formats each pair with the model's rerank template or
    /// separator tokens; the estimate stands and the answer's usage settles it.
    fn ask(&self, body: &Value) -> Ask {
        let mut ask = common(body, &self.output());
        let query = text_chars(body.get("query"));
        let docs = body
            .get("documents")
            .or_else(|| body.get("texts"))
            .and_then(Value::as_array);
        ask.prompts = match docs {
            Some(d) if !d.is_empty() => d.iter().map(|doc| query + text_chars(Some(doc))).collect(),
            _ => vec![query],
        };
        ask
    }

    fn output(&self) -> Output {
        NOTHING_GENERATED
    }
}
