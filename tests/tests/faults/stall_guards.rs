//! No client and no upstream can hold a slot: a client that stops reading is cut after
//! `--client-stall-timeout`, a slow reader that keeps reading is not, and a llama-server that goes
//! silent before or during its answer is cut after `--upstream-first-byte-timeout` /
//! `--upstream-idle-timeout`.

use std::time::{Duration, Instant};

use slotgate_tests::client::read_until_closed;
use slotgate_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// A raw streaming chat request for `chunks` tokens as fast as the fake can send them (~200 bytes
/// each): far more than the socket buffers between slotgate and the client hold.
fn big_stream_request(tag: &str, chunks: u64) -> Vec<u8> {
    let body = Req::chat(tag).chunks(chunks, ms(0)).json().to_string();
    format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `request` and reads until the response head has arrived, then returns the socket.
async fn read_head(gate: &RunningGate, request: &[u8]) -> (UnixStream, Vec<u8>) {
    let mut sock = gate.client().raw_unix().await;
    sock.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
            .await
            .expect("response head within 5 s")
            .unwrap();
        assert!(n > 0, "closed before the response head");
        got.extend_from_slice(&buf[..n]);
    }
    (sock, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_stops_reading_loses_its_slot_within_the_stall_timeout() {
    let stall = Duration::from_secs(2);
    let (up, gate) = Gate::one_slot(4)
        .opt("--client-stall-timeout", "2s")
        .start_instant()
        .await;

    // Reads the response head, then nothing more, keeping the connection open.
    let (stalled_sock, head) = read_head(&gate, &big_stream_request("stalled", 20_000)).await;
    assert_eq!(client::raw_status(&head), Some(200));
    let t0 = Instant::now();
    // The next client queues behind it.
    let next = gate.enqueue(&Req::chat("next")).await;
    let (resp, _) = join_all(vec![next]).await.remove(0);
    let served_after = t0.elapsed();
    assert_eq!(resp.status, 200, "{}", resp.body);
    // One service time of the next request is a few ms on the fake; allow the hand-over grace and a
    // busy machine.
    assert!(
        served_after < stall + Duration::from_secs(2),
        "the next client was served {served_after:?} after the stalled one stopped reading (stall timeout {stall:?})"
    );
    // llama-server (the fake) saw its stream cancelled: it stopped generating for the stalled client.
    eventually(
        Duration::from_secs(2),
        "the stalled stream cancelled upstream",
        || async { (up.cancelled() == 1).then_some(()) },
    )
    .await;
    gate.wait_outcome("client_stalled", 1).await;
    assert!(
        gate.stderr_text().contains("client stopped reading"),
        "no log line for the cut: {}",
        gate.stderr_text()
    );
    // The stalled client's connection was closed: reading now drains what was buffered, then EOF.
    let mut stalled_sock = stalled_sock;
    let rest = read_until_closed(&mut stalled_sock, Duration::from_secs(5)).await;
    let rest = rest.expect("the stalled connection was closed");
    assert!(
        !String::from_utf8_lossy(&rest).contains("[DONE]"),
        "a cut response must not look complete"
    );
    assert_eq!(up.tags(), ["stalled", "next"]);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_reader_that_keeps_reading_is_never_cut() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--client-stall-timeout", "1s")
        .start_instant()
        .await;
    // ~600 KB, read at ~100 KB/s: 6 s in all, 6x the stall timeout, always making progress.
    let (mut sock, head) = read_head(&gate, &big_stream_request("slow", 3_000)).await;
    assert_eq!(client::raw_status(&head), Some(200));
    let t0 = Instant::now();
    let mut body = head;
    let mut buf = vec![0u8; 10 * 1024];
    loop {
        tokio::time::sleep(ms(100)).await;
        match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => body.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("slow reader's connection failed: {e}"),
            Err(_) => panic!("no byte for 5 s"),
        }
        if body.ends_with(b"0\r\n\r\n") {
            break;
        }
    }
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("data: [DONE]"),
        "the slow reader's stream was cut"
    );
    assert!(
        took > Duration::from_secs(2),
        "the read took {took:?}: not slower than the stall timeout, the test proves nothing"
    );
    gate.wait_outcome("ok", 1).await;
    assert_eq!(
        gate.metric("slotgate_requests_total", &[("outcome", "client_stalled")])
            .await,
        Some(0.0)
    );
    drop(sock);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_upstream_before_its_answer_is_cut_by_the_first_byte_timeout() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--upstream-first-byte-timeout", "1s")
        .start_instant()
        .await;
    let client = gate.client();
    let hung = spawn_post(&client, CHAT, &Req::chat("hung").delay(ms(30_000)));
    gate.wait_busy(1).await;
    let next = gate.enqueue(&Req::chat("next")).await;
    let (resp, took) = join_all(vec![hung]).await.remove(0);
    assert_eq!(resp.status, 504, "{}", resp.body);
    assert_error(&resp, 504, "upstream_timeout");
    assert!(took < Duration::from_secs(3), "cut after {took:?}");
    let (resp, _) = join_all(vec![next]).await.remove(0);
    assert_eq!(resp.status, 200, "{}", resp.body);
    eventually(
        Duration::from_secs(2),
        "the hung request cancelled upstream",
        || async { (up.cancelled() >= 1 || up.current() == 0).then_some(()) },
    )
    .await;
    gate.wait_outcome("upstream_timeout", 1).await;
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_silent_mid_stream_is_cut_by_the_idle_timeout() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--upstream-idle-timeout", "1s")
        .start_instant()
        .await;
    let client = gate.client();
    // The first token at once, the next only after 30 s.
    let stream = client
        .stream_chat(&Req::chat("silent").chunks(3, ms(30_000)))
        .await;
    assert_eq!(stream.status, 200);
    let t0 = Instant::now();
    let read = stream.read_sse(Duration::from_secs(10)).await;
    let took = t0.elapsed();
    assert!(
        !read.complete(),
        "an aborted answer must not end cleanly: {read:?}"
    );
    assert!(
        read.error.is_some(),
        "the client must see the response fail: {read:?}"
    );
    assert!(took < Duration::from_secs(4), "cut after {took:?}");
    eventually(
        Duration::from_secs(2),
        "the silent stream cancelled upstream",
        || async { (up.cancelled() == 1).then_some(()) },
    )
    .await;
    gate.wait_outcome("upstream_timeout", 1).await;
    // The slot is free again.
    let resp = client.post_chat(&Req::chat("after")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_with_steady_tokens_outlives_the_idle_timeout() {
    let (up, gate) = Gate::one_slot(4)
        .opt("--upstream-idle-timeout", "1s")
        .start_instant()
        .await;
    // 8 tokens 400 ms apart: 3.2 s in all, never 1 s silent.
    let resp = gate
        .client()
        .stream_chat(&Req::chat("steady").chunks(8, ms(400)))
        .await
        .read_sse(Duration::from_secs(10))
        .await;
    assert!(resp.complete(), "{resp:?}");
    gate.wait_outcome("ok", 1).await;
    gate.assert_settled(&up, 1).await;
}
