//! A streamed response holds its slot until the last byte: the next request waits for the whole stream.

use std::time::Duration;

use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_request_waits_for_the_whole_stream() {
    let (up, gate) = Gate::one_slot(4)
        .start_with(FakeUpstream::sse(["a", "b", "c", "d", "e"], ms(150)))
        .await;
    let client = gate.client();

    let mut first = client.stream_chat(&Req::chat("first").stream()).await;
    assert_eq!(first.status, 200);
    assert!(
        first
            .header("content-type")
            .unwrap_or_default()
            .starts_with("text/event-stream"),
        "stream content-type: {:?}",
        first.header("content-type")
    );
    assert!(
        first.header("x-slotgate-queue-wait-ms").is_some(),
        "streamed responses carry x-slotgate-queue-wait-ms too: {:?}",
        first.headers
    );
    first.first_event(Duration::from_secs(2)).await;

    // Headers and a first chunk have arrived; the slot must still be taken.
    let second = spawn_post(&client, CHAT, &Req::chat("second"));
    let st = gate.wait_queue_depth(1).await;
    assert_eq!(st["slots"]["busy"], 1, "{st}");

    let sse = first.read_sse(Duration::from_secs(5)).await;
    assert!(
        sse.complete(),
        "first stream must end cleanly with [DONE]: {sse:?}"
    );
    assert_eq!(
        sse.data.len(),
        6,
        "5 content chunks + the usage chunk: {:?}",
        sse.data
    );

    let (resp, _) = join_all(vec![second]).await.remove(0);
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.tag().as_deref(), Some("second"));

    let first_seen = up.request_with_tag("first").expect("fake saw the stream");
    let second_seen = up
        .request_with_tag("second")
        .expect("fake saw the second request");
    let first_done = first_seen.finished.expect("stream finished at the fake");
    assert!(
        second_seen.arrived >= first_done,
        "second request reached the upstream {:?} before the stream finished",
        first_done - second_seen.arrived
    );
    assert_eq!(up.max_concurrency(), 1);
    gate.assert_settled(&up, 1).await;
}
