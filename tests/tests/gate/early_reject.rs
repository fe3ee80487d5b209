//! An answer sent before the request body was read (413, 404, 405) reaches a client that writes its
//! whole body before it reads: slotgate closes lingering, reading and discarding the rest of the
//! body within a bound, instead of closing on a client still writing (a broken pipe, no answer).

use std::time::Duration;

use slotgate_tests::client::{raw_body, raw_status, read_until_closed};
use slotgate_tests::*;
use tokio::io::AsyncWriteExt;

/// Writes the head and all of a `len`-byte body, then reads the answer: the way Python's
/// `http.client` and most simple clients work. Panics on a write error (the broken pipe this guards
/// against).
async fn write_all_then_read(gate: &RunningGate, path: &str, len: usize) -> (u16, String) {
    let mut sock = gate.client().raw_unix().await;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 256 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        sock.write_all(&chunk[..n])
            .await
            .unwrap_or_else(|e| panic!("writing the body failed with {left} bytes left: {e}"));
        left -= n;
    }
    let got = read_until_closed(&mut sock, Duration::from_secs(10))
        .await
        .expect("slotgate closes the connection after an early answer");
    let status = raw_status(&got).unwrap_or_else(|| {
        panic!(
            "no HTTP answer; got {:?}",
            String::from_utf8_lossy(&got[..got.len().min(200)])
        )
    });
    (status, raw_body(&got))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_body_written_whole_gets_its_413() {
    let (up, gate) = Gate::one_slot(2).max_body("8MiB").start_instant().await;
    // 9 MiB against 8 MiB, as the new user sent it.
    let (status, body) = write_all_then_read(&gate, CHAT, 9 << 20).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("body_too_large"), "{body}");
    assert_eq!(up.count(), 0, "nothing reached llama-server");
    gate.wait_outcome("bad_request", 1).await;
    // Served again right after.
    let resp = gate.client().post_chat(&Req::chat("after")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_path_with_a_body_gets_its_404() {
    let (up, gate) = Gate::one_slot(2).start_instant().await;
    let (status, body) = write_all_then_read(&gate, "/v1/nope", 2 << 20).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not_found"), "{body}");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lingering_is_bounded_in_bytes() {
    let (up, gate) = Gate::one_slot(2).max_body("64KiB").start_instant().await;
    // 64 KiB + 4 MiB is the most slotgate discards; a 64 MiB body is cut well before its end.
    let mut sock = gate.client().raw_unix().await;
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        64 << 20
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 256 * 1024];
    let mut written = 0usize;
    let outcome = tokio::time::timeout(Duration::from_secs(10), async {
        while written < 64 << 20 {
            match sock.write_all(&chunk).await {
                Ok(()) => written += chunk.len(),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await
    .expect("slotgate stops reading within its linger bound");
    assert!(
        outcome.is_err(),
        "all 64 MiB were read: the linger is unbounded"
    );
    assert!(
        written < 16 << 20,
        "{written} bytes were accepted before the cut; the bound is 64 KiB + 4 MiB (plus socket buffers)"
    );
    drop(sock);
    gate.assert_settled(&up, 1).await;
}
