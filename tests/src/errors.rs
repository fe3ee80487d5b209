//! The OpenAI error shape: `{"error":{"message":"...","type":"...","code":"..."}}`, checked strictly.

use crate::client::Response;
use http::StatusCode;

/// Parses a slotgate error body and returns `(type, code)`; panics if the shape is wrong.
pub fn parse_error(body: &str) -> (String, String) {
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {body:?}"));
    let err = v
        .get("error")
        .and_then(|e| e.as_object())
        .unwrap_or_else(|| panic!("error body lacks an `error` object: {body}"));
    let field = |name: &str| {
        err.get(name)
            .and_then(|f| f.as_str())
            .unwrap_or_else(|| panic!("error.{name} is missing or not a string: {body}"))
            .to_owned()
    };
    let message = field("message");
    assert!(!message.is_empty(), "error.message is empty: {body}");
    (field("type"), field("code"))
}

/// Asserts `resp` is a slotgate error with `status`, JSON content type, the OpenAI shape and `code`.
/// Returns the error `type`.
pub fn assert_error(resp: &Response, status: u16, code: &str) -> String {
    assert_eq!(
        resp.status,
        StatusCode::from_u16(status).unwrap(),
        "expected {status} {code}, got {} with body {}",
        resp.status,
        resp.body
    );
    let ct = resp.header("content-type").unwrap_or_default();
    assert!(
        ct.starts_with("application/json"),
        "{status} {code}: content-type is {ct:?}, body {}",
        resp.body
    );
    let (ty, got) = parse_error(&resp.body);
    assert_eq!(got, code, "wrong error code in {}", resp.body);
    ty
}

/// [`assert_error`], and the error's body says `text` (in its message). Returns the error `type`.
pub fn assert_error_says(resp: &Response, status: u16, code: &str, text: &str) -> String {
    let ty = assert_error(resp, status, code);
    assert!(
        resp.body.contains(text),
        "{status} {code} does not say {text:?}: {}",
        resp.body
    );
    ty
}

/// The `Retry-After` header as whole seconds; panics if it is absent, not an integer, or zero.
pub fn retry_after(resp: &Response) -> u64 {
    let raw = resp
        .header("retry-after")
        .unwrap_or_else(|| panic!("{} lacks Retry-After: {}", resp.status, resp.body));
    let secs: u64 = raw
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is not an integer: {raw:?}"));
    assert!(secs >= 1, "Retry-After must be >= 1, got {secs}");
    secs
}

/// Asserts `resp` is the refusal of a prompt that cannot fit a slot, in llama-server's own shape
/// (`exceed_context_size_error`, with `n_prompt_tokens` and `n_ctx`), whoever refused it.
/// `prompt`: the tokens it must name, when the test knows them.
pub fn assert_context_refusal(resp: &Response, prompt: Option<u64>, n_ctx: u64) {
    assert_eq!(resp.status, StatusCode::BAD_REQUEST, "{}", resp.body);
    let v: serde_json::Value = serde_json::from_str(&resp.body)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {}", resp.body));
    let e = &v["error"];
    assert_eq!(e["type"], "exceed_context_size_error", "{}", resp.body);
    assert_eq!(e["code"], 400, "{}", resp.body);
    assert_eq!(e["n_ctx"], n_ctx, "{}", resp.body);
    let n = e["n_prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no n_prompt_tokens: {}", resp.body));
    assert!(n >= n_ctx, "{}", resp.body);
    if let Some(p) = prompt {
        assert_eq!(n, p, "{}", resp.body);
    }
    let message = e["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("({n} tokens)"))
            && message.contains(&format!("({n_ctx} tokens)")),
        "{}",
        resp.body
    );
}
