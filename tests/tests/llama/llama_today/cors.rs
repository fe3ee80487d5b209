//! CORS as llama-server does it, by its own settings: slotgate forwards preflights, learns the rule
//! from llama-server's answer to one of its own, and puts the same `Access-Control-Allow-Origin` on
//! the answers it writes itself (a 429 here) that llama-server puts on its own.

use std::time::Duration;

use http::Method;
use serde_json::json;
use slotgate_tests::client::{raw_post, raw_status};
use slotgate_tests::llama::{server_argv, LlamaServer};
use slotgate_tests::*;

use super::{assert_both_idle, gate_before, learned, serial};

/// llama-server with `cors` arguments (none: its defaults), and slotgate before it with one slot
/// and no queue, so a second request is slotgate's own 429.
async fn check(cors: &[&str], origins: &[&str]) {
    let mut argv = server_argv(1);
    argv.extend(cors.iter().map(|a| (*a).to_owned()));
    let llama = LlamaServer::start_argv(argv).await;
    let (gate, _) = gate_before(&llama, Gate::one_slot(0)).await;
    learned(&gate).await;
    let direct = Client::unix(llama.socket());
    for origin in origins {
        let headers = [
            ("origin", *origin),
            ("access-control-request-method", "POST"),
        ];
        let ours = gate
            .client()
            .send_with(Method::OPTIONS, CHAT, &headers, "")
            .await;
        let theirs = direct.send_with(Method::OPTIONS, CHAT, &headers, "").await;
        assert_eq!(ours.status, theirs.status, "{cors:?} {origin}");
        for name in [
            "access-control-allow-origin",
            "access-control-allow-credentials",
            "access-control-allow-methods",
            "access-control-allow-headers",
        ] {
            assert_eq!(
                ours.header(name),
                theirs.header(name),
                "{cors:?} {origin}: {name}"
            );
        }
        // Byte for byte on the wire, header names' case included: a client that reads headers
        // into a plain map (llama.cpp's own test suite) finds them where it would direct.
        let raw = format!(
            "OPTIONS {CHAT} HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\n\
             Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n"
        );
        let wait = Duration::from_secs(5);
        let (ours, _) = gate
            .client()
            .raw_exchange(raw.as_bytes(), wait)
            .await
            .unwrap();
        let (theirs, _) = direct.raw_exchange(raw.as_bytes(), wait).await.unwrap();
        assert_eq!(cors_lines(&ours), cors_lines(&theirs), "{cors:?} {origin}");
        // What llama-server puts on an answer to this origin, slotgate puts on its own refusal.
        let answer = direct
            .post_json_with_headers(
                CHAT,
                &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
                &[("origin", *origin)],
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let llama_head = direct
            .raw_exchange(
                &raw_post(
                    CHAT,
                    r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#,
                    &[&format!("Origin: {origin}"), "Connection: close"],
                ),
                Duration::from_secs(30),
            )
            .await
            .unwrap()
            .0;
        let held = gate
            .hold_slot(&Req::from_json(json!({"messages": [{"role": "user", "content": "hold"}], "max_tokens": 1500, "ignore_eos": true})))
            .await;
        let refused = gate
            .client()
            .post_json_with_headers(CHAT, &json!({"messages": []}), &[("origin", *origin)])
            .await;
        assert_error(&refused, 429, "queue_full");
        let raw = raw_post(
            CHAT,
            r#"{"messages":[]}"#,
            &[&format!("Origin: {origin}"), "Connection: close"],
        );
        let (refused_raw, _) = gate.client().raw_exchange(&raw, wait).await.unwrap();
        assert_eq!(raw_status(&refused_raw), Some(429));
        let (_, head) = cors_lines(&refused_raw);
        assert_eq!(head, cors_lines(&llama_head).1, "{cors:?} {origin}");
        assert_eq!(
            refused.header("access-control-allow-origin"),
            answer.header("access-control-allow-origin"),
            "{cors:?} {origin}: {}",
            refused.body
        );
        held.await.unwrap();
    }
    assert_both_idle(&gate, &llama).await;
}

/// The status and the `Access-Control-*` lines of a raw answer's head, as they are on the wire.
fn cors_lines(raw: &[u8]) -> (Option<u16>, Vec<String>) {
    let text = String::from_utf8_lossy(raw);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let lines = head
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("access-control-"))
        .map(str::to_owned)
        .collect();
    (raw_status(raw), lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slotgates_own_answers_carry_the_cors_headers_llama_server_would_send() {
    let _one = serial().await;
    // Its default: any origin echoed, with credentials.
    check(&[], &["http://app.example"]).await;
    // Only localhost origins.
    check(
        &["--cors-origins", "localhost"],
        &["http://app.example", "http://localhost:5173"],
    )
    .await;
    // One origin, whatever the request's.
    check(
        &[
            "--cors-origins",
            "https://ui.example",
            "--no-cors-credentials",
        ],
        &["http://app.example"],
    )
    .await;
}
