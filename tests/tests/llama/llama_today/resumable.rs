//! A request naming a conversation (`X-Conversation-Id`) is one llama-server finishes into a
//! session the client can resume (`GET /v1/stream?conv_id=`), whether or not the client stays.
//! When the client leaves, slotgate keeps the slot until llama-server is done with it: handing it on
//! at once would put a second request on a slot still generating, which llama-server defers.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::Method;
use slotgate_tests::client::post_with_headers;
use slotgate_tests::llama::{chat, chat_usage, LlamaServer, PROMPT};
use slotgate_tests::*;

use super::{assert_both_idle, gate_before, learned, serial, watch_deferred};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_left_by_its_client_keeps_its_slot_until_llama_server_is_done() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let long = llama.tokens_for(Duration::from_secs(2), (64, 1800)).await;
    let (gate, _) = gate_before(&llama, Gate::new().queue_timeout("120s")).await;
    learned(&gate).await;

    let (deferred, watching) = watch_deferred(llama.socket());

    let req = post_with_headers(
        CHAT,
        &chat(PROMPT, long, true),
        &[("x-conversation-id", "conv-slotgate-1")],
    );
    let mut stream = gate
        .client()
        .connect()
        .await
        .unwrap()
        .send_streaming(req)
        .await
        .unwrap();
    let first = stream.first_event(Duration::from_secs(10)).await;
    assert!(first.contains("chat.completion.chunk"), "{first}");
    drop(stream);

    // The client is gone; llama-server goes on, and so does the slot's hold.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(llama.busy_slots().await, 1, "llama-server still generating");
    assert_eq!(gate.status().await["slots"]["busy"], 1);
    let next = spawn_post(
        &gate.client(),
        CHAT,
        &Req::from_json(chat(PROMPT, 4, false)),
    );
    gate.wait_queue_depth(1).await;
    let (resp, waited) = next.await.unwrap();
    chat_usage(&resp, 4);
    eprintln!("the next request waited {waited:?}");
    watching.abort();
    assert_eq!(
        deferred.load(Ordering::Relaxed),
        0,
        "llama-server deferred the next request"
    );

    // The session is the client's to resume, through slotgate.
    let resumed = gate
        .client()
        .get("/v1/stream?conv_id=conv-slotgate-1")
        .await;
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert!(resumed.body.contains("[DONE]"), "{}", resumed.body);
    // Recorded as the client's leaving, charged what llama-server really did.
    gate.wait_outcome("client_gone", 1).await;
    let m = gate.metrics().await;
    m.assert_value(
        "slotgate_tokens_total",
        &[("kind", "completion")],
        (long + 4) as f64,
    );
    assert_both_idle(&gate, &llama).await;
}

/// A conversation's request that waits in slotgate is one llama-server would already know (it
/// registers the session as the request arrives, its router before it loads the model): a resume
/// is told to retry later, a stop ends it, in llama-server's words, and it is kept when its client
/// goes, its answer generated into the session for a later resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_waiting_here_is_stopped_resumed_and_kept_as_llama_server_keeps_it() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let long = llama.tokens_for(Duration::from_secs(2), (64, 1800)).await;
    let (gate, _) = gate_before(&llama, Gate::new().queue_timeout("120s")).await;
    learned(&gate).await;
    let waiter = |conversation: &'static str| {
        let client = gate.client();
        tokio::spawn(async move {
            let s = client
                .stream_with_headers(
                    CHAT,
                    &chat(PROMPT, 4, true),
                    &[("x-conversation-id", conversation)],
                )
                .await;
            let status = s.status;
            (status, s.read_all(Duration::from_secs(30)).await.raw)
        })
    };

    // Stopped while it waits for a slot.
    let held = gate
        .hold_slot(&Req::from_json(chat(PROMPT, long, false)))
        .await;
    let stopped = waiter("conv-stopped");
    gate.wait_queue_depth(1).await;
    let pending = gate.client().get("/v1/stream?conv_id=conv-stopped").await;
    assert_eq!(pending.status, 503, "{}", pending.body);
    assert!(pending.body.contains("retry later"), "{}", pending.body);
    let stop = gate
        .client()
        .send_with(Method::DELETE, "/v1/stream?conv_id=conv-stopped", &[], "")
        .await;
    assert_eq!(stop.status, 204, "llama-server's own answer: {}", stop.body);
    let (status, body) = stopped.await.unwrap();
    assert_eq!(status, 400, "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], 400, "{body}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(
        e["error"]["message"],
        "request cancelled by a stop while it waited for a slot"
    );
    gate.wait_queue_depth(0).await;
    let gone = gate.client().get("/v1/stream?conv_id=conv-stopped").await;
    assert_eq!(gone.status, 404, "{}", gone.body);

    // Its client gone while it waits, it runs all the same when its turn comes.
    let left = waiter("conv-left");
    gate.wait_queue_depth(1).await;
    left.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.wait_queue_depth(1).await;
    let (resp, _) = held.await.unwrap();
    chat_usage(&resp, long);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let resumed = loop {
        let r = gate
            .client()
            .get("/v1/stream?conv_id=conv-left&from=0")
            .await;
        if r.status == 200 && r.body.contains("[DONE]") {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never resumable: {} {}",
            r.status,
            r.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        resumed.body.contains("chat.completion.chunk"),
        "{}",
        resumed.body
    );
    gate.wait_outcome("client_gone", 2).await;
    assert_both_idle(&gate, &llama).await;
}
