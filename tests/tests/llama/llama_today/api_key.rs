//! llama-server run with `--api-key`: slotgate's own calls (`/props`, the counts, `/slots`,
//! `/metrics`) carry the key of `--upstream-api-key-file`, so the slot count, exact counts and the
//! scrape work; `slotgate wrap` takes it from the command line. Without it, the 401 is logged once
//! with what to set, and shown in `/status`. Clients' own keys reach llama-server unchanged.

use std::time::Duration;

use serde_json::json;
use slotgate_tests::llama::{chat, chat_usage, server_argv, LlamaServer, PROMPT};
use slotgate_tests::*;

use super::{assert_both_idle, gate_before, serial};

const KEY: &str = "sk-llama-secret";

fn with_key() -> Vec<String> {
    let mut argv = server_argv(2);
    argv.extend(["--api-key".to_owned(), KEY.to_owned()]);
    argv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slotgate_calls_a_server_that_wants_a_key_with_the_key_it_was_given() {
    let _one = serial().await;
    let llama = LlamaServer::start_argv(with_key()).await;
    let dir = unique_dir("key");
    let file = dir.join("llama.key");
    std::fs::write(&file, format!("# llama-server's key\n{KEY}\n")).unwrap();
    let (gate, _) = gate_before(
        &llama,
        Gate::new().opt("--upstream-api-key-file", file.display()),
    )
    .await;
    // /props read with the key: the slot count learnt.
    let s = gate
        .wait_status(Duration::from_secs(10), "slots learnt", |s| {
            s["slots"]["total"] == 2
        })
        .await;
    assert_eq!(s["upstream"]["auth"]["refused"], false, "{s}");
    assert_eq!(s["upstream"]["auth"]["api_key"], "set", "{s}");

    let bearer = format!("Bearer {KEY}");
    let hold = chat(PROMPT, 1500, false);
    let holders: Vec<_> = (0..2)
        .map(|_| {
            spawn_post(
                &gate.client(),
                CHAT,
                &Req::from_json(hold.clone()).header("authorization", &bearer),
            )
        })
        .collect();
    gate.wait_busy(2).await;
    // Behind both slots it waits and is counted exactly (the count endpoint took the key).
    let resp = gate
        .client()
        .post_json_with_headers(CHAT, &chat(PROMPT, 4, false), &[("x-api-key", KEY)])
        .await;
    let usage = chat_usage(&resp, 4);
    assert_eq!(
        resp.header("x-slotgate-prompt-tokens")
            .and_then(|v| v.parse().ok()),
        Some(usage.prompt)
    );
    for (r, _) in join_all(holders).await {
        chat_usage(&r, 1500);
    }
    // The scrape carries llama-server's own series.
    let text = gate.metrics_text().await;
    assert!(text.contains("llamacpp:requests_processing"), "{text}");
    // A client's wrong key: llama-server's own 401, counted as its refusal.
    let wrong = gate
        .client()
        .post_json_with_headers(
            CHAT,
            &chat(PROMPT, 4, false),
            &[("authorization", "Bearer nope")],
        )
        .await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(wrong.json()["error"]["message"], "Invalid API Key");
    gate.wait_outcome("upstream_4xx", 1).await;
    // The load a router polls (`/v1/loads`, slotgate's own route): llama-server's 401 without the
    // key or with a wrong one, though slotgate holds the key itself; the report with it.
    for creds in [vec![], vec![("authorization", "Bearer nope")]] {
        let refused = gate.client().get_with("/v1/loads", &creds).await;
        assert_eq!(refused.status, 401, "{creds:?}: {}", refused.body);
        assert_eq!(refused.json()["error"]["message"], "Invalid API Key");
    }
    let polled = gate
        .client()
        .get_with("/v1/loads", &[("authorization", &bearer)])
        .await;
    assert_eq!(polled.status, 200, "{}", polled.body);
    assert_eq!(
        polled.json()["loads"][0]["max_running_requests"],
        2,
        "{}",
        polled.body
    );
    assert_both_idle(&gate, &llama).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_key_slotgate_says_what_to_set_and_wrap_finds_it_itself() {
    let _one = serial().await;
    let llama = LlamaServer::start_argv(with_key()).await;
    let (gate, _) = gate_before(&llama, Gate::new()).await;
    let s = gate
        .wait_status(Duration::from_secs(10), "the 401 noticed", |s| {
            s["upstream"]["auth"]["refused"] == true
        })
        .await;
    assert!(
        s["upstream"]["auth"]["hint"]
            .as_str()
            .unwrap()
            .contains("--upstream-api-key-file"),
        "{s}"
    );
    assert_eq!(s["slots"]["total"], 1, "the slot count cannot be read: {s}");
    let log = gate.stderr_text();
    assert_eq!(
        log.matches("llama-server answered 401 to slotgate's own request")
            .count(),
        1,
        "logged once: {log}"
    );
    // Clients with the key are still served.
    let ok = gate
        .client()
        .post_json_with_headers(
            CHAT,
            &chat(PROMPT, 2, false),
            &[("authorization", &format!("Bearer {KEY}"))],
        )
        .await;
    chat_usage(&ok, 2);
    drop(gate);
    drop(llama);

    // Wrapped, slotgate reads the key from the command line.
    let gate = Gate::new().wrapping(with_key()).start().await;
    let s = gate
        .wait_status(Duration::from_secs(30), "slots learnt", |s| {
            s["slots"]["total"] == 2
        })
        .await;
    assert_eq!(s["upstream"]["auth"]["api_key"], "set", "{s}");
    let ok = gate
        .client()
        .post_json_with_headers(
            CHAT,
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
            &[("x-api-key", KEY)],
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    gate.assert_idle().await;
}
