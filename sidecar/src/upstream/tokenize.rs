//! Exact prompt cost, before admission, with llama-server's own endpoints in each API's way (see
//! `dialect::Count`): its count endpoint (`/v1/chat/completions/input_tokens`,
//! `/v1/messages/count_tokens`, `/v1/responses/input_tokens`), or `/tokenize` with the special
//! tokens llama-server adds, prompt by prompt; on an older build without a count endpoint, a chat is
//! templated (`/apply-template`) and tokenized. All run on llama-server's HTTP threads and never
//! take a generation slot. The client's own bytes are sent: the template prints tool schemas in key
//! order, so a re-serialised body could count differently.
//!
//! Counts are cached by a hash of what determines them. When llama-server cannot answer (down,
//! loading, an old build without the endpoints, a prompt shape it cannot count), the estimate stands
//! and the request goes on.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::config::Tokenizer;
use crate::dialect::{Count, DialectRef, Piece};
use crate::metrics as m;
use crate::upstream::Upstream;

/// Longest wait for one count; beyond it the estimate stands.
const COUNT_TIMEOUT: Duration = Duration::from_secs(1);
/// Counts remembered, oldest forgotten first.
const CACHE_ENTRIES: usize = 4096;
/// After llama-server said it has no such endpoint, how long before asking again.
const UNSUPPORTED_BACKOFF: Duration = Duration::from_secs(60);
/// Body fields that never change the templated prompt: left out of the cache key.
const NOT_PROMPT: &[&str] = &[
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n_predict",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "cache_prompt",
    "id_slot",
    "priority",
    "n_probs",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "user",
    "ignore_eos",
];

/// How a request's prompt was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Upstream,
    Cache,
    Estimate,
    /// Not counted: a slot was free, so it was forwarded at once on the estimate (see `pipeline`).
    Forwarded,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::Upstream => "upstream",
            Source::Cache => "cache",
            Source::Estimate => "estimate",
            Source::Forwarded => "forwarded",
        }
    }
}

pub struct Counter {
    mode: Tokenizer,
    upstream: Upstream,
    cache: Mutex<Cache>,
    /// Endpoints llama-server said it does not have, until when.
    unsupported: Mutex<HashMap<&'static str, Instant>>,
}

#[derive(Default)]
struct Cache {
    counts: HashMap<[u8; 32], u64>,
    order: VecDeque<[u8; 32]>,
}

impl Counter {
    pub fn new(mode: Tokenizer, upstream: Upstream) -> Self {
        Counter {
            mode,
            upstream,
            cache: Mutex::new(Cache::default()),
            unsupported: Mutex::new(HashMap::new()),
        }
    }

    /// The exact prompt tokens of a request in `dialect` with `body` (as parsed, and as the client
    /// sent it), one count per prompt; `None`: the estimate stands.
    ///
    /// In front of llama-server's router, `model` is the loaded model the request names: every
    /// count goes to it with `?autoload=false` (a count never loads a model, nor evicts one), and is
    /// remembered for it alone (each model has its own tokenizer).
    pub async fn prompt_tokens(
        &self,
        dialect: DialectRef,
        json: &Value,
        raw: &Bytes,
        model: Option<&str>,
    ) -> (Option<Vec<u64>>, Source) {
        if self.mode == Tokenizer::Estimate {
            return (None, Source::Estimate);
        }
        let counted = match dialect.count(json) {
            Count::None => return (None, Source::Estimate),
            Count::Endpoint {
                path,
                chat_fallback,
            } => self
                .whole(path, chat_fallback, json, raw, model)
                .await
                .map(|(n, s)| (vec![n], s)),
            Count::Prompts(pieces) => {
                let mut counts = Vec::with_capacity(pieces.len());
                let mut source = Source::Cache;
                for piece in &pieces {
                    match self.piece(piece, model).await {
                        Ok((n, s)) => {
                            counts.push(n);
                            if s == Source::Upstream {
                                source = s;
                            }
                        }
                        Err(e) => {
                            self.failed(&e, "/tokenize");
                            return (None, Source::Estimate);
                        }
                    }
                }
                Ok((counts, source))
            }
        };
        match counted {
            Ok((counts, source)) => (Some(counts), source),
            Err(()) => (None, Source::Estimate),
        }
    }

    /// A whole templated prompt: the API's count endpoint, or the chat template and tokenizer.
    async fn whole(
        &self,
        path: &'static str,
        chat_fallback: bool,
        json: &Value,
        raw: &Bytes,
        model: Option<&str>,
    ) -> Result<(u64, Source), ()> {
        let key = body_key(&keyed(model, path), json, raw);
        if let Some(n) = self.cached(&key) {
            return Ok((n, Source::Cache));
        }
        // Only a build without the endpoint (404, remembered a while) is counted the older way; a
        // slow or failing answer leaves the estimate, so a count never takes two timeouts.
        let answer = match self.backing_off(path) {
            true => None,
            false => Some(
                self.upstream
                    .raw_json(
                        http::Method::POST,
                        &no_autoload(path, model),
                        raw.clone(),
                        COUNT_TIMEOUT,
                    )
                    .await
                    .and_then(|v| {
                        v["input_tokens"]
                            .as_u64()
                            .ok_or_else(|| format!("{path} answered without input_tokens"))
                    }),
            ),
        };
        let n = match answer {
            Some(Ok(n)) => n,
            Some(Err(e)) if !e.starts_with("404") => {
                self.failed(&e, path);
                return Err(());
            }
            Some(Err(e)) => {
                self.failed(&e, path);
                self.older_way(chat_fallback, raw, model).await?
            }
            None => self.older_way(chat_fallback, raw, model).await?,
        };
        self.remember(key, n);
        Ok((n, Source::Upstream))
    }

    /// A chat on a build without the count endpoint, when the API allows it.
    async fn older_way(
        &self,
        chat_fallback: bool,
        raw: &Bytes,
        model: Option<&str>,
    ) -> Result<u64, ()> {
        if !chat_fallback || self.backing_off("/apply-template") {
            return Err(());
        }
        self.templated(raw, model)
            .await
            .map_err(|e| self.failed(&e, "/apply-template"))
    }

    /// A chat as older builds count it: `/apply-template`, then `/tokenize`.
    async fn templated(&self, raw: &Bytes, model: Option<&str>) -> Result<u64, String> {
        let templated = self
            .upstream
            .raw_json(
                http::Method::POST,
                &no_autoload("/apply-template", model),
                raw.clone(),
                COUNT_TIMEOUT,
            )
            .await?;
        match templated.get("prompt") {
            Some(Value::String(p)) => self.tokenize(p, true, model).await,
            _ => Err("/apply-template answered without a prompt".into()),
        }
    }

    async fn piece(&self, piece: &Piece<'_>, model: Option<&str>) -> Result<(u64, Source), String> {
        match piece {
            Piece::Tokens(n) => Ok((*n, Source::Cache)),
            Piece::Text(t) => self.text(t, true, model).await,
            Piece::Parts(parts, extra) => {
                // The special tokens the model adds to any prompt (BOS), as an empty text shows.
                let (special, mut source) = self.text("", true, model).await?;
                let mut total = extra + special;
                for p in parts {
                    let (n, s) = self.text(p, false, model).await?;
                    total += n;
                    if s == Source::Upstream {
                        source = s;
                    }
                }
                Ok((total, source))
            }
        }
    }

    async fn text(
        &self,
        text: &str,
        special: bool,
        model: Option<&str>,
    ) -> Result<(u64, Source), String> {
        let key = text_key(&keyed(model, text), special);
        if let Some(n) = self.cached(&key) {
            return Ok((n, Source::Cache));
        }
        if self.backing_off("/tokenize") {
            return Err("/tokenize: not offered".into());
        }
        let n = self.tokenize(text, special, model).await?;
        self.remember(key, n);
        Ok((n, Source::Upstream))
    }

    /// As llama-server tokenizes a prompt for generation: with BOS and the like (`special`),
    /// special tokens parsed.
    async fn tokenize(
        &self,
        text: &str,
        special: bool,
        model: Option<&str>,
    ) -> Result<u64, String> {
        let mut req = json!({"content": text, "add_special": special, "parse_special": true});
        if let Some(model) = model {
            req["model"] = json!(model);
        }
        let tokens = self
            .upstream
            .json(
                Method::POST,
                &no_autoload("/tokenize", model),
                Some(&req),
                COUNT_TIMEOUT,
            )
            .await?;
        tokens["tokens"]
            .as_array()
            .map(|t| t.len() as u64)
            .ok_or_else(|| "/tokenize answered without tokens".into())
    }

    /// Notes a failed count; a 404 means this build has no such endpoint (asked again later).
    fn failed(&self, e: &str, path: &'static str) {
        if e.starts_with("404") {
            self.lock_unsupported()
                .insert(path, Instant::now() + UNSUPPORTED_BACKOFF);
            tracing::info!(
                endpoint = path,
                "llama-server has no {path}; counting without it"
            );
        } else {
            tracing::debug!(error = %e, "exact prompt count failed; using the estimate");
        }
    }

    fn backing_off(&self, path: &'static str) -> bool {
        let mut unsupported = self.lock_unsupported();
        match unsupported.get(path) {
            Some(t) if Instant::now() < *t => true,
            Some(_) => {
                unsupported.remove(path);
                false
            }
            None => false,
        }
    }

    fn lock_unsupported(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Instant>> {
        lock(&self.unsupported)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<u64> {
        lock(&self.cache).counts.get(key).copied()
    }

    fn remember(&self, key: [u8; 32], n: u64) {
        let mut cache = lock(&self.cache);
        if cache.counts.insert(key, n).is_none() {
            cache.order.push_back(key);
            while cache.order.len() > CACHE_ENTRIES {
                if let Some(old) = cache.order.pop_front() {
                    cache.counts.remove(&old);
                }
            }
        }
    }
}

/// Records how far the estimate was from the exact count (`estimate / exact`), and how it was counted.
pub fn record(source: Source, estimate: u64, exact: Option<u64>) {
    m::hot().prompt_counts(source.label()).increment(1);
    if let Some(exact) = exact.filter(|&n| n > 0) {
        m::hot().cost_error.record(estimate as f64 / exact as f64);
    }
}

/// What determines a whole-prompt count: the body as counted, without the fields that never change
/// the prompt. The bytes of each member, not a re-serialised value: a chat template prints tool
/// schemas in the key order sent, and serde_json would sort it away.
fn body_key(path: &str, json: &Value, raw: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(path.as_bytes());
    h.update(b"\0");
    let mut field = |k: &str, v: &[u8]| {
        if !NOT_PROMPT.contains(&k) {
            h.update(k.as_bytes());
            h.update(b"\0");
            h.update(v);
            h.update(b"\0");
        }
    };
    match crate::json_edit::members(raw) {
        Some(members) => members.into_iter().for_each(|(k, v)| field(&k, v)),
        None => {
            if let Value::Object(fields) = json {
                for (k, v) in fields {
                    field(k, v.to_string().as_bytes());
                }
            }
        }
    }
    h.finalize().into()
}

/// A cache key's text, for one router model when there is one.
fn keyed(model: Option<&str>, what: &str) -> String {
    match model {
        Some(m) => format!("{m}\0{what}"),
        None => what.to_owned(),
    }
}

/// `path` as sent to a router's `model`: never loading it.
fn no_autoload(path: &str, model: Option<&str>) -> String {
    match model {
        Some(_) => format!("{path}?autoload=false"),
        None => path.to_owned(),
    }
}

fn text_key(text: &str, special: bool) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(if special { b"text\0" } else { b"part\0" });
    h.update(text.as_bytes());
    h.finalize().into()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_has_its_metric_handle() {
        for s in [
            Source::Upstream,
            Source::Cache,
            Source::Estimate,
            Source::Forwarded,
        ] {
            assert!(
                m::PROMPT_COUNT_SOURCES.contains(&s.label()),
                "{}",
                s.label()
            );
        }
    }

    #[test]
    fn a_count_is_keyed_on_the_prompt_as_sent() {
        let key = |raw: &str| {
            let json: Value = serde_json::from_str(raw).unwrap();
            body_key("/v1/messages/count_tokens", &json, raw.as_bytes())
        };
        let a = r#"{"tools":[{"b":1,"a":2}],"max_tokens":5}"#;
        // Key order in a tool schema reaches the template, so it is another prompt.
        assert_ne!(key(a), key(r#"{"tools":[{"a":2,"b":1}],"max_tokens":5}"#));
        // A field that never changes the prompt is left out.
        assert_eq!(key(a), key(r#"{"tools":[{"b":1,"a":2}],"max_tokens":9}"#));
    }
}
