//! Requests llama-server runs on several slots at once: `n` completions (it launches them together,
//! deferring the request while fewer slots are free) and a batch of embedding inputs (a task per
//! input). Behind slotgate neither ever waits in llama-server's own queue
//! (`llamacpp:requests_deferred` stays 0), and each is charged for all its tasks.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use slotgate_tests::llama::{chat, server_argv, LlamaServer, PROMPT};
use slotgate_tests::*;

use super::{assert_both_idle, gate_before, learned, serial, watch_deferred};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_completions_wait_beside_a_running_stream_instead_of_being_deferred() {
    let _one = serial().await;
    let llama = LlamaServer::start(2).await;
    let long = llama.tokens_for(Duration::from_secs(2), (64, 2000)).await;
    let (gate, _) = gate_before(&llama, Gate::new().queue_timeout("120s")).await;
    learned(&gate).await;
    let (deferred, watching) = watch_deferred(llama.socket());

    let stream = tokio::spawn({
        let client = gate.client();
        let body = chat(PROMPT, long, true);
        async move {
            client
                .stream(CHAT, &body)
                .await
                .read_sse(Duration::from_secs(60))
                .await
        }
    });
    gate.wait_busy(1).await;
    let mut pair = chat(PROMPT, 8, false);
    pair["n"] = 2.into();
    let answer = spawn_post(&gate.client(), CHAT, &Req::from_json(pair));
    // One slot is free; the pair needs both.
    let s = gate.wait_queue_depth(1).await;
    assert_eq!(s["slots"]["busy"], 1, "{s}");
    let sse = stream.await.unwrap();
    assert!(sse.complete(), "{sse:?}");
    let (resp, _) = answer.await.unwrap();
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v = resp.json();
    assert_eq!(
        v["choices"].as_array().map(Vec::len),
        Some(2),
        "two completions: {v}"
    );
    watching.abort();
    assert_eq!(
        deferred.load(Ordering::Relaxed),
        0,
        "llama-server deferred a request"
    );
    // More than the server runs: refused before it is queued, with the reason.
    let mut many = chat(PROMPT, 8, false);
    many["n"] = 3.into();
    let resp = gate.client().post_json(CHAT, &many).await;
    assert_error(&resp, 400, "too_many_completions");
    assert_both_idle(&gate, &llama).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedding_batches_hold_a_slot_per_input_and_are_charged_for_every_input() {
    let _one = serial().await;
    let mut argv = server_argv(2);
    argv.extend(["--embeddings", "--pooling", "mean"].map(String::from));
    let llama = LlamaServer::start_argv(argv).await;
    let (gate, _) = gate_before(&llama, Gate::new().queue_depth(16).queue_timeout("120s")).await;
    learned(&gate).await;
    let (deferred, watching) = watch_deferred(llama.socket());

    // As many inputs as slots: each batch holds both, so llama-server never defers one.
    let inputs = |i: usize| json!({"input": [format!("first input of batch {i}"), "a second, longer input of the same batch"]});
    // Direct, the usage llama-server reports for each batch: all three inputs.
    let mut expected = 0;
    for i in 0..6 {
        let direct = Client::unix(llama.socket())
            .post_json("/v1/embeddings", &inputs(i))
            .await;
        assert_eq!(direct.status, 200, "{}", direct.body);
        expected += direct.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    }

    // Six batches at once on two slots: each holds both slots in turn.
    let calls: Vec<_> = (0..6)
        .map(|i| spawn_post(&gate.client(), "/v1/embeddings", &Req::from_json(inputs(i))))
        .collect();
    let mut prompt_tokens = 0;
    for (resp, _) in join_all(calls).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
        let v = resp.json();
        assert_eq!(v["data"].as_array().map(Vec::len), Some(2), "{v}");
        prompt_tokens += v["usage"]["prompt_tokens"].as_u64().unwrap();
    }
    watching.abort();
    assert_eq!(
        deferred.load(Ordering::Relaxed),
        0,
        "llama-server deferred an input"
    );
    assert_eq!(prompt_tokens, expected);
    let m = gate.metrics().await;
    let charged: f64 = m.sum("slotgate_tenant_tokens_total", &[]);
    assert_eq!(
        charged, prompt_tokens as f64,
        "charged every input's tokens: {}",
        m.text
    );
    // More inputs than slots: it holds them all (llama-server runs the rest as they free up), and
    // is charged for every input.
    let three = json!({"input": ["one", "two two", "three three three"]});
    let theirs = Client::unix(llama.socket())
        .post_json("/v1/embeddings", &three)
        .await;
    let ours = gate.client().post_json("/v1/embeddings", &three).await;
    assert_eq!(ours.status, 200, "{}", ours.body);
    assert_eq!(ours.json()["usage"], theirs.json()["usage"]);
    let more = theirs.json()["usage"]["prompt_tokens"].as_f64().unwrap();
    gate.wait_tokens("prompt", prompt_tokens as f64 + more)
        .await;
    assert_both_idle(&gate, &llama).await;
}
