//! Every response slotgate writes itself: JSON errors in the shape of the API the client speaks
//! (OpenAI's, Anthropic's on `/v1/messages`, llama-server's own for a prompt that cannot fit), with
//! status, Retry-After and retry-after-ms.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

use crate::dialect::{self, DialectRef};
use crate::error::GateError;

/// The body type of every response slotgate sends: its own JSON, or a guarded upstream stream.
pub type Body = UnsyncBoxBody<Bytes, BodyError>;
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// Milliseconds to wait, beside every `Retry-After`: sub-second where the estimate has it.
pub const RETRY_AFTER_MS: header::HeaderName = header::HeaderName::from_static("retry-after-ms");

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The error in `dialect`'s shape (OpenAI's `{"error":{"message","type","code"}}` when none),
/// with its status and, where useful, Retry-After.
pub fn error(e: &GateError, dialect: Option<DialectRef>) -> Response<Body> {
    let body = match (e, dialect) {
        // As llama-server itself refuses it, on every API.
        (GateError::ContextTooLong { prompt, n_ctx }, _) => serde_json::json!({
            "error": {
                "code": 400,
                "message": e.to_string(),
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": n_ctx,
            }
        })
        .to_string()
        .into_bytes(),
        // Refusals llama-server (its router) would make itself, in its words and shape, on every
        // API.
        (
            GateError::ModelNotLoaded
            | GateError::InvalidApiKey
            | GateError::Stopped { .. }
            | GateError::StreamPending { .. },
            _,
        ) => serde_json::json!({
            "error": {"code": e.status(), "message": e.to_string(), "type": e.error_type()}
        })
        .to_string()
        .into_bytes(),
        (_, Some(d)) => d.error_body(e),
        (_, None) => dialect::openai_error(e),
    };
    let mut resp = json_bytes(status(e, dialect), body);
    if let Some(secs) = e.retry_after() {
        crate::metrics::retry_after(e.code()).record(secs as f64);
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    // The OpenAI SDKs read this before Retry-After, and so wait the estimate, not its round-up.
    if let Some(ms) = e.retry_after_ms() {
        resp.headers_mut()
            .insert(RETRY_AFTER_MS, HeaderValue::from(ms));
    }
    if let GateError::PolicyDenied { detail, .. } = e {
        for (name, value) in &detail.headers {
            if let (Ok(n), Ok(v)) = (
                header::HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                resp.headers_mut().insert(n, v);
            }
        }
    }
    resp
}

/// The answer of a request whose task (its phases, run apart) panicked.
pub fn task_failed(dialect: Option<DialectRef>) -> Response<Body> {
    error(
        &GateError::Upstream("the request's task failed".into()),
        dialect,
    )
}

/// The status slotgate answers `e` with on `dialect`'s API (Anthropic's overload is 529).
pub fn status(e: &GateError, dialect: Option<DialectRef>) -> u16 {
    dialect.map_or(e.status(), |d| d.error_status(e))
}

/// The error event that ends a stream slotgate cuts short (a shed request's): the error in the
/// dialect's shape, as llama-server sends its own mid-stream errors: Anthropic's `event: error`,
/// else a `data:` line with `{"error": ...}` (what the OpenAI SDKs raise as `APIError`).
pub fn error_event(e: &GateError, dialect: Option<DialectRef>) -> Bytes {
    let body = match dialect {
        Some(d) => d.error_body(e),
        None => dialect::openai_error(e),
    };
    error_event_of(&body, status(e, dialect), e.retry_after_ms(), dialect)
}

/// The error event of an error answer already written (`body`, with `status`): slotgate's own
/// refusal or llama-server's error, for a stream whose status line is gone. A body that is not a
/// JSON error is carried as one's message. When to retry travels in the event
/// (`error.retry_after_ms`).
pub fn error_event_of(
    body: &[u8],
    status: u16,
    retry_after_ms: Option<u64>,
    dialect: Option<DialectRef>,
) -> Bytes {
    let parsed = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .filter(|v| v.get("error").is_some_and(|e| e.is_object()));
    // An error as it was written keeps its bytes (and key order) unless it gains a field.
    let body = match (parsed, retry_after_ms) {
        (Some(_), None) => String::from_utf8_lossy(body).into_owned(),
        (parsed, ms) => {
            let mut v = parsed.unwrap_or_else(|| {
                serde_json::json!({"error": {
                    "code": status,
                    "message": String::from_utf8_lossy(body).trim(),
                    "type": "server_error",
                }})
            });
            if let (Some(ms), Some(err)) = (ms, v.get_mut("error").and_then(|e| e.as_object_mut()))
            {
                err.insert("retry_after_ms".into(), ms.into());
            }
            v.to_string()
        }
    };
    let mut out = Vec::with_capacity(body.len() + 24);
    if dialect.is_some_and(|d| d.name() == "messages") {
        out.extend_from_slice(b"event: error\n");
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(body.as_bytes());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// JSON with the content type llama-server writes (`application/json; charset=utf-8`), for an
/// answer slotgate gives in its name (`/health`).
pub fn llama_json(status: u16, value: &serde_json::Value) -> Response<Body> {
    let mut resp = json(status, value);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    resp
}

/// llama-server's own 503 while it loads its model (or slotgate drains).
pub fn loading() -> Response<Body> {
    llama_json(
        503,
        &serde_json::json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}),
    )
}

pub fn json(status: u16, value: &serde_json::Value) -> Response<Body> {
    json_bytes(status, value.to_string().into_bytes())
}

/// A JSON answer of text already made.
pub fn json_bytes(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub fn text(status: u16, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn headers(e: &GateError) -> (Option<String>, Option<String>) {
        let resp = error(e, None);
        let get = |name: &str| {
            resp.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        (get("retry-after"), get("retry-after-ms"))
    }

    #[test]
    fn retry_after_ms_keeps_the_estimate_and_retry_after_rounds_it_up() {
        let queue = |ms: u64| GateError::QueueFull {
            depth: 2,
            retry_after: Duration::from_millis(ms),
        };
        for (estimate_ms, secs, ms) in [
            (2_340, "3", "2340"),
            (3_000, "3", "3000"),
            (250, "1", "250"),
            (0, "1", "1"),
        ] {
            assert_eq!(
                headers(&queue(estimate_ms)),
                (Some(secs.into()), Some(ms.into())),
                "estimate {estimate_ms} ms"
            );
        }
        // Sub-millisecond remainders round up, never below the estimate.
        let e = GateError::Displaced {
            retry_after: Duration::from_micros(1_200_001),
        };
        assert_eq!(headers(&e), (Some("2".into()), Some("1201".into())));
        assert!(e.to_string().ends_with("retry after 2s"), "{e}");
    }

    #[test]
    fn whole_second_errors_send_the_same_wait_in_both_headers() {
        let e = GateError::ShuttingDown { retry_after: 30 };
        assert_eq!(headers(&e), (Some("30".into()), Some("30000".into())));
        let e = GateError::PolicyDenied {
            policy: "p".into(),
            status: 429,
            message: "later".into(),
            retry_after: Some(0),
            detail: Box::default(),
        };
        assert_eq!(headers(&e), (Some("1".into()), Some("1000".into())));
        let e = GateError::InvalidJson("x".into());
        assert_eq!(headers(&e), (None, None));
    }
}
