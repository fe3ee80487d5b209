//! API dialects: one file per API llama-server serves on its slots. A dialect is the one place that
//! knows, for its requests, where the output bound and the stream flag live, how many tasks
//! llama-server makes of one request, how its prompt is counted exactly, how its answers (whole or
//! streamed) report the tokens used, and the error shape its clients read. (`model` and `priority`
//! are top-level fields in every API; intake reads them for every route alike.)
//!
//! Everything here follows llama-server's own reading of the body (`tools/server/server-schema.cpp`,
//! `server-chat.cpp`, `server-context.cpp` in the sdist); a new API is one new file and one line in
//! `routes`.

mod chat;
mod completion;
mod embeddings;
mod infill;
mod messages;
mod opaque;
pub mod ratelimit;
mod rerank;
mod responses;
pub mod usage;

use serde_json::{Map, Value};

use crate::error::GateError;

pub use chat::CHAT;
pub use completion::{COMPLETION, OAI_COMPLETIONS};
pub use embeddings::{EMBEDDINGS, OAI_EMBEDDINGS};
pub use infill::INFILL;
pub use messages::{set_overload_status as set_messages_overload_status, MESSAGES};
pub use opaque::{DECISION, PREDICT, TRANSCRIPTION};
pub use rerank::RERANK;
pub use responses::RESPONSES;

/// What one API's requests and answers look like.
pub trait Dialect: Send + Sync + 'static {
    /// Its name in logs, `/status` and docs: `chat`, `messages`, `responses`...
    fn name(&self) -> &'static str;

    /// What the body asks of llama-server. `body` is the parsed JSON object, or `Null` for a
    /// dialect whose body is not JSON.
    fn ask(&self, body: &Value) -> Ask;

    /// How the prompt is counted exactly with llama-server's own endpoints.
    fn count<'a>(&self, body: &'a Value) -> Count<'a> {
        let _ = body;
        Count::None
    }

    /// The body keys that bound the output, as llama-server reads them.
    fn output(&self) -> Output;

    /// The usage one JSON document of an answer reports: the whole body, or one streamed event.
    fn usage(&self, doc: &Value) -> Option<Reported> {
        openai_usage(doc)
    }

    /// The caller's allowance as response headers, in this API's names (OpenAI's by default).
    fn rate_limit_headers(
        &self,
        limits: &slotgate_sdk::RateLimits,
        now_ms: i64,
        out: &mut std::collections::BTreeMap<String, String>,
    ) {
        ratelimit::openai(limits, now_ms, out);
    }

    /// Whether a streamed event's `data:` line carries generated text (about one token each).
    fn is_token_event(&self, data: &[u8]) -> bool {
        contains(data, b"\"content\":\"")
    }

    /// Whether a streamed event completes the answer: after it the client has had it all, whatever
    /// happens to the connection.
    fn is_end_event(&self, data: &[u8]) -> bool {
        data.trim_ascii() == b"[DONE]"
    }

    /// The body of an error slotgate answers on this API, as JSON text.
    fn error_body(&self, e: &GateError) -> Vec<u8> {
        openai_error(e)
    }

    /// The status of an error slotgate answers on this API.
    fn error_status(&self, e: &GateError) -> u16 {
        e.status()
    }

    /// Whether the body is JSON (otherwise it is forwarded as it came, never parsed).
    fn json_body(&self) -> bool {
        true
    }

    /// Whether a stream reports usage only when asked (`stream_options.include_usage`).
    fn asks_for_stream_usage(&self) -> bool {
        false
    }
}

/// A dialect, as routes hold it.
pub type DialectRef = &'static dyn Dialect;

/// What a request asks of llama-server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ask {
    pub stream: bool,
    /// The most tokens each completion may generate; `None`: the server's default.
    pub max_tokens: Option<u64>,
    /// Characters of prompt text, one entry per prompt llama-server makes a task of.
    pub prompts: Vec<u64>,
    /// Completions of each prompt (`n_cmpl`, alias `n`), each on a slot of its own at once.
    pub completions: u64,
    /// llama-server spreads the request over every slot it has.
    pub all_slots: bool,
}

impl Ask {
    /// Tasks llama-server runs for the request (each on a slot).
    pub fn tasks(&self) -> u64 {
        (self.prompts.len().max(1) as u64).saturating_mul(self.completions.max(1))
    }

    pub fn prompt_chars(&self) -> u64 {
        self.prompts.iter().sum()
    }
}

/// How a prompt is counted exactly.
#[derive(Debug, Clone, PartialEq)]
pub enum Count<'a> {
    /// llama-server's count endpoint for the API, answering `{"input_tokens": N}` for the whole
    /// templated prompt; `chat_fallback`: on an older build without it, the chat template
    /// (`/apply-template`) and the tokenizer.
    Endpoint {
        path: &'static str,
        chat_fallback: bool,
    },
    /// One entry per prompt, as llama-server tokenizes it for generation (special tokens added).
    Prompts(Vec<Piece<'a>>),
    /// No exact count: the estimate stands.
    None,
}

/// One prompt to count.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece<'a> {
    Text(&'a str),
    /// Already token ids: this many.
    Tokens(u64),
    /// Pieces tokenized without special tokens and summed, plus this many markers (the
    /// fill-in-the-middle ones of `/infill`) and the special tokens the model adds to a prompt.
    Parts(Vec<&'a str>, u64),
}

/// Where the output bound lives in a body.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Keys llama-server reads, each group in its order of precedence (see [`bound`]).
    pub keys: &'static [&'static [&'static str]],
    /// The key a cap sets when the body has none.
    pub add: &'static str,
    /// The bound when the body sets none, if the API has one of its own (Anthropic's converter
    /// puts 4096); `None`: llama-server's default (`-n`, usually unbounded).
    pub default: Option<u64>,
    /// The API generates no text (embeddings, rerank): the bound is 0.
    pub none: bool,
}

/// The output of an API that generates no text (embeddings, rerank, decisions): 0.
pub const NOTHING_GENERATED: Output = Output {
    keys: &[],
    add: "n_predict",
    default: Some(0),
    none: true,
};

/// Whether an answer of `content_type` is a stream of server-sent events.
pub fn is_event_stream(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|t| t.starts_with("text/event-stream"))
}

/// A usage object of `doc`: its own `usage`, else the `usage` of its `under` member (an Anthropic
/// `message_start`'s `message`, a Responses `response.completed`'s `response`).
pub fn usage_object<'a>(doc: &'a Value, under: &str) -> Option<&'a Value> {
    doc.get("usage")
        .or_else(|| doc.get(under).and_then(|m| m.get("usage")))
        .filter(|u| u.is_object())
}

/// The keys of OpenAI-style generation endpoints as llama-server's schema reads them: `n_predict`
/// first, then `max_completion_tokens` and `max_tokens` (its aliases).
pub const OPENAI_OUTPUT_KEYS: &[&[&str]] =
    &[&["n_predict"], &["max_completion_tokens", "max_tokens"]];

/// A usage report, whole or in part (an Anthropic stream sends the prompt first, the output last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub trust: Trust,
    /// The whole prompt, read from the cache or not.
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
    /// Of the prompt, the tokens llama-server reused from its prompt cache.
    pub cached: Option<u64>,
}

/// How much a report is trusted: a reported usage (or native count) beats `timings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    Timings,
    Reported,
}

/// A token-bound value as llama-server reads it (nlohmann's number conversion): `Some(Some(n))` a
/// bound of `n` (a fraction truncated, `true`/`false` as 1/0), `Some(None)` no bound (a negative
/// value: -1 means the server's default, usually unbounded), `None` not a number (llama-server
/// rejects it, or older builds ignore it).
pub fn token_bound(v: &Value) -> Option<Option<u64>> {
    match v {
        Value::Number(n) => Some(match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Some(u),
            (None, Some(_negative), _) => None,
            (None, None, Some(f)) => (f.trunc() >= 0.0).then(|| f.trunc() as u64),
            (None, None, None) => None,
        }),
        Value::Bool(b) => Some(Some(u64::from(*b))),
        _ => None,
    }
}

/// The most tokens llama-server generates per completion for `body`, `None` when it sets no bound.
/// Groups are read in order and the first group with a number wins. Within a group, builds
/// disagree (current llama-server takes the first of `max_completion_tokens`, `max_tokens`; older
/// ones read only `max_tokens`), so the larger counts (a negative one, no bound, as the largest):
/// conservative for admission. So `{"max_tokens": 1, "n_predict": 500}` may generate 500.
pub fn bound(body: &Map<String, Value>, output: &Output) -> Option<u64> {
    if output.none {
        return Some(0);
    }
    let read = |key: &str| body.get(key).filter(|v| !v.is_null()).and_then(token_bound);
    for group in output.keys {
        let found: Vec<Option<u64>> = group.iter().filter_map(|k| read(k)).collect();
        if !found.is_empty() {
            return found
                .into_iter()
                .try_fold(0, |acc, b| b.map(|b| acc.max(b)));
        }
    }
    output.default
}

/// The body's `n_cmpl` (alias `n`): completions per prompt, at least 1.
pub fn completions(body: &Map<String, Value>) -> u64 {
    ["n_cmpl", "n"]
        .iter()
        .find_map(|k| body.get(*k).filter(|v| !v.is_null()))
        .and_then(token_bound)
        .flatten()
        .unwrap_or(1)
        .max(1)
}

/// A generating API's ask: [`common`], with `prompts`, and as many completions as `n_cmpl` or `n`
/// ask for.
pub fn generating(body: &Value, output: &Output, prompts: Vec<u64>) -> Ask {
    let mut ask = common(body, output);
    ask.prompts = prompts;
    if let Some(o) = body.as_object() {
        ask.completions = completions(o);
    }
    ask
}

/// A count by llama-server's endpoint `path` (see [`Count::Endpoint`]) when the body has `key`,
/// else none.
pub fn endpoint_if<'a>(
    body: &Value,
    key: &str,
    path: &'static str,
    chat_fallback: bool,
) -> Count<'a> {
    match body.get(key) {
        Some(_) => Count::Endpoint {
            path,
            chat_fallback,
        },
        None => Count::None,
    }
}

/// The fields every JSON dialect reads alike.
pub fn common(body: &Value, output: &Output) -> Ask {
    let obj = body.as_object();
    Ask {
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        max_tokens: match obj {
            Some(o) => bound(o, output),
            None if output.none => Some(0),
            None => output.default,
        },
        prompts: vec![0],
        completions: 1,
        all_slots: false,
    }
}

/// Characters of text in a prompt-like value: a string, an array of strings or of messages
/// (`content` as a string or as parts with `text`).
pub fn text_chars(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => s.chars().count() as u64,
        Some(Value::Array(items)) => items.iter().map(|i| text_chars(Some(i))).sum(),
        Some(Value::Object(o)) => text_chars(o.get("content")) + text_chars(o.get("text")),
        _ => 0,
    }
}

/// A value that llama-server tokenizes as one prompt or as several (`tokenize_input_prompts`): a
/// string or a list of token ids is one; any other list is one prompt per element.
pub fn prompt_list(v: Option<&Value>) -> Vec<&Value> {
    match v {
        Some(Value::Array(items)) if !items.is_empty() && !items.iter().all(Value::is_number) => {
            items.iter().collect()
        }
        Some(v) => vec![v],
        None => Vec::new(),
    }
}

/// One prompt as a piece to count: text, or token ids (a mixed list is not counted).
pub fn piece(v: &Value) -> Option<Piece<'_>> {
    match v {
        Value::String(s) => Some(Piece::Text(s)),
        Value::Array(items) if items.iter().all(Value::is_u64) => {
            Some(Piece::Tokens(items.len() as u64))
        }
        _ => None,
    }
}

/// OpenAI's `usage`, llama-server's native `tokens_evaluated` / `tokens_predicted`, then its
/// `timings` (`prompt_n` processed now plus `cache_n` reused: the whole prompt, as its
/// `usage.prompt_tokens` says; `predicted_n` generated).
pub fn openai_usage(v: &Value) -> Option<Reported> {
    let count = |o: &Value, key: &str| o.get(key).and_then(Value::as_u64);
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        return Some(Reported {
            trust: Trust::Reported,
            prompt: Some(count(u, "prompt_tokens").unwrap_or(0)),
            completion: Some(count(u, "completion_tokens").unwrap_or(0)),
            cached: u
                .get("prompt_tokens_details")
                .and_then(|d| count(d, "cached_tokens"))
                .or_else(|| timings_cached(v, count(u, "prompt_tokens"))),
        });
    }
    let predicted = count(v, "tokens_predicted");
    let evaluated = count(v, "tokens_evaluated");
    if predicted.is_some() || evaluated.is_some() {
        return Some(Reported {
            trust: Trust::Reported,
            prompt: Some(evaluated.unwrap_or(0)),
            completion: Some(predicted.unwrap_or(0)),
            cached: count(v, "tokens_cached").or_else(|| timings_cached(v, evaluated)),
        });
    }
    timings(v)
}

/// The cached part of a prompt of `prompt` tokens by the same document's `timings`, when they count
/// the same prompt (an older llama-server's usage without its cached part).
pub fn timings_cached(v: &Value, prompt: Option<u64>) -> Option<u64> {
    let t = timings(v)?;
    (t.prompt == prompt).then_some(t.cached).flatten()
}

/// llama-server's `timings` object, when it counts anything.
pub fn timings(v: &Value) -> Option<Reported> {
    let t = v.get("timings").filter(|t| t.is_object())?;
    let count = |key: &str| t.get(key).and_then(Value::as_u64);
    let (processed, cached, predicted) =
        (count("prompt_n"), count("cache_n"), count("predicted_n"));
    if processed.is_none() && cached.is_none() && predicted.is_none() {
        return None;
    }
    Some(Reported {
        trust: Trust::Timings,
        prompt: Some(processed.unwrap_or(0).saturating_add(cached.unwrap_or(0))),
        completion: Some(predicted.unwrap_or(0)),
        cached,
    })
}

/// `{"error":{"message","type","code"}}`: OpenAI's shape, which llama-server's own errors share.
/// Written out directly (keys in the order serde_json's map would print them): a refusal is the
/// one answer slotgate makes under overload, so it builds no JSON tree.
pub fn openai_error(e: &GateError) -> Vec<u8> {
    let message = e.to_string();
    let mut out = Vec::with_capacity(message.len() + 64);
    out.extend_from_slice(b"{\"error\":{\"code\":");
    json_string(&mut out, e.client_code());
    out.extend_from_slice(b",\"message\":");
    json_string(&mut out, &message);
    out.extend_from_slice(b",\"type\":");
    json_string(&mut out, e.error_type());
    out.extend_from_slice(b"}}");
    out
}

/// `s` as a JSON string.
pub fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(out, s);
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_bound(body: Value) -> Option<u64> {
        CHAT.ask(&body).max_tokens
    }

    #[test]
    fn max_tokens_follows_llama_server_precedence() {
        let cases = [
            (json!({}), None),
            (json!({"max_tokens": 9}), Some(9)),
            (json!({"max_completion_tokens": 9}), Some(9)),
            (json!({"n_predict": 9}), Some(9)),
            // n_predict overrides the OpenAI names, larger or smaller.
            (json!({"max_tokens": 1, "n_predict": 500}), Some(500)),
            (json!({"max_tokens": 500, "n_predict": 1}), Some(1)),
            (
                json!({"max_tokens": 1, "max_completion_tokens": 2, "n_predict": 500}),
                Some(500),
            ),
            (
                json!({"max_completion_tokens": 1, "n_predict": 500}),
                Some(500),
            ),
            // Builds disagree between the two OpenAI names: the larger counts.
            (
                json!({"max_tokens": 1, "max_completion_tokens": 500}),
                Some(500),
            ),
            (
                json!({"max_tokens": 500, "max_completion_tokens": 1}),
                Some(500),
            ),
            // null is absent, for llama-server too.
            (json!({"max_tokens": 7, "n_predict": null}), Some(7)),
            (json!({"max_tokens": null}), None),
            // A negative bound is none at all (-1: the server's default), and wins like any other.
            (json!({"max_tokens": 1, "n_predict": -1}), None),
            (json!({"max_tokens": 5, "max_completion_tokens": -1}), None),
            (json!({"n_predict": 3, "max_tokens": -1}), Some(3)),
            // Numbers as llama-server converts them; a non-number is not a bound.
            (json!({"max_tokens": 1, "n_predict": 500.9}), Some(500)),
            (json!({"n_predict": true}), Some(1)),
            (json!({"max_tokens": 8, "n_predict": "500"}), Some(8)),
            (json!({"max_tokens": [1]}), None),
        ];
        for (body, want) in cases {
            assert_eq!(chat_bound(body.clone()), want, "{body}");
        }
    }

    #[test]
    fn each_api_reads_its_own_output_bound() {
        // Anthropic's converter reads max_tokens only, and puts 4096 when it is missing.
        assert_eq!(MESSAGES.ask(&json!({"max_tokens": 7})).max_tokens, Some(7));
        assert_eq!(
            MESSAGES.ask(&json!({"n_predict": 7})).max_tokens,
            Some(4096)
        );
        // The Responses API's max_output_tokens becomes max_tokens; n_predict still wins.
        assert_eq!(
            RESPONSES.ask(&json!({"max_output_tokens": 7})).max_tokens,
            Some(7)
        );
        assert_eq!(
            RESPONSES
                .ask(&json!({"max_output_tokens": 7, "n_predict": 9}))
                .max_tokens,
            Some(9)
        );
        assert_eq!(COMPLETION.ask(&json!({"n_predict": 3})).max_tokens, Some(3));
        assert_eq!(INFILL.ask(&json!({"n_predict": 3})).max_tokens, Some(3));
        // Embeddings and rerank generate nothing.
        assert_eq!(
            OAI_EMBEDDINGS.ask(&json!({"input": "x"})).max_tokens,
            Some(0)
        );
        assert_eq!(
            RERANK
                .ask(&json!({"query": "q", "documents": ["a"]}))
                .max_tokens,
            Some(0)
        );
    }

    #[test]
    fn error_bodies_are_the_json_a_value_would_print() {
        let errors = [
            GateError::QueueFull {
                depth: 2,
                retry_after: std::time::Duration::from_secs(3),
            },
            GateError::InvalidJson("a \"quoted\"\nline\\".into()),
            GateError::NotFound {
                method: "GET".into(),
                path: "/nö".into(),
            },
        ];
        for e in &errors {
            let want = json!({
                "error": { "message": e.to_string(), "type": e.error_type(), "code": e.code() }
            });
            assert_eq!(
                String::from_utf8(openai_error(e)).unwrap(),
                want.to_string()
            );
        }
    }

    #[test]
    fn tasks_follow_what_llama_server_makes_of_a_request() {
        let tasks = |d: DialectRef, body: Value| d.ask(&body).tasks();
        assert_eq!(tasks(CHAT, json!({"messages": [], "n": 2})), 2);
        assert_eq!(tasks(CHAT, json!({"messages": [], "n_cmpl": 3, "n": 2})), 3);
        assert_eq!(tasks(COMPLETION, json!({"prompt": ["a", "b", "c"]})), 3);
        assert_eq!(tasks(COMPLETION, json!({"prompt": [1, 2, 3]})), 1);
        assert_eq!(
            tasks(COMPLETION, json!({"prompt": [[1, 2], [3]], "n": 2})),
            4
        );
        assert_eq!(tasks(OAI_EMBEDDINGS, json!({"input": ["a", "b"]})), 2);
        assert_eq!(tasks(EMBEDDINGS, json!({"content": "a"})), 1);
        assert_eq!(
            tasks(RERANK, json!({"query": "q", "documents": ["a", "b", "c"]})),
            3
        );
        assert_eq!(tasks(RERANK, json!({"query": "q", "texts": ["a", "b"]})), 2);
        // Anthropic's converter passes no `n` on.
        assert_eq!(tasks(MESSAGES, json!({"messages": [], "n": 2})), 1);
        assert!(DECISION.ask(&Value::Null).all_slots);
    }
}
