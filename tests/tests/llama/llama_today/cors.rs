//! CORS as llama-server does it, by its own settings: slotgate forwards preflights, learns the rule
//! from llama-server's answer to one of its own, and puts the same `Access-Control-Allow-Origin` on
//! the answers it writes itself (a 429 here) that llama-server puts on its own.

use http::Method;
use serde_json::json;
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
        // What llama-server puts on an answer to this origin, slotgate puts on its own refusal.
        let answer = direct
            .post_json_with_headers(
                CHAT,
                &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
                &[("origin", *origin)],
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let held = gate
            .hold_slot(&Req::from_json(json!({"messages": [{"role": "user", "content": "hold"}], "max_tokens": 1500, "ignore_eos": true})))
            .await;
        let refused = gate
            .client()
            .post_json_with_headers(CHAT, &json!({"messages": []}), &[("origin", *origin)])
            .await;
        assert_error(&refused, 429, "queue_full");
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
