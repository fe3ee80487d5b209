//! Fault matrix, client rows: every way a client can misbehave on the wire ends with one clean answer
//! (or a clean close where it left), nothing forwarded that it did not fully send, and a settled gate.
//!
//! Every scenario ends with [`RunningGate::assert_settled`]: queue, busy slots and in-flight back to
//! 0, file descriptors back to their baseline, nothing forwarded twice, and llama-server (the fake)
//! never saw more than `--slots` requests at once.
//!
//! | row | test |
//! |-----|------|
//! | stalled reader | covered by `tests/tests/faults/stall_guards.rs::a_client_that_stops_reading_loses_its_slot_within_the_stall_timeout` |
//! | slow but progressing reader | covered by `tests/tests/faults/stall_guards.rs::a_slow_reader_that_keeps_reading_is_never_cut` |
//! | disconnect during the request head | `a_client_that_leaves_during_its_request_head_is_forgotten` |
//! | disconnect during the body | `a_client_that_leaves_during_its_body_is_never_forwarded` |
//! | disconnect while queued | covered by `tests/tests/faults/queued_disconnect.rs::queued_client_that_leaves_is_dropped_from_the_queue` |
//! | disconnect during a policy evaluation | `a_client_that_leaves_during_its_policy_evaluation_is_never_forwarded` |
//! | disconnect mid-stream | covered by `tests/tests/faults/midstream_disconnect.rs::dropping_a_stream_cancels_upstream_and_frees_the_slot` (and before the head: `leaving_before_the_response_head_cancels_upstream_and_frees_the_slot`) |
//! | half-close (taken as a disconnect, as nginx does) | `a_half_closed_client_is_taken_to_have_left` |
//! | pipelined requests | `pipelined_requests_are_answered_in_order_one_at_a_time` |
//! | HTTP/1.0 | `http_1_0_requests_are_answered_and_closed` |
//! | oversized header block, too many headers | `an_oversized_header_block_gets_431_and_a_close` |
//! | Content-Length with chunked (smuggling) | `content_length_with_chunked_never_smuggles_a_request` |
//! | broken chunked encoding | `broken_chunked_bodies_get_400_or_a_close` |
//! | `Expect: 100-continue` | `expect_100_continue_is_honoured_and_a_too_large_body_is_refused_unsent` |
//!
//! Raw sockets are used wherever a well-behaved HTTP client could not produce the fault.

use std::time::Duration;

use slotgate_tests::client::{parse_sse, raw_post, raw_responses, read_until_closed, RawResponse};
use slotgate_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long a raw exchange may take before the test calls the connection hung: only a bound.
const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// A raw chat request carrying `req`'s body, with `extra` header lines.
fn raw_chat(req: &Req, extra: &[&str]) -> Vec<u8> {
    raw_post(CHAT, &req.json().to_string(), extra)
}

/// Writes `bytes` on a fresh connection, waits a moment so slotgate has read them, and closes it.
async fn send_and_leave(gate: &RunningGate, bytes: &[u8]) {
    let mut sock = gate.client().raw_unix().await;
    sock.write_all(bytes).await.expect("write on a raw socket");
    // Not a timing assertion: the close must come after slotgate started on the bytes, not with them.
    tokio::time::sleep(ms(200)).await;
    drop(sock);
}

/// Writes `bytes` on a fresh connection and reads until slotgate closes it; panics if it stays open.
async fn exchange(gate: &RunningGate, bytes: &[u8]) -> Vec<u8> {
    gate.client()
        .raw_exchange(bytes, CLOSE_BOUND)
        .await
        .unwrap_or_else(|| panic!("slotgate kept the connection open for {CLOSE_BOUND:?}"))
        .0
}

/// Reads until one whole response head has arrived (and whatever came with it).
async fn read_one_head(sock: &mut UnixStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(CLOSE_BOUND, sock.read(&mut buf))
            .await
            .expect("a response head within the bound")
            .expect("read a response head");
        assert!(
            n > 0,
            "closed before a response head: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// The one response of an exchange that must hold exactly one.
fn only(responses: Vec<RawResponse>) -> RawResponse {
    assert_eq!(
        responses.len(),
        1,
        "expected exactly one response: {responses:?}"
    );
    responses.into_iter().next().unwrap()
}

/// The JSON answer of the fake carries the request's tag.
fn assert_tagged(resp: &RawResponse, tag: &str) {
    assert_eq!(resp.status, 200, "{}", resp.text());
    let json: serde_json::Value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", resp.text()));
    assert_eq!(json["fake_tag"], tag, "{json}");
}

/// A whole SSE answer for `tag`: `chunks` content events, the finishing one, and `[DONE]`.
fn assert_whole_stream(resp: &RawResponse, tag: &str, chunks: usize) {
    assert_eq!(resp.status, 200, "{}", resp.text());
    let (data, done) = parse_sse(&resp.text());
    assert!(done, "the stream did not end with [DONE]: {}", resp.text());
    assert_eq!(data.len(), chunks + 1, "{}", resp.text());
    assert!(
        data.iter()
            .all(|d| d.contains(&format!("\"fake_tag\":\"{tag}\""))),
        "{data:?}"
    );
}

/// A normal request is served after the fault: the gate kept working.
async fn assert_still_serves(gate: &RunningGate, tag: &str) {
    let resp = gate.client().post_chat(&Req::chat(tag)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.tag().as_deref(), Some(tag));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_during_its_request_head_is_forgotten() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let whole = String::from_utf8(raw_chat(&Req::chat("head"), &[])).unwrap();
    let head_end = whole.find("\r\n\r\n").unwrap();
    // In the request line, in a header name, in a header value, just before the blank line.
    for cut in [
        10,
        whole.find("Content-Type").unwrap() + 4,
        head_end - 3,
        head_end + 2,
    ] {
        send_and_leave(&gate, &whole.as_bytes()[..cut]).await;
    }
    gate.assert_idle().await;
    assert_still_serves(&gate, "after").await;
    assert_eq!(up.tags(), ["after"], "a partial head was forwarded");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_during_its_body_is_never_forwarded() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let body = Req::chat("body").set("padding", "x".repeat(2000)).json();
    let body = body.to_string();
    // Content-Length promises the whole body; a third of it arrives.
    let whole = raw_post(CHAT, &body, &[]);
    send_and_leave(&gate, &whole[..whole.len() - 2 * body.len() / 3]).await;
    // The same in chunked encoding: one whole chunk, then part of the next.
    let (first, second) = body.split_at(body.len() / 2);
    let chunked = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{}",
        first.len(),
        second.len(),
        &second[..10]
    );
    send_and_leave(&gate, chunked.as_bytes()).await;
    gate.assert_idle().await;
    assert_still_serves(&gate, "after").await;
    assert_eq!(up.tags(), ["after"], "a partial body was forwarded");
    gate.assert_settled(&up, 1).await;
}

/// The policy runs out its deadline on the marked request and then fails *open*: if slotgate kept
/// the departed client's request, it would be allowed and forwarded once the evaluation ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_leaves_during_its_policy_evaluation_is_never_forwarded() {
    let dir = unique_dir("fault-policy");
    let policy = wat::hostile(&dir, "slow", "(loop $spin (br $spin))", "");
    let config = dir.join("slotgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\npath = \"{}\"\non-error = \"allow\"\nfuel = 100000000000\ndeadline = \"1500ms\"\n",
            policy.display()
        ),
    )
    .unwrap();
    let (up, gate) = Gate::one_slot(4).config_file(&config).start_instant().await;
    let errors = || async {
        gate.metrics()
            .await
            .value_or_zero("slotgate_policy_errors_total", &[("policy", "slow")])
    };

    let leaver = spawn_post(
        &gate.client(),
        CHAT,
        &Req::chat("left").set("model", wat::MARKER),
    );
    // Well inside its 1.5 s evaluation (checked below: no error counted yet).
    tokio::time::sleep(ms(300)).await;
    assert_eq!(
        errors().await,
        0.0,
        "the evaluation ended before the client left: the test proves nothing"
    );
    leaver.abort();
    let _ = leaver.await;
    gate.wait_outcome("client_gone", 1).await;
    // The evaluation runs out its deadline (it is not interrupted) and fails open...
    eventually(Duration::from_secs(20), "the evaluation to end", || async {
        (errors().await == 1.0).then_some(())
    })
    .await;
    // ... and the next request is served: had the departed one been forwarded, it would have been
    // first in line for the slot.
    assert_still_serves(&gate, "after").await;
    assert!(
        !up.saw_tag("left"),
        "the departed client's request was forwarded: {:?}",
        up.tags()
    );
    assert_eq!(up.tags(), ["after"]);
    gate.assert_settled(&up, 1).await;
}

/// A client that shuts down its sending side after its request is taken to have left, as nginx does
/// by default (`proxy_ignore_client_abort off`): slotgate cannot tell a half-close from a client
/// gone on a socket until it writes, and noticing a client gone while it waits matters more (its
/// queue place and slot go to someone else at once). Its request is dropped, never forwarded,
/// counted `client_gone` if it was handed over at all, and the connection closed; nothing leaks. docs/failure.md says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_half_closed_client_is_taken_to_have_left() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    // Hold the slot, so the half-closed requests wait in the queue when the EOF arrives.
    let held = gate.hold_slot(&Req::chat("held").delay(ms(500))).await;
    for req in [
        Req::chat("half"),
        Req::chat("half-stream").chunks(5, ms(40)),
    ] {
        let mut sock = gate.client().raw_unix().await;
        sock.write_all(&raw_chat(&req, &[])).await.unwrap();
        sock.shutdown().await.expect("shut down the sending side");
        let got = read_until_closed(&mut sock, CLOSE_BOUND)
            .await
            .expect("slotgate closes the connection");
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    }
    let (resp, _) = join_all(vec![held]).await.remove(0);
    assert_eq!(resp.status, 200, "{}", resp.body);
    // hyper may see the end of input before it hands the request over: then it is never counted.
    let gone = gate
        .metric("slotgate_requests_total", &[("outcome", "client_gone")])
        .await;
    assert!(gone.unwrap_or(0.0) <= 2.0, "{gone:?}");
    assert_eq!(up.tags(), ["held"], "a half-closed request was forwarded");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_requests_are_answered_in_order_one_at_a_time() {
    // Two slots: only the connection's own ordering keeps the requests apart.
    let (up, gate) = Gate::new().slots(2).queue_depth(4).start_instant().await;
    let mut pipeline = raw_chat(&Req::chat("p0").delay(ms(100)), &[]);
    pipeline.extend(raw_chat(&Req::chat("p1").chunks(3, ms(30)), &[]));
    pipeline.extend(raw_chat(&Req::chat("p2"), &["Connection: close"]));
    let responses = raw_responses(&exchange(&gate, &pipeline).await);
    assert_eq!(responses.len(), 3, "{responses:?}");
    assert_tagged(&responses[0], "p0");
    assert_whole_stream(&responses[1], "p1", 3);
    assert_tagged(&responses[2], "p2");

    assert_eq!(up.tags(), ["p0", "p1", "p2"]);
    let seen = up.requests_seen();
    for pair in seen.windows(2) {
        let finished = pair[0].finished.expect("the earlier request finished");
        assert!(
            finished <= pair[1].arrived,
            "{:?} reached the upstream before {:?} was done",
            pair[1].tag,
            pair[0].tag
        );
    }
    assert_eq!(up.max_concurrency(), 1);
    gate.assert_settled(&up, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_1_0_requests_are_answered_and_closed() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    // No Host, no keep-alive: HTTP/1.0 has neither by default.
    let raw_1_0 = |req: &Req| {
        let body = req.json().to_string();
        format!(
            "POST {CHAT} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let resp = only(raw_responses(
        &exchange(&gate, raw_1_0(&Req::chat("old")).as_bytes()).await,
    ));
    assert_tagged(&resp, "old");

    // HTTP/1.0 has no chunked encoding: the stream's end is the connection's close.
    let req = Req::chat("old-stream").chunks(4, ms(20));
    let resp = only(raw_responses(
        &exchange(&gate, raw_1_0(&req).as_bytes()).await,
    ));
    assert!(
        !resp.chunked && resp.header("transfer-encoding").is_none(),
        "chunked encoding sent to an HTTP/1.0 client: {resp:?}"
    );
    assert_whole_stream(&resp, "old-stream", 4);

    assert_eq!(up.tags(), ["old", "old-stream"]);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_header_block_gets_431_and_a_close() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let big = format!("X-Big: {}", "x".repeat(100 * 1024));
    let many: Vec<String> = (0..500).map(|i| format!("X-Header-{i}: {i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    // `Connection: close`: a head let through is answered and closed at once, and the test says so.
    for (what, extra) in [
        ("500 headers", many),
        ("one 100 KiB header", vec![big.as_str()]),
    ] {
        let extra = [extra.as_slice(), &["Connection: close"]].concat();
        let got = exchange(&gate, &raw_chat(&Req::chat(what), &extra)).await;
        let resp = only(raw_responses(&got));
        assert!(
            resp.status == 431 || resp.status == 400,
            "{what}: answered {} instead of 431: {}",
            resp.status,
            resp.text()
        );
    }
    assert_eq!(
        up.count(),
        0,
        "a request with an oversized head was forwarded: {:?}",
        up.tags()
    );
    assert_still_serves(&gate, "after").await;
    gate.assert_settled(&up, 1).await;
}

/// Each smuggling attempt hides a second request (`smuggled`) where one reading of the framing would
/// find it; slotgate either refuses the message or reads it as chunked and closes the connection
/// after answering (RFC 9112, 6.3), so the hidden request is never parsed, let alone forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn content_length_with_chunked_never_smuggles_a_request() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let hidden = String::from_utf8(raw_chat(&Req::chat("smuggled"), &[])).unwrap();
    let outer = Req::chat("outer").json().to_string();
    let head = |framing: &str| {
        format!("POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{framing}\r\n")
    };

    // CL.TE: the chunked body ends early; Content-Length would take the hidden request as body.
    let chunked = format!("{:x}\r\n{outer}\r\n0\r\n\r\n", outer.len());
    let cl_te = head(&format!(
        "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
        chunked.len() + hidden.len()
    )) + &chunked
        + &hidden;
    // TE.CL: Content-Length ends after the chunk-size line; the hidden request is the chunk's data.
    let size_line = format!("{:x}\r\n", hidden.len());
    let te_cl = head(&format!(
        "Transfer-Encoding: chunked\r\nContent-Length: {}\r\n",
        size_line.len()
    )) + &size_line
        + &hidden
        + "\r\n0\r\n\r\n";
    // Two Content-Lengths that disagree: either one could end the body.
    let cl_cl = head(&format!(
        "Content-Length: {}\r\nContent-Length: {}\r\n",
        outer.len(),
        outer.len() + hidden.len()
    )) + &outer
        + &hidden;

    for (what, attempt) in [("CL.TE", cl_te), ("TE.CL", te_cl), ("CL.CL", cl_cl)] {
        let got = exchange(&gate, attempt.as_bytes()).await;
        let resp = only(raw_responses(&got));
        assert!(
            resp.status == 400 || (resp.status == 200 && what == "CL.TE"),
            "{what}: answered {}: {}",
            resp.status,
            resp.text()
        );
    }
    assert!(
        !up.saw_tag("smuggled"),
        "a smuggled request reached the upstream: {:?}",
        up.tags()
    );
    assert!(up.tags().iter().all(|t| t == "outer"), "{:?}", up.tags());
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broken_chunked_bodies_get_400_or_a_close() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    let body = Req::chat("broken").json().to_string();
    let (first, second) = body.split_at(body.len() / 2);
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
    let broken = [
        (
            "a size that is not hex",
            format!("{head}zz\r\n{body}\r\n0\r\n\r\n"),
        ),
        (
            "a chunk without its CRLF",
            format!(
                "{head}{:x}\r\n{first}XX{:x}\r\n{second}\r\n0\r\n\r\n",
                first.len(),
                second.len()
            ),
        ),
    ];
    for (what, bytes) in broken {
        let got = exchange(&gate, bytes.as_bytes()).await;
        if got.is_empty() {
            eprintln!("{what}: closed without an answer");
            continue;
        }
        let resp = only(raw_responses(&got));
        assert_eq!(resp.status, 400, "{what}: {}", resp.text());
    }
    // Truncated in the middle of a chunk, then gone.
    send_and_leave(
        &gate,
        format!("{head}{:x}\r\n{first}", body.len()).as_bytes(),
    )
    .await;
    assert_eq!(
        up.count(),
        0,
        "a broken body was forwarded: {:?}",
        up.tags()
    );
    assert_still_serves(&gate, "after").await;
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expect_100_continue_is_honoured_and_a_too_large_body_is_refused_unsent() {
    let (up, gate) = Gate::one_slot(4).max_body("1KiB").start_instant().await;

    // The client sends its head and waits for `100 Continue` before its body.
    let whole = raw_chat(
        &Req::chat("continued"),
        &["Expect: 100-continue", "Connection: close"],
    );
    let head_len = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut sock = gate.client().raw_unix().await;
    sock.write_all(&whole[..head_len]).await.unwrap();
    let interim = read_one_head(&mut sock).await;
    let interim = only(raw_responses(&interim));
    assert_eq!(interim.status, 100, "{interim:?}");
    sock.write_all(&whole[head_len..]).await.unwrap();
    let got = read_until_closed(&mut sock, CLOSE_BOUND)
        .await
        .expect("closed after the answer");
    assert_tagged(&only(raw_responses(&got)), "continued");

    // Content-Length over --max-body: refused from the head alone, the body never sent.
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        1 << 20
    );
    let got = exchange(&gate, head.as_bytes()).await;
    let resp = only(raw_responses(&got));
    assert_eq!(resp.status, 413, "{resp:?}");
    let (_, code) = parse_error(&resp.text());
    assert_eq!(code, "body_too_large");

    assert_eq!(up.tags(), ["continued"]);
    gate.assert_settled(&up, 1).await;
}
