//! Upstream connection reuse, proved on the real llama-server (`-np 2`, the tiny model). Whole
//! (non-streamed) generation answers reuse idle upstream connections; streams get one each. What
//! makes reuse safe is llama-server's own behaviour (cpp-httplib): it keeps a connection alive 5 s
//! after a whole answer, and slotgate's pool drops one idle for 2 s. These rows check that on the
//! real server: many whole answers on a few connections, interleaved with streams; reuse just inside
//! the pool's idle limit and a new connection just past it; both slots busy with whole answers at
//! once; and a pooled connection left behind by a killed llama-server, which must cost the next
//! request nothing but a retry. Every request is answered 200, none with 502.

use std::time::Duration;

use slotgate_tests::llama::{chat, LlamaServer, RunningLlama, PROMPT};
use slotgate_tests::*;

const CONNECTIONS: &str = "slotgate_upstream_connections_total";

async fn gate_for(llama: &RunningLlama) -> RunningGate {
    // An hourly health probe: its connections would blur the count.
    Gate::new()
        .slots(2)
        .queue_depth(8)
        .queue_timeout("120s")
        .health_interval("1h")
        .start_before(llama)
        .await
}

async fn opened(gate: &RunningGate) -> f64 {
    gate.metrics().await.value_or_zero(CONNECTIONS, &[])
}

async fn assert_no_upstream_error(gate: &RunningGate) {
    let m = gate.metrics().await;
    let failed = m.value_or_zero("slotgate_requests_total", &[("outcome", "upstream_error")]);
    assert_eq!(failed, 0.0, "{}", m.text);
}

async fn whole(gate: &RunningGate, tag: &str) {
    let resp = gate.client().post_json(CHAT, &chat(PROMPT, 2, false)).await;
    assert_eq!(resp.status, 200, "{tag}: {}", resp.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_answers_reuse_connections_and_streams_do_not_on_the_real_server() {
    let _one = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(2).await;
    let gate = gate_for(&llama).await;
    let start = opened(&gate).await;

    // 40 whole answers, one at a time, a stream after every 10th.
    let mut streams = 0.0;
    for i in 0..40 {
        whole(&gate, &format!("w{i}")).await;
        if i % 10 == 9 {
            let sse = gate
                .client()
                .stream(CHAT, &chat(PROMPT, 4, true))
                .await
                .read_sse(Duration::from_secs(30))
                .await;
            assert!(sse.complete(), "{sse:?}");
            streams += 1.0;
        }
    }
    let used = opened(&gate).await - start;
    eprintln!("40 whole answers and {streams} streams opened {used} connections");
    assert!(
        used <= streams + 2.0,
        "whole answers did not reuse connections: {used} opened"
    );

    // Both slots busy with whole answers at once: at most one more connection.
    let before = opened(&gate).await;
    for round in 0..5 {
        let a = spawn_post(
            &gate.client(),
            CHAT,
            &Req::from_json(chat(PROMPT, 2, false)),
        );
        let b = spawn_post(
            &gate.client(),
            CHAT,
            &Req::from_json(chat(PROMPT, 2, false)),
        );
        for (resp, _) in join_all(vec![a, b]).await {
            assert_eq!(resp.status, 200, "round {round}: {}", resp.body);
        }
    }
    let used = opened(&gate).await - before;
    assert!(used <= 2.0, "two at a time opened {used} connections");

    // Reused just inside the pool's 2 s idle limit; a new connection just past it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = opened(&gate).await;
    whole(&gate, "after 1.5 s").await;
    assert_eq!(opened(&gate).await, before, "reused after 1.5 s idle");
    tokio::time::sleep(Duration::from_millis(2600)).await;
    whole(&gate, "after 2.6 s").await;
    assert_eq!(opened(&gate).await, before + 1.0, "new after 2.6 s idle");

    assert_no_upstream_error(&gate).await;
    gate.assert_idle().await;
    assert_eq!(llama.busy_slots().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_connection_to_a_killed_llama_server_costs_the_next_request_nothing() {
    let _one = slotgate_tests::llama::serial().await;
    let mut llama = LlamaServer::start(2).await;
    let gate = gate_for(&llama).await;
    // Leaves idle connections in the pool.
    for i in 0..3 {
        whole(&gate, &format!("before-{i}")).await;
    }
    llama.kill();
    llama.restart().await;
    // Within the pool's idle limit: the connections to the dead server are still pooled.
    for i in 0..4 {
        whole(&gate, &format!("after-{i}")).await;
    }
    assert_no_upstream_error(&gate).await;
    gate.wait_outcome("ok", 7).await;
    gate.assert_idle().await;
}
