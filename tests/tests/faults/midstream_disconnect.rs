//! A client that leaves mid-stream cancels the upstream response and frees its slot at once.

use std::time::{Duration, Instant};

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_a_stream_cancels_upstream_and_frees_the_slot() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let client = gate.client();

    // 20 chunks 100 ms apart: about 2 s if nobody cancels it.
    let mut stream = client
        .stream_chat(&Req::chat("long").chunks(20, ms(100)))
        .await;
    assert_eq!(stream.status, 200);
    stream.first_event(Duration::from_secs(2)).await;
    let next = gate.enqueue(&Req::chat("next")).await;

    drop(stream);
    let t0 = Instant::now();
    eventually(
        Duration::from_secs(2),
        "the fake sees its stream cancelled",
        || async { (up.cancelled() == 1).then_some(()) },
    )
    .await;
    let (resp, _) = join_all(vec![next]).await.remove(0);
    let freed_after = t0.elapsed();
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(
        freed_after < Duration::from_millis(1200),
        "the queued request was served {freed_after:?} after the client left; the slot was not freed at once"
    );

    assert_eq!(up.tags(), ["long", "next"]);
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("client_gone", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaving_before_the_response_head_cancels_upstream_and_frees_the_slot() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let client = gate.client();

    // A long non-stream generation; the client gives up before any byte of the answer.
    let slow = spawn_post(&client, CHAT, &Req::chat("slow").delay(ms(3000)));
    eventually(
        Duration::from_secs(2),
        "the slow request reaches the fake",
        || async { (up.current() == 1).then_some(()) },
    )
    .await;
    let next = gate.enqueue(&Req::chat("next")).await;

    slow.abort();
    let t0 = Instant::now();
    let (resp, _) = join_all(vec![next]).await.remove(0);
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "the queued request waited {:?} after the client left; the slot was held for the abandoned generation",
        t0.elapsed()
    );
    assert_eq!(
        up.max_concurrency(),
        1,
        "the next request reached the upstream while the abandoned one was still running there"
    );
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("client_gone", 1).await;
}

/// A client that leaves mid-stream is charged what it was served: the prompt (exact when it was
/// counted, else the estimate) and the tokens streamed before it left (one per text-carrying event),
/// not its reservation and not zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_is_charged_only_what_was_generated() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let client = gate.client();
    // Forwarded at once (the slot is free), so its prompt is not counted: a leaver, which gets no
    // usage from llama-server, is charged the estimate (40 characters / 4).
    let body = Req::chat("leaver")
        .chunks(40, ms(50))
        .set("max_tokens", 100)
        .set(
            "messages",
            serde_json::json!([{"role": "user", "content": "z".repeat(40)}]),
        )
        .json();
    let mut stream = client.stream(CHAT, &body).await;
    assert_eq!(stream.header("x-slotgate-prompt-tokens"), None);
    let prompt = 10.0;
    for _ in 0..5 {
        stream.next_chunk_within(Duration::from_secs(2)).await;
    }
    drop(stream);
    gate.wait_outcome("client_gone", 1).await;
    gate.assert_settled(&up, 1).await;
    let m = gate.metrics().await;
    let completion = m.value_or_zero("slotgate_tokens_total", &[("kind", "completion")]);
    assert!(
        (5.0..=10.0).contains(&completion),
        "charged {completion} completion tokens for about 5 streamed"
    );
    assert_eq!(
        m.value_or_zero("slotgate_tokens_total", &[("kind", "prompt")]),
        prompt
    );
    let reserved = m.value_or_zero("slotgate_tokens_reserved_total", &[]);
    assert_eq!(
        m.value_or_zero("slotgate_tokens_refunded_total", &[]),
        reserved - prompt - completion,
        "everything not served is refunded"
    );
}

/// A client that closes as soon as it has read `data: [DONE]` (many SDKs do), before the end of the
/// stream reaches it, got the whole answer: counted `ok` (not `client_gone`), charged its reported
/// usage, and its slot handed on at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_closes_right_after_done_got_the_whole_answer() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let body = Req::chat("done-then-close")
        .chunks(3, ms(5))
        .completion_tokens(3)
        .set("fake_linger_ms", 5000)
        .json();
    let mut stream = gate.client().stream(CHAT, &body).await;
    let mut text = String::new();
    while !text.contains("data: [DONE]") {
        let chunk = stream
            .next_chunk_within(Duration::from_secs(3))
            .await
            .expect("the stream goes on to [DONE]")
            .expect("a chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let closed = Instant::now();
    drop(stream);
    gate.wait_outcome("ok", 1).await;
    assert!(
        closed.elapsed() < Duration::from_secs(3),
        "counted at once, not when the upstream's stream ended"
    );
    let m = gate.metrics().await;
    m.assert_value(
        "slotgate_requests_total",
        &[("outcome", "client_gone")],
        0.0,
    );
    assert_eq!(
        m.value_or_zero("slotgate_tokens_total", &[("kind", "completion")]),
        3.0,
        "charged its reported usage"
    );
    gate.assert_settled(&up, 1).await;
}
