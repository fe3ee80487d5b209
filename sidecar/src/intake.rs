//! Intake: which endpoint a request is for, its body read within a size and time bound, the JSON
//! parsed once, and the summary a policy (and the access log) sees.

use std::time::Duration;

use bytes::Bytes;
use http::{header, request, Method, Request};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use serde_json::Value;
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
    let json = if parts.method == Method::POST {
        let value: Value =
            serde_json::from_slice(&body).map_err(|e| GateError::InvalidJson(e.to_string()))?;
        if !value.is_object() {
            return Err(GateError::InvalidJson("expected a JSON object".into()));
        }
        Some(value)
    } else {
        None
    };
    let summary = summarize(&parts, json.as_ref(), peer);
    Ok(Intake {
        parts,
        body,
        summary,
    })
}

fn summarize(parts: &request::Parts, json: Option<&Value>, peer: Option<Peer>) -> RequestSummary {
    let null = Value::Null;
    let j = json.unwrap_or(&null);
    let prompt_chars =
        text_chars(j.get("messages")) + text_chars(j.get("prompt")) + text_chars(j.get("input"));
    RequestSummary {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        model: j.get("model").and_then(Value::as_str).map(str::to_owned),
        stream: j.get("stream").and_then(Value::as_bool).unwrap_or(false),
        max_tokens: ["max_tokens", "max_completion_tokens", "n_predict"]
            .iter()
            .find_map(|k| j.get(*k).and_then(Value::as_u64)),
        prompt_chars,
        prompt_tokens_estimate: prompt_chars.div_ceil(4),
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
        let mut v: Value = serde_json::from_slice(&self.body)
            .map_err(|e| GateError::InvalidJson(e.to_string()))?;
        let Some(obj) = v.as_object_mut() else {
            return Ok(());
        };
        if let Some(cap) = m.cap_max_tokens {
            // llama-server's native endpoints say n_predict; OpenAI's say max_tokens or
            // max_completion_tokens. Cap whichever is present, and set max_tokens when none is.
            let mut capped = false;
            for key in ["max_tokens", "max_completion_tokens", "n_predict"] {
                if let Some(n) = obj.get(key).and_then(Value::as_u64) {
                    obj.insert(key.into(), Value::from(n.min(cap)));
                    capped = true;
                }
            }
            if !capped {
                let key = if self.summary.path == "/completion" {
                    "n_predict"
                } else {
                    "max_tokens"
                };
                obj.insert(key.into(), Value::from(cap));
            }
            self.summary.max_tokens = Some(self.summary.max_tokens.map_or(cap, |n| n.min(cap)));
        }
        if m.disable_prompt_cache {
            obj.insert("cache_prompt".into(), Value::Bool(false));
        }
        if m.strip_id_slot {
            obj.remove("id_slot");
        }
        self.body =
            Bytes::from(serde_json::to_vec(&v).map_err(|e| GateError::InvalidJson(e.to_string()))?);
        Ok(())
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
