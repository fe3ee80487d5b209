//! Intake: a request's body read within a size and time bound, its JSON parsed once (on a slot
//! route, in its API's dialect), and the summary a policy (and the access log) sees. Changes to the
//! body (a policy's cap, the stream usage slotgate asks for) edit the one field in the client's
//! bytes (see `json_edit`).

use bytes::Bytes;
use http::{header, request, HeaderName, Method, Request};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use serde_json::Value;
use slotgate_sdk::{Mutations, Peer, RequestSummary};

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::config::{Limits, TierPriorities};
use crate::dialect::{self, Ask, DialectRef};
use crate::error::GateError;
use crate::json_edit;
use crate::pipeline::lineage;
use crate::pipeline::routes::Handling;
use crate::router::Pool;
use crate::state::App;

/// Request headers a policy may see (never credentials); names made once, so a look-up parses
/// none.
static SUMMARY_HEADERS: [http::HeaderName; 5] = [
    header::USER_AGENT,
    http::HeaderName::from_static("x-request-id"),
    http::HeaderName::from_static("x-tenant"),
    http::HeaderName::from_static("openai-organization"),
    http::HeaderName::from_static("openai-project"),
];

/// A request whose body has been read and checked.
pub struct Intake {
    pub parts: request::Parts,
    pub body: Bytes,
    /// The body as parsed: a slot route's JSON body, or a passthrough's when it is JSON.
    pub json: Option<Value>,
    /// The API of a slot route.
    pub dialect: Option<DialectRef>,
    /// What a slot route's body asks of llama-server.
    pub ask: Ask,
    /// Its prompts' exact token counts, once counted (see `cost`).
    pub prompt_counts: Option<Vec<u64>>,
    pub summary: RequestSummary,
    /// In front of llama-server's router, its model's pool once looked up (see
    /// [`Intake::model_pool`]).
    pool: OnceLock<Arc<Pool>>,
}

pub async fn read(
    req: Request<Incoming>,
    limits: &Limits,
    peer: Option<Peer>,
    handling: Handling,
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
    Intake::new(parts, body, handling, peer)
}

impl Intake {
    /// The checked request of `parts` with `body`: a slot route's JSON must parse as one object (it
    /// is what admission reads); any other body is forwarded as it came, parsed only when it is JSON.
    pub fn new(
        parts: request::Parts,
        body: Bytes,
        handling: Handling,
        peer: Option<Peer>,
    ) -> Result<Intake, GateError> {
        let dialect = match handling {
            Handling::Slot(d) => Some(d),
            _ => None,
        };
        let json = match dialect {
            Some(d) if d.json_body() => parse_body(&parts.method, &body)?,
            Some(_) => None,
            None => parse_body(&parts.method, &body).ok().flatten(),
        };
        let ask = match dialect {
            Some(d) => d.ask(json.as_ref().unwrap_or(&Value::Null)),
            None => Ask::default(),
        };
        let mut summary = summarize(&parts, json.as_ref(), &ask, peer);
        // Who is asking, decided here for every later phase and policy (`named` decides again
        // when slotgate names a tenant).
        summary.caller = Some(summary.name_caller());
        summary.dialect = dialect.map(|d| d.name().to_owned());
        summary.body_bytes = body.len() as u64;
        // Only a request that takes a slot waits for one: elsewhere the header means nothing.
        if dialect.is_some() {
            summary.deadline_ms = deadline_of(&parts.headers)?;
        }
        Ok(Intake {
            parts,
            body,
            json,
            dialect,
            ask,
            prompt_counts: None,
            summary,
            pool: Default::default(),
        })
    }
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
    ask: &Ask,
    peer: Option<Peer>,
) -> RequestSummary {
    let null = Value::Null;
    let j = json.unwrap_or(&null);
    let prompt_chars = ask.prompt_chars();
    let lineage = lineage::of(&parts.headers);
    let text = |id: &Option<Box<str>>| id.as_deref().map(str::to_owned);
    let mut headers: std::collections::BTreeMap<String, String> = SUMMARY_HEADERS
        .iter()
        .filter_map(|name| {
            Some((
                name.as_str().to_owned(),
                parts.headers.get(name)?.to_str().ok()?.to_owned(),
            ))
        })
        .collect();
    // The ids by their generic names, whichever header named them: what a policy of contract
    // 2.0.0 (no fields for them) reads.
    for (name, id) in [
        (lineage::SESSION[0], &lineage.session),
        (lineage::AGENT_HEADER, &lineage.agent),
        (lineage::PARENT_HEADER, &lineage.parent),
        (lineage::CONVERSATION.as_str(), &lineage.conversation),
    ] {
        if let Some(id) = id {
            headers.insert(name.to_owned(), id.to_string());
        }
    }
    RequestSummary {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        // The body's, else `?model=` (a GET to llama-server's router: `/props?model=`).
        model: j
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| query_model(parts.uri.query()?)),
        stream: ask.stream,
        max_tokens: ask.max_tokens,
        prompt_chars,
        prompt_tokens_estimate: ask.prompts.iter().map(|c| c.div_ceil(4)).sum(),
        // Counted by `cost` just after, for generation endpoints.
        prompt_tokens: None,
        reserved_tokens: None,
        priority_hint: j.get("priority").and_then(Value::as_i64),
        // Read from its header by `Intake::new` (a slot route's).
        deadline_ms: None,
        peer,
        api_key: api_key_hash(&parts.headers),
        headers,
        queue: Default::default(),
        // Set by `Intake::new`, which knows them.
        dialect: None,
        body_bytes: 0,
        session_id: text(&lineage.session),
        agent_id: text(&lineage.agent),
        parent_agent_id: text(&lineage.parent),
        conversation_id: text(&lineage.conversation),
        // Set by `Intake::named`, when slotgate names the caller.
        tenant: None,
        // Named by `Intake::new` and `Intake::named`.
        caller: None,
        team: None,
        key_id: None,
        key_labels: Default::default(),
        price: None,
    }
}

/// `sha256:<hex>` of the caller's key (read as llama-server reads it, see `caller`), so no policy,
/// log line or label ever holds the key itself. Credentials that could be read two ways were
/// refused before.
fn api_key_hash(headers: &http::HeaderMap) -> Option<String> {
    super::caller::credential(headers)
        .ok()
        .flatten()
        .map(|c| hash_key_bytes(c.key))
}

/// The client's own deadline, `X-Slotgate-Deadline-Ms`: milliseconds from arrival, a whole number
/// from 1. Anything else is a 400 `invalid_deadline` (a typo must not silently mean "no deadline").
fn deadline_of(headers: &http::HeaderMap) -> Result<Option<u64>, GateError> {
    millis_of(headers, &super::DEADLINE_HEADER)
}

/// The Gateway API Inference Extension's time-to-first-token objective, in milliseconds.
pub const SLO_TTFT_HEADER: HeaderName = HeaderName::from_static("x-slo-ttft-ms");

/// A header of milliseconds from arrival, a whole number from 1; anything else is a 400
/// `invalid_deadline` naming the header.
fn millis_of(headers: &http::HeaderMap, name: &HeaderName) -> Result<Option<u64>, GateError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    match text.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Some(ms)),
        _ => Err(GateError::InvalidDeadline(format!(
            "{name}: `{}` is not a deadline; give the milliseconds from now the answer is worth waiting for, a whole number from 1 (it is capped by the queue timeout)",
            String::from_utf8_lossy(value.as_bytes())
        ))),
    }
}

/// The `model` parameter of a query string, decoded.
fn query_model(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "model")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

/// The form in which policies see an API key: `sha256:` and 64 lower-case hex digits.
pub fn hash_api_key(key: &str) -> String {
    hash_key_bytes(key.as_bytes())
}

/// [`hash_api_key`] of a key's bytes (a header value need not be UTF-8).
pub fn hash_key_bytes(key: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key);
    format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

impl Intake {
    /// Named by slotgate (`--client-auth keys`): the tenant, team and key id go to the policies
    /// (as fields, and for contract 2.0.0 as the host's headers), a model outside the key's scope
    /// is refused, and the caller's key gives way to slotgate's own for llama-server, which never
    /// sees it.
    pub fn named(
        &mut self,
        named: &super::caller::Named,
        served: Option<&str>,
        upstream: &crate::upstream::Upstream,
    ) -> Result<(), GateError> {
        // A slot route uses a model whether or not it names one: the one llama-server serves.
        let model = match self.dialect {
            Some(_) => self.summary.model.as_deref().or(served),
            None => self.summary.model.as_deref(),
        };
        if let Some(m) = model.filter(|m| !named.allows_model(m)) {
            return Err(GateError::ModelNotAllowed(m.to_owned()));
        }
        let s = &mut self.summary;
        s.tenant = Some(named.tenant.to_string());
        s.team = named.team().map(str::to_owned);
        s.key_id = named.key_id().map(str::to_owned);
        s.caller = Some(s.name_caller());
        if let Some(key) = named.key.as_ref().filter(|k| !k.record.labels.is_empty()) {
            s.key_labels = key.record.labels.clone();
            s.headers.insert(
                slotgate_sdk::KEY_LABELS_HEADER.to_owned(),
                serde_json::to_string(&s.key_labels).unwrap_or_default(),
            );
        }
        let headers = [
            (slotgate_sdk::TENANT_NAMED_HEADER, s.tenant.clone()),
            (slotgate_sdk::TEAM_NAMED_HEADER, s.team.clone()),
            (slotgate_sdk::KEY_ID_HEADER, s.key_id.clone()),
        ];
        for (name, value) in headers {
            if let Some(v) = value {
                s.headers.insert(name.to_owned(), v);
            }
        }
        let h = &mut self.parts.headers;
        if !upstream.attach_key(h) {
            h.remove(header::AUTHORIZATION);
            h.remove(super::caller::X_API_KEY);
        }
        Ok(())
    }

    /// The client's hints, read by the operator's rules (docs/sessions.md): a body without a
    /// `priority` field hints by its `service_tier`, and with `slo_ttft` an `x-slo-ttft-ms` is a
    /// deadline (the shorter of it and `X-Slotgate-Deadline-Ms`).
    pub fn take_hints(&mut self, tiers: &TierPriorities, slo_ttft: bool) -> Result<(), GateError> {
        if self.dialect.is_none() {
            return Ok(());
        }
        // A typo must not silently mean "no keep-alive" (see `waiting`).
        super::waiting::asked(&self.parts.headers).map_err(GateError::InvalidHeader)?;
        if self.summary.priority_hint.is_none() {
            self.summary.priority_hint = self
                .json
                .as_ref()
                .and_then(|j| j.get("service_tier")?.as_str())
                .and_then(|tier| tiers.of(tier));
        }
        if slo_ttft {
            if let Some(ms) = millis_of(&self.parts.headers, &SLO_TTFT_HEADER)? {
                let d = &mut self.summary.deadline_ms;
                *d = Some(d.map_or(ms, |own| own.min(ms)));
            }
        }
        Ok(())
    }

    /// In front of llama-server's router, the pool of the model the request names (see
    /// `router::models`); `None` otherwise, or for a model it does not list (yet: the list may be
    /// read again before admission). Looked up once, then carried with the request.
    pub fn model_pool(&self, app: &App) -> Option<Arc<Pool>> {
        if let Some(pool) = self.pool.get() {
            return Some(pool.clone());
        }
        let pool = app.models.pool_for(self.summary.model.as_deref()?)?;
        Some(self.pool.get_or_init(|| pool).clone())
    }

    /// How long it may wait for a slot: its model's queue timeout in front of a router, else the
    /// gate's (`queue-timeout`). The one place that choice is made.
    pub fn queue_timeout(&self, app: &App) -> Duration {
        self.model_pool(app)
            .map_or(app.config.queue_timeout, |p| p.queue_timeout)
    }

    /// Applies a policy's request changes, each to its one field of the body.
    pub fn apply(&mut self, m: &Mutations) -> Result<(), GateError> {
        // Only a slot route's JSON body is changed. A GET's (empty, or anything) is forwarded as it
        // came: parsing it would turn a policy's changes into a 400 for every `GET /v1/models`.
        if m.cap_max_tokens.is_none() && !m.disable_prompt_cache && !m.strip_id_slot {
            return Ok(());
        }
        let (Some(dialect), Some(Value::Object(obj))) = (self.dialect, &self.json) else {
            return Ok(());
        };
        let output = dialect.output();
        if let Some(cap) = m.cap_max_tokens.filter(|_| !output.none) {
            // Cap every key present, whichever llama-server ends up reading: a value that is no
            // bound (negative) or not a number at all becomes the cap. Set the API's own key when
            // none is present.
            let mut present = false;
            let mut edits = Vec::new();
            for key in output.keys.iter().flat_map(|g| g.iter()) {
                let Some(v) = obj.get(*key).filter(|v| !v.is_null()) else {
                    continue;
                };
                present = true;
                let current = dialect::token_bound(v).flatten();
                let n = current.map_or(cap, |n| n.min(cap));
                // Within the cap already: its bytes stay.
                if current != Some(n) {
                    edits.push((*key, n));
                }
            }
            for (key, n) in edits {
                self.set_field(key, Value::from(n))?;
            }
            if !present {
                self.set_field(output.add, Value::from(cap))?;
            }
        }
        if m.disable_prompt_cache {
            self.set_field("cache_prompt", Value::Bool(false))?;
        }
        if m.strip_id_slot {
            self.remove_field("id_slot")?;
        }
        self.reread();
        Ok(())
    }

    /// Drops the parsed body while the request waits for a slot (its bytes stay, and are what is
    /// forwarded). Returns whether there was a tree to drop; [`Intake::unpark_tree`] parses it
    /// again.
    pub(super) fn park_tree(&mut self) -> bool {
        self.json.take().is_some()
    }

    /// The parsed body again, after [`Intake::park_tree`]: the same bytes parsed a moment ago, so
    /// this fails only if they were changed meanwhile (they are not).
    pub(super) fn unpark_tree(&mut self) -> Result<(), GateError> {
        self.json = parse_body(&self.parts.method, &self.body)?;
        Ok(())
    }

    /// The request names a conversation (`X-Conversation-Id`, not empty, as llama-server reads
    /// it): llama-server finishes its answer into a session the client can resume
    /// (`GET /v1/stream`), whatever its connection.
    pub fn names_conversation(&self) -> bool {
        self.conversation().is_some()
    }

    /// The conversation it names (`X-Conversation-Id`), if any.
    pub fn conversation(&self) -> Option<&str> {
        lineage::conversation(&self.parts.headers)
    }

    /// For a stream of an API that reports usage only when asked (chat), whose client did not ask
    /// for `stream_options.include_usage`: asks for it in the forwarded body, so the stream reports
    /// its usage. Returns whether it did (the client's stream must then lose the usage chunk again,
    /// see `stream_usage`).
    pub fn ask_for_stream_usage(&mut self) -> Result<bool, GateError> {
        let Some(dialect) = self.dialect else {
            return Ok(false);
        };
        if !self.ask.stream || !dialect.asks_for_stream_usage() {
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
        let edited = json_edit::set_nested(&self.body, "stream_options", "include_usage", "true");
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
        self.body = match edited {
            Some(b) => Bytes::from(b),
            None => self.reserialized()?,
        };
        Ok(true)
    }

    /// Sets top-level `key` in the body's bytes and in its parsed form alike.
    fn set_field(&mut self, key: &str, value: Value) -> Result<(), GateError> {
        let Some(Value::Object(obj)) = self.json.as_mut() else {
            return Ok(());
        };
        let edited = json_edit::set(&self.body, key, &value.to_string());
        obj.insert(key.to_owned(), value);
        self.body = match edited {
            Some(b) => Bytes::from(b),
            None => self.reserialized()?,
        };
        Ok(())
    }

    fn remove_field(&mut self, key: &str) -> Result<(), GateError> {
        let Some(Value::Object(obj)) = self.json.as_mut() else {
            return Ok(());
        };
        if obj.remove(key).is_none() {
            return Ok(());
        }
        self.body = match json_edit::remove(&self.body, key) {
            Some(b) => Bytes::from(b),
            None => self.reserialized()?,
        };
        Ok(())
    }

    /// The parsed body written out whole: only if the editor could not follow the client's bytes,
    /// which parsed as JSON a moment ago (logged: the key order is lost).
    fn reserialized(&self) -> Result<Bytes, GateError> {
        tracing::warn!(path = %self.summary.path, "request body re-serialised: its key order is not kept");
        serde_json::to_vec(&self.json)
            .map(Bytes::from)
            .map_err(|e| GateError::InvalidJson(e.to_string()))
    }

    /// After an edit: what the body now asks, and the summary's view of it.
    fn reread(&mut self) {
        if let (Some(d), Some(json)) = (self.dialect, &self.json) {
            self.ask = d.ask(json);
            self.summary.max_tokens = self.ask.max_tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;
    use serde_json::json;

    #[test]
    fn api_keys_are_hashed() {
        assert_eq!(
            hash_api_key("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut h = http::HeaderMap::new();
        h.insert("x-api-key", "anthropic-style".parse().unwrap());
        assert_eq!(api_key_hash(&h), Some(hash_api_key("anthropic-style")));
        h.insert(
            header::AUTHORIZATION,
            "Bearer anthropic-style".parse().unwrap(),
        );
        assert_eq!(api_key_hash(&h), Some(hash_api_key("anthropic-style")));
        h.remove("x-api-key");
        // As llama-server reads it: another scheme is part of the key.
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(api_key_hash(&h), Some(hash_api_key("Basic abc")));
        h.remove(header::AUTHORIZATION);
        assert_eq!(api_key_hash(&h), None);
    }

    fn intake(path: &str, body: &str) -> Intake {
        let (parts, ()) = Request::post(path).body(()).unwrap().into_parts();
        let handling = crate::pipeline::routes::find(&Method::POST, path).unwrap();
        Intake::new(parts, Bytes::from(body.to_owned()), handling, None).unwrap()
    }

    fn capped(path: &str, body: &str, cap: u64) -> (String, Option<u64>) {
        let mut i = intake(path, body);
        let m = Mutations {
            cap_max_tokens: Some(cap),
            ..Default::default()
        };
        i.apply(&m).unwrap();
        let sent = String::from_utf8(i.body.to_vec()).unwrap();
        let parsed: Value = serde_json::from_str(&sent).unwrap();
        assert_eq!(
            Some(&parsed),
            i.json.as_ref(),
            "bytes and parsed body agree"
        );
        (sent, i.summary.max_tokens)
    }

    #[test]
    fn cap_max_tokens_caps_every_key_present_in_place() {
        let chat = "/v1/chat/completions";
        assert_eq!(
            capped(
                chat,
                r#"{"z":1, "max_tokens": 1, "max_completion_tokens": 900, "n_predict": 500}"#,
                100
            ),
            (
                r#"{"z":1, "max_tokens": 1, "max_completion_tokens": 100, "n_predict": 100}"#
                    .into(),
                Some(100)
            )
        );
        // Within the cap: unchanged, and the summary stays the effective value.
        assert_eq!(
            capped(chat, r#"{"max_tokens": 500, "n_predict": 1}"#, 100),
            (r#"{"max_tokens": 100, "n_predict": 1}"#.into(), Some(1))
        );
        // No bound, or no number: the cap takes its place.
        assert_eq!(
            capped(chat, r#"{"max_tokens":5,"n_predict":-1}"#, 64),
            (r#"{"max_tokens":5,"n_predict":64}"#.into(), Some(64))
        );
        assert_eq!(
            capped(chat, r#"{"n_predict":"lots"}"#, 64),
            (r#"{"n_predict":64}"#.into(), Some(64))
        );
        // None present (null is none): the API's own name is added at the end.
        assert_eq!(
            capped(chat, r#"{"b":1,"a":2,"max_tokens":null}"#, 32),
            (r#"{"b":1,"a":2,"max_tokens":32}"#.into(), Some(32))
        );
        assert_eq!(
            capped("/completion", r#"{"prompt":"x"}"#, 32),
            (r#"{"prompt":"x","n_predict":32}"#.into(), Some(32))
        );
        assert_eq!(
            capped("/v1/responses", r#"{"input":"x"}"#, 32),
            (r#"{"input":"x","max_output_tokens":32}"#.into(), Some(32))
        );
        // Anthropic's required max_tokens; embeddings generate nothing to cap.
        assert_eq!(
            capped("/v1/messages", r#"{"max_tokens":4000,"messages":[]}"#, 32),
            (r#"{"max_tokens":32,"messages":[]}"#.into(), Some(32))
        );
        assert_eq!(
            capped("/v1/embeddings", r#"{"input":"x"}"#, 32),
            (r#"{"input":"x"}"#.into(), Some(0))
        );
    }

    #[test]
    fn stream_usage_is_asked_for_in_place() {
        let body =
            r#"{"stream":true,"tools":[{"function":{"parameters":{"z":1,"a":2}}}],"messages":[]}"#;
        let mut i = intake("/v1/chat/completions", body);
        assert!(i.ask_for_stream_usage().unwrap());
        assert_eq!(
            String::from_utf8(i.body.to_vec()).unwrap(),
            r#"{"stream":true,"tools":[{"function":{"parameters":{"z":1,"a":2}}}],"messages":[],"stream_options":{"include_usage":true}}"#
        );
        let mut i = intake(
            "/v1/chat/completions",
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
        );
        assert!(!i.ask_for_stream_usage().unwrap());
        // Other APIs report usage unasked.
        let mut i = intake(
            "/v1/messages",
            r#"{"stream":true,"max_tokens":1,"messages":[]}"#,
        );
        assert!(!i.ask_for_stream_usage().unwrap());
    }

    #[test]
    fn a_parked_tree_comes_back_as_it_was() {
        let body = r#"{"stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":9}"#;
        let mut i = intake("/v1/chat/completions", body);
        let before = i.json.clone();
        assert!(i.park_tree());
        assert!(i.json.is_none(), "a waiting request keeps no tree");
        assert!(!i.park_tree(), "nothing left to park");
        i.unpark_tree().unwrap();
        assert_eq!(i.json, before);
        // And what needs the tree works on it again.
        assert!(i.ask_for_stream_usage().unwrap());
    }

    #[test]
    fn mutations_leave_a_request_without_a_json_body_alone() {
        // Found by fuzzing: a GET with a policy's changes was refused as invalid JSON.
        let (parts, ()) = Request::get("/v1/models").body(()).unwrap().into_parts();
        let handling = crate::pipeline::routes::find(&Method::GET, "/v1/models").unwrap();
        let mut i = Intake::new(parts, Bytes::new(), handling, None).unwrap();
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
    fn a_passthrough_body_that_is_not_json_is_forwarded_as_it_came() {
        let (parts, ()) = Request::post("/tokenize").body(()).unwrap().into_parts();
        let handling = crate::pipeline::routes::find(&Method::POST, "/tokenize").unwrap();
        let i = Intake::new(parts, Bytes::from_static(b"not json"), handling, None).unwrap();
        assert!(i.json.is_none());
        let (parts, ()) = Request::post("/v1/chat/completions")
            .body(())
            .unwrap()
            .into_parts();
        let handling =
            crate::pipeline::routes::find(&Method::POST, "/v1/chat/completions").unwrap();
        let e = Intake::new(parts, Bytes::from_static(b"not json"), handling, None).err();
        assert!(matches!(e, Some(GateError::InvalidJson(_))));
    }

    #[test]
    fn a_get_names_its_model_in_the_query() {
        let model = |uri: &str, body: &'static [u8]| {
            let method = match body.is_empty() {
                true => Method::GET,
                false => Method::POST,
            };
            let (parts, ()) = Request::builder()
                .method(method.clone())
                .uri(uri)
                .body(())
                .unwrap()
                .into_parts();
            let path = parts.uri.path().to_owned();
            let handling = crate::pipeline::routes::find(&method, &path).unwrap();
            let i = Intake::new(parts, Bytes::from_static(body), handling, None).unwrap();
            i.summary.model
        };
        assert_eq!(model("/props?model=alpha", b""), Some("alpha".into()));
        assert_eq!(
            model("/props?autoload=false&model=a%2Fb+c", b""),
            Some("a/b c".into())
        );
        assert_eq!(model("/props?model=", b""), None);
        assert_eq!(model("/props", b""), None);
        // The body's name comes first.
        assert_eq!(
            model("/tokenize?model=q", br#"{"model":"b","content":"x"}"#),
            Some("b".into())
        );
    }

    #[test]
    fn summary_counts_prompt_text() {
        let req = Request::post("/v1/chat/completions")
            .header("user-agent", "t")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let body = json!({
            "model": "m", "stream": true, "max_tokens": 9, "priority": -2,
            "messages": [{"role":"user","content":"hello"},{"role":"user","content":[{"type":"text","text":"abc"}]}]
        });
        let ask = crate::dialect::CHAT.ask(&body);
        let s = summarize(
            &parts,
            Some(&body),
            &ask,
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
