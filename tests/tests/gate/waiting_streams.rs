//! Waiting streams kept alive and told their place (docs/scheduling.md#waiting-streams): a stream
//! that has to wait is answered at once and sent SSE comments with its place and expected start
//! until its own events follow; a refusal after that is an error event in its API's shape; a
//! client that leaves while it waits leaves the queue. Behind a real nginx:
//! `tests/tests/llama/waiting_streams.rs`.

use std::time::Duration;

use slotgate_tests::*;

const KEEP: &str = "x-slotgate-keepalive-ms";

/// The comments of a stream's text.
fn comments(raw: &str) -> Vec<&str> {
    raw.lines()
        .filter(|l| l.starts_with(": slotgate"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_stream_is_answered_at_once_told_its_place_then_served() {
    // The setting on one gate; a request's own header on another with it off.
    for by_header in [false, true] {
        let mut gate = Gate::one_slot(4);
        if !by_header {
            gate = gate.opt("--stream-keepalive", "200ms");
        }
        let (up, gate) = gate.start_instant().await;
        let held = gate.hold_slot(&Req::chat("held").delay(ms(1200))).await;
        let mut req = Req::chat("waiter").chunks(3, ms(20));
        if by_header {
            req = req.header(KEEP, "200");
        }
        let started = std::time::Instant::now();
        let mut s = gate.client().stream_chat(&req).await;
        assert!(
            started.elapsed() < ms(800),
            "the head came after {:?}, not at once",
            started.elapsed()
        );
        assert_eq!(s.status, 200);
        assert_eq!(s.header("x-slotgate-queued").as_deref(), Some("1"));
        assert_eq!(
            s.header("content-type").as_deref(),
            Some("text/event-stream")
        );
        // The first comment at once, with its place.
        let first = s.next_chunk_within(ms(500)).await.unwrap().unwrap();
        let first = String::from_utf8_lossy(&first).into_owned();
        assert!(
            first.starts_with(": slotgate queued position=1 of=1 expected_start_s="),
            "{first:?}"
        );
        let read = s.read_sse(Duration::from_secs(10)).await;
        assert!(read.complete(), "{read:?}");
        assert_eq!(
            read.data.len(),
            4,
            "its own three tokens and last chunk: {}",
            read.raw
        );
        let told = comments(&read.raw);
        assert!(
            told.len() >= 3,
            "a comment every 200 ms of a wait of about a second: {}",
            read.raw
        );
        held.await.unwrap();
        gate.assert_settled(&up, 1).await;
        gate.wait_outcome("ok", 2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_after_the_early_answer_is_an_error_event_in_the_apis_shape() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--stream-keepalive", "100ms")
        .opt("--log-format", "json")
        .start_instant()
        .await;
    let held = gate.hold_slot(&Req::chat("held").delay(ms(1500))).await;
    // Chat: its deadline passes while it waits.
    let req = Req::chat("due")
        .chunks(3, ms(20))
        .header("x-slotgate-deadline-ms", "400");
    let s = gate.client().stream_chat(&req).await;
    assert_eq!(s.status, 200);
    let read = s.read_sse(Duration::from_secs(5)).await;
    assert!(!comments(&read.raw).is_empty(), "{}", read.raw);
    assert_eq!(read.data.len(), 1, "one error event: {}", read.raw);
    let e: serde_json::Value = serde_json::from_str(&read.data[0]).unwrap();
    assert_eq!(e["error"]["code"], "deadline_exceeded", "{e}");
    assert!(!read.done, "no [DONE] after an error: {}", read.raw);
    // The Messages API: Anthropic's `event: error`.
    let msg = serde_json::json!({
        "model": "m", "max_tokens": 8, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]
    });
    let s = gate
        .client()
        .stream_with_headers(
            "/v1/messages",
            &msg,
            &[("x-slotgate-deadline-ms", "300"), (KEEP, "100")],
        )
        .await;
    assert_eq!(s.status, 200);
    let read = s.read_sse(Duration::from_secs(5)).await;
    assert!(read.raw.contains("event: error\ndata: "), "{}", read.raw);
    let e: serde_json::Value = serde_json::from_str(&read.data[0]).unwrap();
    assert_eq!(
        (&e["type"], &e["error"]["type"]),
        (&"error".into(), &"timeout_error".into()),
        "{e}"
    );
    held.await.unwrap();
    assert!(!up.saw_tag("due"), "forwarded past its deadline");
    gate.assert_settled(&up, 1).await;
    // What really happened: the access lines say deadline_exceeded, not ok.
    gate.wait_outcome("deadline_exceeded", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_never_waits_or_does_not_stream_is_answered_as_before() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--stream-keepalive", "100ms")
        .start_instant()
        .await;
    // A free slot: its own answer, with slotgate's usual headers.
    let s = gate
        .client()
        .stream_chat(&Req::chat("free").chunks(2, ms(10)))
        .await;
    assert!(s.header("x-slotgate-queued").is_none());
    assert!(s.header("x-slotgate-queue-wait-ms").is_some());
    let read = s.read_sse(Duration::from_secs(5)).await;
    assert!(
        read.complete() && comments(&read.raw).is_empty(),
        "{read:?}"
    );
    // A whole answer that waits: no early head, its JSON as always.
    let held = gate.hold_slot(&Req::chat("held").delay(ms(500))).await;
    let (whole, took) = spawn_post(&gate.client(), CHAT, &Req::chat("whole"))
        .await
        .unwrap();
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert!(took >= ms(300), "{took:?}");
    assert!(whole.header("x-slotgate-queued").is_none());
    held.await.unwrap();
    // A header that is no interval: 400.
    let bad = gate
        .client()
        .post_json_with_headers(CHAT, &Req::chat("bad").json(), &[(KEEP, "often")])
        .await;
    assert_error(&bad, 400, "invalid_header");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_while_it_waits_leaves_the_queue() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--stream-keepalive", "100ms")
        .start_instant()
        .await;
    let held = gate.hold_slot(&Req::chat("held").delay(ms(1500))).await;
    let mut s = gate
        .client()
        .stream_chat(&Req::chat("leaver").chunks(3, ms(20)))
        .await;
    s.next_chunk_within(ms(500)).await.unwrap().unwrap();
    gate.wait_queue_depth(1).await;
    drop(s);
    gate.wait_queue_depth(0).await;
    held.await.unwrap();
    assert!(
        !up.saw_tag("leaver"),
        "a request whose client left was forwarded"
    );
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("client_gone", 1).await;
}

/// A stream naming a conversation (`X-Conversation-Id`) is kept when its client leaves while it
/// waits, kept alive or not: llama-server generates such an answer into the conversation's session
/// for a later resume, so it must reach llama-server all the same (as without the keep-alive).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_whose_client_leaves_while_it_waits_still_runs() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--stream-keepalive", "100ms")
        .start_instant()
        .await;
    let held = gate.hold_slot(&Req::chat("held").delay(ms(800))).await;
    let mut s = gate
        .client()
        .stream_chat(
            &Req::chat("keeper")
                .chunks(3, ms(20))
                .header("x-conversation-id", "conv-kept"),
        )
        .await;
    assert_eq!(s.header("x-slotgate-queued").as_deref(), Some("1"));
    s.next_chunk_within(ms(500)).await.unwrap().unwrap();
    drop(s);
    tokio::time::sleep(ms(200)).await;
    assert_eq!(
        gate.status().await["queue"]["depth"],
        1,
        "it left the queue with its client"
    );
    held.await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the conversation forwarded",
        || async { up.saw_tag("keeper").then_some(()) },
    )
    .await;
    gate.wait_outcome("client_gone", 1).await;
    gate.assert_settled(&up, 1).await;
}
