//! Who is asking, on the real llama-server with `--api-key` (docs/security.md#who-is-asking): the
//! key slotgate charges is the one llama-server checks. With the key's quota spent, neither
//! credential trick that once got it served (a bare `Authorization` key beside a made-up
//! `X-Api-Key`; a made-up bearer named in `Connection` beside the real `X-Api-Key`) reaches
//! llama-server: both are 400 before anything is charged. A caller llama-server refuses gets its
//! 401 from slotgate before any count made with slotgate's key.

use std::path::PathBuf;

use http::Method;
use serde_json::json;
use slotgate_tests::llama::{chat, serial, server_argv, LlamaServer, RunningLlama};
use slotgate_tests::*;

const KEY: &str = "sk-llama-callers-key-7d1e";

fn key_file() -> PathBuf {
    let file = unique_dir("key").join("llama.key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    file
}

async fn llama_with_key() -> RunningLlama {
    let mut argv = server_argv(2);
    argv.extend(["--api-key".to_owned(), KEY.to_owned()]);
    LlamaServer::start_argv(argv).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_key_cannot_escape_its_quota_behind_a_second_credential() {
    let _one = serial().await;
    let llama = llama_with_key().await;
    let gate = Gate::new()
        .opt("--upstream-api-key-file", key_file().display())
        .policies(&[(
            &wat::built("quota"),
            Some("{ period = \"day\", requests = 2, tokens = 1000000 }"),
        )])
        .start_before(&llama)
        .await;
    let client = gate.client();
    let body = chat("hello", 4, false).to_string();
    let bearer = format!("Bearer {KEY}");
    for _ in 0..2 {
        let r = client
            .send_with(
                Method::POST,
                CHAT,
                &[("authorization", &bearer)],
                body.clone(),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // Spent, in every spelling llama-server takes the key in.
    for headers in [
        &[("authorization", bearer.as_str())][..],
        &[("authorization", KEY)],
        &[("x-api-key", KEY)],
    ] {
        let r = client
            .send_with(Method::POST, CHAT, headers, body.clone())
            .await;
        assert_eq!(r.status, 429, "{headers:?}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "quota_exceeded", "{}", r.body);
    }
    let tricks: [&[(&str, &str)]; 2] = [
        &[("authorization", KEY), ("x-api-key", "sk-made-up-4711")],
        &[
            ("authorization", "Bearer sk-made-up-4712"),
            ("connection", "authorization"),
            ("x-api-key", KEY),
        ],
    ];
    for headers in tricks {
        let r = client
            .send_with(Method::POST, CHAT, headers, body.clone())
            .await;
        assert_eq!(r.status, 400, "{headers:?}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "ambiguous_credentials");
    }
    let usage = gate.admin_get("/usage").await.json();
    assert_eq!(
        usage["total"]["requests"], 2,
        "only the two served: {usage}"
    );
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_llama_server_refuses_is_not_counted_with_slotgates_key() {
    let _one = serial().await;
    let llama = llama_with_key().await;
    let gate = Gate::new()
        .opt("--upstream-api-key-file", key_file().display())
        .start_before(&llama)
        .await;
    let client = gate.client();
    // A prompt far past the context: counted with slotgate's key, it would be a 400 naming its size.
    let long = "word ".repeat(3000);
    let body = chat(&long, 4, false).to_string();
    let direct_client = Client::unix(llama.socket());
    for headers in [&[][..], &[("authorization", "Bearer sk-nobody-knows")]] {
        let r = client
            .send_with(Method::POST, CHAT, headers, body.clone())
            .await;
        let direct = direct_client
            .send_with(Method::POST, CHAT, headers, body.clone())
            .await;
        assert_eq!(r.status, 401, "{headers:?}: {}", r.body);
        assert_eq!(r.json(), direct.json(), "what llama-server itself answers");
        assert_eq!(
            r.json(),
            json!({"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})
        );
        assert!(
            r.header("x-slotgate-prompt-tokens").is_none(),
            "{:?}",
            r.headers
        );
        assert!(!r.body.contains("n_prompt_tokens"), "{}", r.body);
    }
    let usage = gate.admin_get("/usage").await.json();
    assert_eq!(usage["rows"], json!([]), "nothing booked: {usage}");
    gate.assert_idle().await;
}
