//! Embeddings: OpenAI's `/v1/embeddings` (`input`) and llama-server's native `/embedding(s)`
//! (`content` too). Every input is a task of its own; nothing is generated.

use serde_json::Value;

use super::{
    common, piece, prompt_list, text_chars, Ask, Count, Dialect, Output, NOTHING_GENERATED,
};

pub static EMBEDDINGS: &Embeddings = &Embeddings { openai: false };
pub static OAI_EMBEDDINGS: &Embeddings = &Embeddings { openai: true };

pub struct Embeddings {
    openai: bool,
}

impl Embeddings {
    fn inputs(body: &Value) -> Vec<&Value> {
        prompt_list(body.get("input").or_else(|| body.get("content")))
    }
}

impl Dialect for Embeddings {
    fn name(&self) -> &'static str {
        match self.openai {
            true => "embeddings",
            false => "embedding",
        }
    }

    fn ask(&self, body: &Value) -> Ask {
        let mut ask = common(body, &self.output());
        let inputs = Embeddings::inputs(body);
        ask.prompts = match inputs.is_empty() {
            true => vec![0],
            false => inputs.iter().map(|i| text_chars(Some(i))).collect(),
        };
        ask
    }

    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        let pieces: Option<Vec<_>> = Embeddings::inputs(body).into_iter().map(piece).collect();
        match pieces {
            Some(p) if !p.is_empty() => Count::Prompts(p),
            _ => Count::None,
        }
    }

    fn output(&self) -> Output {
        NOTHING_GENERATED
    }
}
