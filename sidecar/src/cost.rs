//! Exact prompt cost, before admission: the served model's own chat template and tokenizer
//! (`POST /apply-template`, then `POST /tokenize` with the special tokens llama-server adds) count a
//! request's prompt tokens exactly as llama-server will report them in `usage.prompt_tokens`. Both
//! endpoints run on llama-server's HTTP threads and never take a generation slot.
//!
//! Counts are cached by a hash of what determines them. When llama-server cannot answer (down,
//! loading, an old build without the endpoints, a prompt shape it cannot count), the estimate stands
//! and the request goes on. The slot's context size (`GET /props`) bounds each request's
//! reservation, and a prompt that can never fit a slot is refused before it queues.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::config::Tokenizer;
use crate::metrics as m;
use crate::upstream::Upstream;

/// Longest wait for one count; beyond it the estimate stands.
const COUNT_TIMEOUT: Duration = Duration::from_secs(1);
/// Counts remembered, oldest forgotten first.
const CACHE_ENTRIES: usize = 4096;
/// After llama-server said it has no tokenizer endpoints, how long before asking again.
const UNSUPPORTED_BACKOFF: Duration = Duration::from_secs(60);
/// Body fields that never change the templated prompt: left out of the cache key.
const NOT_PROMPT: &[&str] = &[
    "max_tokens",
    "max_completion_tokens",
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

/// What the upstream's slots can hold, from `GET /props`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotContext {
    /// Tokens per slot (`default_generation_settings.n_ctx`).
    pub n_ctx: u64,
    /// The server's default generation length, when it has one (`params.n_predict` > 0).
    pub default_n_predict: Option<u64>,
}

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
    /// Until when llama-server is known not to offer the endpoints.
    unsupported_until: Mutex<Option<Instant>>,
    /// `n_ctx` per slot; 0 = not known yet.
    n_ctx: AtomicU64,
    /// The server's default `n_predict`; 0 = none.
    default_n_predict: AtomicU64,
    /// `total_slots` (llama-server's `-np`); 0 = not known yet.
    total_slots: AtomicU64,
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
            unsupported_until: Mutex::new(None),
            n_ctx: AtomicU64::new(0),
            default_n_predict: AtomicU64::new(0),
            total_slots: AtomicU64::new(0),
        }
    }

    /// The slot context, once `/props` has answered.
    pub fn slot_context(&self) -> Option<SlotContext> {
        match self.n_ctx.load(Ordering::Relaxed) {
            0 => None,
            n_ctx => Some(SlotContext {
                n_ctx,
                default_n_predict: match self.default_n_predict.load(Ordering::Relaxed) {
                    0 => None,
                    n => Some(n),
                },
            }),
        }
    }

    /// How many slots llama-server has (`total_slots` in `/props`), once it has said.
    pub fn upstream_slots(&self) -> Option<usize> {
        match self.total_slots.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n as usize),
        }
    }

    /// Reads the slot context and the slot count from `GET /props` (after every readiness change;
    /// cheap).
    pub async fn refresh_props(&self) {
        match self
            .upstream
            .json(Method::GET, "/props", None, COUNT_TIMEOUT)
            .await
        {
            Ok(props) => {
                let settings = &props["default_generation_settings"];
                let n_ctx = settings["n_ctx"].as_u64().unwrap_or(0);
                let n_predict = settings["params"]["n_predict"]
                    .as_i64()
                    .filter(|&n| n > 0)
                    .unwrap_or(0) as u64;
                self.total_slots.store(
                    props["total_slots"].as_u64().unwrap_or(0),
                    Ordering::Relaxed,
                );
                let old = self.n_ctx.swap(n_ctx, Ordering::Relaxed);
                self.default_n_predict.store(n_predict, Ordering::Relaxed);
                if old != n_ctx {
                    tracing::info!(
                        n_ctx_slot = n_ctx,
                        default_n_predict = n_predict,
                        "upstream slot context"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "GET /props failed; slot context unknown"),
        }
    }

    /// The exact prompt tokens of a request to `path` with `body`, or `None` (the estimate stands).
    pub async fn prompt_tokens(&self, path: &str, body: &Value) -> (Option<u64>, Source) {
        if self.mode == Tokenizer::Estimate || self.backing_off() {
            return (None, Source::Estimate);
        }
        let Some(shape) = Shape::of(path, body) else {
            return (None, Source::Estimate);
        };
        let key = shape.key();
        if let Some(n) = self.cached(&key) {
            return (Some(n), Source::Cache);
        }
        match self.count(&shape).await {
            Ok(n) => {
                self.remember(key, n);
                (Some(n), Source::Upstream)
            }
            Err(e) => {
                if e.starts_with("404") {
                    *lock(&self.unsupported_until) = Some(Instant::now() + UNSUPPORTED_BACKOFF);
                    tracing::warn!(error = %e, "llama-server cannot count tokens (no /tokenize or /apply-template); using the estimate");
                } else {
                    tracing::debug!(error = %e, "exact prompt count failed; using the estimate");
                }
                (None, Source::Estimate)
            }
        }
    }

    async fn count(&self, shape: &Shape<'_>) -> Result<u64, String> {
        let text = match shape {
            Shape::Tokens(n) => return Ok(*n),
            Shape::Text(t) => Value::String((*t).to_owned()),
            Shape::Chat(body) => {
                let templated = self
                    .upstream
                    .json(Method::POST, "/apply-template", Some(body), COUNT_TIMEOUT)
                    .await?;
                match templated.get("prompt") {
                    Some(p @ Value::String(_)) => p.clone(),
                    _ => return Err("/apply-template answered without a prompt".into()),
                }
            }
        };
        // As llama-server tokenizes a prompt for generation: with BOS and the like, special tokens
        // parsed.
        let req = json!({"content": text, "add_special": true, "parse_special": true});
        let tokens = self
            .upstream
            .json(Method::POST, "/tokenize", Some(&req), COUNT_TIMEOUT)
            .await?;
        tokens["tokens"]
            .as_array()
            .map(|t| t.len() as u64)
            .ok_or_else(|| "/tokenize answered without tokens".into())
    }

    fn backing_off(&self) -> bool {
        let mut until = lock(&self.unsupported_until);
        match *until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                *until = None;
                false
            }
            None => false,
        }
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
    metrics::counter!(m::PROMPT_COUNTS_TOTAL, "source" => source.label()).increment(1);
    if let Some(exact) = exact.filter(|&n| n > 0) {
        metrics::histogram!(m::COST_ESTIMATE_ERROR_RATIO).record(estimate as f64 / exact as f64);
    }
}

/// Tokens to reserve: the prompt plus the most the request may generate within the slot's context.
/// `None` when the context is unknown; `Err(n_ctx)` when the prompt alone cannot fit a slot
/// (llama-server refuses a prompt of `n_ctx` tokens or more).
pub fn reservation(
    prompt: u64,
    max_tokens: Option<u64>,
    slot: Option<SlotContext>,
) -> Result<Option<u64>, u64> {
    let Some(slot) = slot else {
        return Ok(None);
    };
    if prompt >= slot.n_ctx {
        return Err(slot.n_ctx);
    }
    let room = slot.n_ctx - prompt;
    let output = max_tokens
        .or(slot.default_n_predict)
        .map_or(room, |n| n.min(room));
    Ok(Some(prompt + output))
}

/// What can be counted, and how.
enum Shape<'a> {
    /// A chat request: template it first.
    Chat(&'a Value),
    /// A prompt string.
    Text(&'a str),
    /// A prompt given as token ids.
    Tokens(u64),
}

impl<'a> Shape<'a> {
    fn of(path: &str, body: &'a Value) -> Option<Shape<'a>> {
        if path.ends_with("/chat/completions") {
            return body.get("messages").is_some().then_some(Shape::Chat(body));
        }
        if matches!(path, "/completion" | "/completions" | "/v1/completions") {
            return match body.get("prompt")? {
                Value::String(s) => Some(Shape::Text(s)),
                // One prompt of token ids (a list of lists is several prompts: not counted).
                Value::Array(items) if items.iter().all(Value::is_u64) => {
                    Some(Shape::Tokens(items.len() as u64))
                }
                _ => None,
            };
        }
        None
    }

    /// What determines the count: the body without the fields that never change the prompt.
    fn key(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        match self {
            Shape::Chat(body) => {
                h.update(b"chat\0");
                if let Value::Object(fields) = body {
                    for (k, v) in fields
                        .iter()
                        .filter(|(k, _)| !NOT_PROMPT.contains(&k.as_str()))
                    {
                        h.update(k.as_bytes());
                        h.update(b"\0");
                        h.update(v.to_string().as_bytes());
                        h.update(b"\0");
                    }
                }
            }
            Shape::Text(t) => {
                h.update(b"text\0");
                h.update(t.as_bytes());
            }
            Shape::Tokens(n) => {
                h.update(b"tokens\0");
                h.update(n.to_le_bytes());
            }
        }
        h.finalize().into()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(n_ctx: u64, default: Option<u64>) -> Option<SlotContext> {
        Some(SlotContext {
            n_ctx,
            default_n_predict: default,
        })
    }

    #[test]
    fn reservations_are_bounded_by_the_slot() {
        assert_eq!(reservation(100, Some(50), slot(1000, None)), Ok(Some(150)));
        // More than fits: only what the slot's context leaves.
        assert_eq!(
            reservation(900, Some(500), slot(1000, None)),
            Ok(Some(1000))
        );
        // No max_tokens: the server's default, else the rest of the context.
        assert_eq!(reservation(100, None, slot(1000, Some(64))), Ok(Some(164)));
        assert_eq!(reservation(100, None, slot(1000, None)), Ok(Some(1000)));
        // A prompt that cannot fit at all.
        assert_eq!(reservation(1000, Some(1), slot(1000, None)), Err(1000));
        assert_eq!(reservation(5, Some(1), None), Ok(None));
    }

    #[test]
    fn the_cache_key_ignores_what_does_not_change_the_prompt() {
        let a = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0.1});
        let b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 99, "stream": true});
        let c = json!({"messages": [{"role": "user", "content": "hello"}]});
        let chat = "/v1/chat/completions";
        let key = |v: &Value| Shape::of(chat, v).unwrap().key();
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&c));
        let tools = json!({"messages": [{"role": "user", "content": "hi"}], "tools": []});
        assert_ne!(key(&a), key(&tools), "tools change the template");
    }

    #[test]
    fn prompt_shapes() {
        let completion = |v: Value| Shape::of("/completion", &v).map(|s| s.key());
        assert!(completion(json!({"prompt": "once upon"})).is_some());
        assert!(matches!(
            Shape::of("/completion", &json!({"prompt": [1, 2, 3]})),
            Some(Shape::Tokens(3))
        ));
        assert!(completion(json!({"prompt": [[1, 2], [3]]})).is_none());
        assert!(Shape::of("/v1/embeddings", &json!({"input": "x"})).is_none());
        assert!(Shape::of("/v1/chat/completions", &json!({"prompt": "x"})).is_none());
    }
}
