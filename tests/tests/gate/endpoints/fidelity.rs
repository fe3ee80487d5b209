//! What reaches llama-server is the client's bytes, changed only where slotgate must, and then only
//! in the one field: a chat template prints tool schemas in key order, so a re-serialised body
//! (sorted keys) would change the prompt and the answer. llama-server's own answers, errors
//! included, reach the client unchanged.

use std::time::Duration;

use http::Method;
use slotgate_tests::fake_upstream::{Scripted, CHAT_COUNT};
use slotgate_tests::*;

/// A streamed chat with a tool whose schema keys are not in sorted order, spaced as a client might.
const TOOL_CHAT: &str = r#"{"model": "fake",  "stream":true, "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "required": ["zip"], "properties": {"zip": {"type": "string"}, "city": {"type": "string"}}}}}], "messages": [{"role": "user", "content": "weather?"}], "fake_chunks": 2, "temperature": 0.50}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_chat_reaches_llama_server_byte_for_byte_but_the_field_slotgate_adds() {
    let (up, gate) = Gate::new().slots(1).start_instant().await;
    let client = gate.client();
    let sse = client
        .connect()
        .await
        .unwrap()
        .send_streaming(raw_post(CHAT, TOOL_CHAT))
        .await
        .unwrap()
        .read_sse(Duration::from_secs(5))
        .await;
    assert!(sse.complete(), "{sse:?}");
    // The same body, sent whole (no usage asked for): unchanged entirely.
    let whole = TOOL_CHAT.replace(r#""stream":true"#, r#""stream":false"#);
    let resp = client
        .send_with(Method::POST, CHAT, &[], whole.clone())
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);

    let seen = up.requests_seen();
    let added = r#","stream_options":{"include_usage":true}"#;
    let at = TOOL_CHAT.rfind('}').unwrap();
    let want = format!("{}{added}{}", &TOOL_CHAT[..at], &TOOL_CHAT[at..]);
    assert_eq!(std::str::from_utf8(&seen[0].raw).unwrap(), want);
    assert_eq!(std::str::from_utf8(&seen[1].raw).unwrap(), whole);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_cap_and_the_count_keep_the_clients_bytes() {
    let guard = wat::built("request-guard");
    let (up, gate) = Gate::new()
        .slots(1)
        .policies(&[(&guard, Some("{ max_tokens = 16 }"))])
        .start_instant()
        .await;
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"function":{"parameters":{"z":1,"a":2}}}],"max_tokens":500, "n_predict" : 9}"#;
    let held = gate
        .hold_slot(&Req::chat("holder").delay(Duration::from_millis(300)))
        .await;
    // Waits, so it is counted: the count endpoint gets the client's own bytes (after the cap).
    let resp = gate.client().send_with(Method::POST, CHAT, &[], body).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    held.await.unwrap();
    let sent = up
        .requests_seen()
        .into_iter()
        .find(|r| r.tag.is_none())
        .expect("the request reached the fake");
    assert_eq!(
        std::str::from_utf8(&sent.raw).unwrap(),
        r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"function":{"parameters":{"z":1,"a":2}}}],"max_tokens":16, "n_predict" : 9}"#,
        "only the value over the cap changed"
    );
    assert!(up.internal_seen().iter().any(|p| p == CHAT_COUNT));
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_servers_own_errors_reach_the_client_unchanged() {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::errors([
            Scripted::BadRequest,
            Scripted::ServerError,
            Scripted::Busy,
        ]))
        .await;
    for (want, tag) in [(400, "bad"), (500, "broken"), (503, "busy")] {
        let resp = gate.client().post_chat(&Req::chat(tag)).await;
        assert_eq!(resp.status, want, "{}", resp.body);
        let v = resp.json();
        assert_eq!(v["fake_tag"], tag, "the fake's own body: {v}");
        assert_eq!(v["error"]["code"], want, "{v}");
        assert_eq!(
            resp.header("content-type").as_deref(),
            Some("application/json; charset=utf-8"),
            "the fake's own headers"
        );
    }
    gate.assert_settled(&up, 1).await;
}

/// A request with exactly these bytes (and a JSON content type).
fn raw_post(path: &str, body: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_owned(),
        )))
        .unwrap()
}
