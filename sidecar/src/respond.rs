//! Every response slotgate writes itself: OpenAI-shaped JSON errors with status and Retry-After.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

use crate::error::GateError;

/// The body type of every response slotgate sends: its own JSON, or a guarded upstream stream.
pub type Body = UnsyncBoxBody<Bytes, BodyError>;
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// `{"error":{"message","type","code"}}` with the error's status and, where useful, Retry-After.
pub fn error(e: &GateError) -> Response<Body> {
    let body = serde_json::json!({
        "error": { "message": e.to_string(), "type": e.error_type(), "code": e.code() }
    });
    let mut resp = json(e.status(), &body);
    if let Some(secs) = e.retry_after() {
        metrics::histogram!(crate::metrics::RETRY_AFTER_SECONDS, "code" => e.code())
            .record(secs as f64);
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

pub fn json(status: u16, value: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(full(value.to_string()));
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
