//! Intake: which endpoint a request is for, its body read within a size and time bound, the JSON
//! parsed once, and the summary a policy (and the access log) sees.

use std::time::Duration;

use bytes::Bytes;
use http::{header, request, Method, Request};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use serde_json::{Map, Value};
use slotgate_sdk::{Mutations, Peer, RequestSummary};

use crate::error::GateError;

/// How an allowed endpoint is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Runs on a generation slot: admitted through the queue.
    Slot,
    /// Answered by llama-server outside its slots: forwarded at once.
    Passthrough,
}

/// The forwarding allow-list. Every other path is a 404 from slotgate.
const ENDPOINTS: &[(&str, &str, Kind)] = &[
    ("POST", "/v1/chat/completions", Kind::Slot),
    ("POST", "/chat/completions", Kind::Slot),
    ("POST", "/v1/completions", Kind::Slot),
    ("POST", "/completions", Kind::Slot),
    ("POST", "/completion", Kind::Slot),
    ("POST", "/v1/embeddings", Kind::Slot),
    ("POST", "/embeddings", Kind::Slot),
    ("POST", "/embedding", Kind::Slot),
    ("POST", "/v1/rerank", Kind::Slot),
    ("POST", "/rerank", Kind::Slot),
    ("POST", "/v1/reranking", Kind::Slot),
    ("POST", "/reranking", Kind::Slot),
    ("POST", "/tokenize", Kind::Passthrough),
    ("POST", "/detokenize", Kind::Passthrough),
    ("POST", "/apply-template", Kind::Passthrough),
    ("GET", "/v1/models", Kind::Passthrough),
    ("GET", "/models", Kind::Passthrough),
    ("GET", "/props", Kind::Passthrough),
];

/// Request headers a policy may see (never credentials).
const SUMMARY_HEADERS: &[&str] = &[
    "user-agent",
    "x-request-id",
    "x-tenant",
    "openai-organization",
    "openai-project",
];

pub fn route(method: &Method, path: &str) -> Result<Kind, GateError> {
    let mut path_known = false;
    for (m, p, kind) in ENDPOINTS {
        if *p == path {
            if *m == method.as_str() {
                return Ok(*kind);
            }
            path_known = true;
        }
    }
    let (method, path) = (method.to_string(), path.to_owned());
    Err(if path_known {
        GateError::MethodNotAllowed { method, path }
    } else {
        GateError::NotFound { method, path }
    })
}

/// A request whose body has been read and checked.
pub struct Intake {
    pub parts: request::Parts,
    pub body: Bytes,
    /// The body as parsed (POST only).
    pub json: Option<Value>,
    pub summary: RequestSummary,
}

pub struct Limits {
    pub max_body: usize,
    pub body_timeout: Duration,
}

pub async fn read(
    req: Request<Incoming>,
    limits: &Limits,
    peer: Option<Peer>,
) -> Result<Intake, GateError> {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return Err(GateError::BodyTooLarge {
            limit: limits.max_body,
        });
    }
    let collected = tokio::time::timeout(
        limits.body_timeout,
        Limited::new(body, limits.max_body).collect(),
    )
    .await
    .map_err(|_| GateError::BodyTimeout(limits.body_timeout))?;
    let body = match collected {
        Ok(c) => c.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(GateError::BodyTooLarge {
                limit: limits.max_body,
            })
        }
        Err(e) => return Err(GateError::BodyRead(e.to_string())),
    };
    let json = parse_body(&parts.method, &body)?;
    let summary = summarize(&parts, json.as_ref(), peer);
    Ok(Intake {
        parts,
        body,
        json,
        summary,
    })
}

/// The body as JSON: a POST's must be one JSON object; other methods' bodies are not parsed.
pub(crate) fn parse_body(method: &Method, body: &[u8]) -> Result<Option<Value>, GateError> {
    if method != Method::POST {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| GateError::InvalidJson(e.to_string()))?;
    if !value.is_object() {
        return Err(GateError::InvalidJson("expected a JSON object".into()));
    }
    Ok(Some(value))
}

pub(crate) fn summarize(
    parts: &request::Parts,
    json: Option<&Value>,
    peer: Option<Peer>,
) -> RequestSummary {
    let null = Value::Null;
    let j = json.unwrap_or(&null);
    let prompt_chars =
        text_chars(j.get("messages")) + text_chars(j.get("prompt")) + text_chars(j.get("input"));
    RequestSummary {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        model: j.get("model").and_then(Value::as_str).map(str::to_owned),
        stream: j.get("stream").and_then(Value::as_bool).unwrap_or(false),
        max_tokens: j.as_object().and_then(max_tokens),
        prompt_chars,
        prompt_tokens_estimate: prompt_chars.div_ceil(4),
        // Counted by `cost` just after, for generation endpoints.
        prompt_tokens: None,
        reserved_tokens: None,
        priority_hint: j.get("priority").and_then(Value::as_i64),
        peer,
        api_key: api_key_hash(&parts.headers),
        headers: SUMMARY_HEADERS
            .iter()
            .filter_map(|h| {
                Some((
                    h.to_string(),
                    parts.headers.get(*h)?.to_str().ok()?.to_owned(),
                ))
            })
            .collect(),
        queue: Default::default(),
    }
}

/// The body keys that bound how many tokens llama-server generates. It reads `n_predict` first, then
/// `max_completion_tokens`, then `max_tokens` (the first present and not `null`, `tools/server`'s
/// request schema).
const MAX_TOKENS_KEYS: [&str; 3] = ["n_predict", "max_completion_tokens", "max_tokens"];

/// A token-bound value as llama-server reads it (nlohmann's number conversion): `Some(Some(n))` a
/// bound of `n` (a fraction truncated, `true`/`false` as 1/0), `Some(None)` no bound (a negative
/// value: -1 means the server's default, usually unbounded), `None` not a number (llama-server
/// rejects it, or older builds ignore it).
fn token_bound(v: &Value) -> Option<Option<u64>> {
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

/// The most tokens llama-server will generate for this body, `None` when the body sets no bound (the
/// server's default applies). The same for a policy and for admission whichever key the client used:
/// - `n_predict` overrides the OpenAI names whenever it holds a number, on every endpoint, so
///   `{"max_tokens": 1, "n_predict": 500}` may generate 500.
/// - Between `max_completion_tokens` and `max_tokens` current llama-server takes the former, while
///   older builds ignore it and read only `max_tokens`. Where they disagree the larger one counts
///   (a negative one, meaning no bound, counts as the largest): conservative for admission.
fn max_tokens(body: &Map<String, Value>) -> Option<u64> {
    let bound = |key: &str| body.get(key).filter(|v| !v.is_null()).and_then(token_bound);
    if let Some(n_predict) = bound("n_predict") {
        return n_predict;
    }
    match (bound("max_completion_tokens"), bound("max_tokens")) {
        (None, None) => None,
        (Some(a), None) | (None, Some(a)) => a,
        (Some(a), Some(b)) => a.zip(b).map(|(a, b)| a.max(b)),
    }
}

/// `sha256:<hex>` of the bearer token, so no policy, log line or label ever holds the key itself.
fn api_key_hash(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let key = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?
        .trim();
    (!key.is_empty()).then(|| hash_api_key(key))
}

/// The form in which policies see an API key: `sha256:` and 64 lower-case hex digits.
pub fn hash_api_key(key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key.as_bytes());
    format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

impl Intake {
    /// Applies a policy's request changes. The body is rewritten only when something changes.
    pub fn apply(&mut self, m: &Mutations) -> Result<(), GateError> {
        if m.cap_max_tokens.is_none() && !m.disable_prompt_cache && !m.strip_id_slot {
            return Ok(());
        }
        // Only a POST has a JSON body to change. A GET's (empty, or anything) is forwarded as it
        // came: parsing it would turn a policy's changes into a 400 for every `GET /v1/models`.
        if self.json.is_none() {
            return Ok(());
        }
        let mut v: Value = serde_json::from_slice(&self.body)
            .map_err(|e| GateError::InvalidJson(e.to_string()))?;
        let Some(obj) = v.as_object_mut() else {
            return Ok(());
        };
        if let Some(cap) = m.cap_max_tokens {
            // llama-server's native endpoints say n_predict; OpenAI's say max_tokens or
            // max_completion_tokens. Cap every one present, whichever llama-server ends up reading: a
            // value that is no bound (negative) or not a number at all becomes the cap. Set
            // max_tokens (n_predict on /completion) when none is present.
            let mut capped = false;
            for key in MAX_TOKENS_KEYS {
                let Some(v) = obj.get(key).filter(|v| !v.is_null()) else {
                    continue;
                };
                let n = token_bound(v).flatten().map_or(cap, |n| n.min(cap));
                obj.insert(key.into(), Value::from(n));
                capped = true;
            }
            if !capped {
                let key = if self.summary.path == "/completion" {
                    "n_predict"
                } else {
                    "max_tokens"
                };
                obj.insert(key.into(), Value::from(cap));
            }
            self.summary.max_tokens = max_tokens(obj);
        }
        if m.disable_prompt_cache {
            obj.insert("cache_prompt".into(), Value::Bool(false));
        }
        if m.strip_id_slot {
            obj.remove("id_slot");
        }
        self.body =
            Bytes::from(serde_json::to_vec(&v).map_err(|e| GateError::InvalidJson(e.to_string()))?);
        self.json = Some(v);
        Ok(())
    }
}

impl Intake {
    /// For a chat stream whose client did not ask for `stream_options.include_usage`: asks for it in
    /// the forwarded body, so the stream reports its usage. Returns whether it did (the client's
    /// stream must then lose the usage chunk again, see `stream_usage`).
    pub fn ask_for_stream_usage(&mut self) -> Result<bool, GateError> {
        if !self.summary.stream
            || !crate::stream_usage::CHAT_PATHS.contains(&self.summary.path.as_str())
        {
            return Ok(false);
        }
        let Some(Value::Object(obj)) = self.json.as_mut() else {
            return Ok(false);
        };
        let asked = obj
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            == Some(true);
        if asked {
            return Ok(false);
        }
        match obj.get_mut("stream_options") {
            Some(Value::Object(opts)) => {
                opts.insert("include_usage".into(), Value::Bool(true));
            }
            _ => {
                obj.insert(
                    "stream_options".into(),
                    serde_json::json!({"include_usage": true}),
                );
            }
        }
        self.body = Bytes::from(
            serde_json::to_vec(&self.json).map_err(|e| GateError::InvalidJson(e.to_string()))?,
        );
        Ok(true)
    }
}

/// Characters of text in a prompt-like value: a string, an array of strings or of messages
/// (`content` as a string or as parts with `text`).
fn text_chars(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => s.chars().count() as u64,
        Some(Value::Array(items)) => items.iter().map(|i| text_chars(Some(i))).sum(),
        Some(Value::Object(o)) => text_chars(o.get("content")) + text_chars(o.get("text")),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_are_hashed() {
        assert_eq!(
            hash_api_key("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut h = http::HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(api_key_hash(&h), Some(hash_api_key("abc")));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(api_key_hash(&h), None);
    }

    #[test]
    fn routes_allow_list() {
        assert_eq!(
            route(&Method::POST, "/v1/chat/completions").unwrap(),
            Kind::Slot
        );
        assert_eq!(route(&Method::GET, "/props").unwrap(), Kind::Passthrough);
        assert_eq!(
            route(&Method::GET, "/v1/chat/completions")
                .unwrap_err()
                .status(),
            405
        );
        assert_eq!(route(&Method::POST, "/slots").unwrap_err().status(), 404);
    }

    fn intake(path: &str, body: Value) -> Intake {
        let (parts, ()) = Request::post(path).body(()).unwrap().into_parts();
        let summary = summarize(&parts, Some(&body), None);
        Intake {
            parts,
            body: Bytes::from(body.to_string()),
            json: Some(body),
            summary,
        }
    }

    fn summary_max_tokens(body: Value) -> Option<u64> {
        intake("/v1/chat/completions", body).summary.max_tokens
    }

    #[test]
    fn max_tokens_follows_llama_server_precedence() {
        use serde_json::json;
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
            assert_eq!(summary_max_tokens(body.clone()), want, "{body}");
        }
        let (parts, ()) = Request::get("/props").body(()).unwrap().into_parts();
        assert_eq!(summarize(&parts, None, None).max_tokens, None);
    }

    #[test]
    fn cap_max_tokens_caps_every_key_present() {
        use serde_json::json;
        let cap = |path: &str, body: Value, cap: u64| {
            let mut i = intake(path, body);
            let m = Mutations {
                cap_max_tokens: Some(cap),
                ..Default::default()
            };
            i.apply(&m).unwrap();
            let sent: Value = serde_json::from_slice(&i.body).unwrap();
            (sent, i.summary.max_tokens)
        };
        let chat = "/v1/chat/completions";

        let (sent, summary) = cap(
            chat,
            json!({"max_tokens": 1, "max_completion_tokens": 900, "n_predict": 500}),
            100,
        );
        assert_eq!(
            (
                &sent["max_tokens"],
                &sent["max_completion_tokens"],
                &sent["n_predict"]
            ),
            (&json!(1), &json!(100), &json!(100))
        );
        assert_eq!(summary, Some(100));

        // Within the cap: unchanged, and the summary stays the effective value.
        let (sent, summary) = cap(chat, json!({"max_tokens": 500, "n_predict": 1}), 100);
        assert_eq!(
            (&sent["max_tokens"], &sent["n_predict"]),
            (&json!(100), &json!(1))
        );
        assert_eq!(summary, Some(1));

        // No bound, or no number: the cap takes its place.
        let (sent, summary) = cap(chat, json!({"max_tokens": 5, "n_predict": -1}), 64);
        assert_eq!(
            (&sent["max_tokens"], &sent["n_predict"]),
            (&json!(5), &json!(64))
        );
        assert_eq!(summary, Some(64));
        let (sent, summary) = cap(chat, json!({"n_predict": "lots"}), 64);
        assert_eq!(
            (&sent["n_predict"], sent.get("max_tokens")),
            (&json!(64), None)
        );
        assert_eq!(summary, Some(64));

        // None present (null is none): the endpoint's own name is set.
        let (sent, summary) = cap(chat, json!({"max_tokens": null}), 32);
        assert_eq!(
            (&sent["max_tokens"], sent.get("n_predict")),
            (&json!(32), None)
        );
        assert_eq!(summary, Some(32));
        let (sent, summary) = cap("/completion", json!({"prompt": "x"}), 32);
        assert_eq!(
            (&sent["n_predict"], sent.get("max_tokens")),
            (&json!(32), None)
        );
        assert_eq!(summary, Some(32));
    }

    #[test]
    fn mutations_leave_a_request_without_a_json_body_alone() {
        // Found by fuzzing: a GET with a policy's changes was refused as invalid JSON.
        let (parts, ()) = Request::get("/v1/models").body(()).unwrap().into_parts();
        let summary = summarize(&parts, None, None);
        let mut i = Intake {
            parts,
            body: Bytes::new(),
            json: None,
            summary,
        };
        let m = Mutations {
            cap_max_tokens: Some(16),
            disable_prompt_cache: true,
            strip_id_slot: true,
            ..Default::default()
        };
        i.apply(&m).unwrap();
        assert_eq!((&i.body[..], i.summary.max_tokens), (&b""[..], None));
    }

    #[test]
    fn summary_counts_prompt_text() {
        let req = Request::post("/v1/chat/completions")
            .header("user-agent", "t")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let body = serde_json::json!({
            "model": "m", "stream": true, "max_tokens": 9, "priority": -2,
            "messages": [{"role":"user","content":"hello"},{"role":"user","content":[{"type":"text","text":"abc"}]}]
        });
        let s = summarize(
            &parts,
            Some(&body),
            Some(Peer {
                uid: 1,
                gid: 2,
                pid: Some(3),
            }),
        );
        assert_eq!((s.prompt_chars, s.prompt_tokens_estimate), (8, 2));
        assert_eq!(
            (s.stream, s.max_tokens, s.priority_hint),
            (true, Some(9), Some(-2))
        );
        assert_eq!(s.headers.get("user-agent").map(String::as_str), Some("t"));
    }
}
