//! Every request traceable: one request id (the client's `X-Request-Id` when it is a safe one, else
//! one slotgate makes) on the response, on the request llama-server gets and on the access line; a
//! refusal names its reason in `X-Slotgate-Reason` and its line carries the Retry-After; a TCP
//! client's line carries its address.

use std::time::Duration;

use slotgate_tests::gate::free_port;
use slotgate_tests::*;

/// The JSON access line with this request id, once it is written.
async fn line_of(gate: &RunningGate, id: &str) -> serde_json::Value {
    eventually(
        Duration::from_secs(3),
        "the access line of the request",
        || async {
            gate.stderr_text().lines().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["target"] == "slotgate::access" && v["request_id"] == id).then_some(v)
            })
        },
    )
    .await
}

/// One chat request tagged `tag` with `X-Request-Id: id`, answered 200.
async fn served_with_id(gate: &RunningGate, tag: &str, id: &str) -> Response {
    let resp = gate
        .client()
        .post_chat(&Req::chat(tag).header("x-request-id", id))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_id_follows_a_request_to_llama_server_and_back_and_into_the_log() {
    let (up, gate) = Gate::new()
        .opt("--log-format", "json")
        .start_instant()
        .await;
    let client = gate.client();

    // The client's own id is kept.
    let resp = client
        .post_chat(&Req::chat("own").header("x-request-id", "trace-7:abc"))
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.header("x-request-id").as_deref(), Some("trace-7:abc"));
    let line = line_of(&gate, "trace-7:abc").await;
    assert_eq!(line["outcome"], "ok");
    // The fake reports its usage: the line says what the request used.
    assert!(line["prompt_tokens"].as_u64().is_some(), "{line}");
    assert!(line["completion_tokens"].as_u64().is_some(), "{line}");

    // None, or one that cannot be carried safely: slotgate makes one.
    let none = client.post_chat(&Req::chat("none")).await;
    let bad = client
        .post_chat(&Req::chat("bad").header("x-request-id", "a b;c"))
        .await;
    let mut made = Vec::new();
    for resp in [&none, &bad] {
        assert_eq!(resp.status, 200, "{}", resp.body);
        let id = resp.header("x-request-id").expect("every answer has an id");
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        line_of(&gate, &id).await;
        made.push(id);
    }
    assert_ne!(made[0], made[1]);

    // llama-server got each request with the same id.
    let seen: Vec<Option<String>> = up
        .request_ids_seen()
        .into_iter()
        .filter(|(path, _)| path == CHAT)
        .map(|(_, id)| id)
        .collect();
    assert_eq!(
        seen,
        [
            Some("trace-7:abc".to_owned()),
            Some(made[0].clone()),
            Some(made[1].clone())
        ]
    );
    gate.assert_settled(&up, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_names_its_reason_and_its_line_the_retry_after() {
    let (up, gate) = Gate::one_slot(0)
        .opt("--log-format", "json")
        .start_instant()
        .await;
    let client = gate.client();
    let hold = gate.hold_slot(&Req::chat("hold").delay(ms(600))).await;
    let refused = client
        .post_chat(&Req::chat("extra").header("x-request-id", "refused-1"))
        .await;
    assert_error(&refused, 429, "queue_full");
    assert_eq!(
        refused.header("x-slotgate-reason").as_deref(),
        Some("queue_full")
    );
    assert_eq!(refused.header("x-request-id").as_deref(), Some("refused-1"));
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    let line = line_of(&gate, "refused-1").await;
    assert_eq!(line["outcome"], "queue_full");
    assert_eq!(line["retry_after"].as_u64(), Some(retry), "{line}");

    // A bad request is a refusal too.
    let bad = client.post_raw(CHAT, "{not json").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(
        bad.header("x-slotgate-reason").as_deref(),
        Some("bad_request")
    );
    // An answer is not.
    let (held, _) = hold.await.unwrap();
    assert_eq!(held.status, 200);
    assert_eq!(held.header("x-slotgate-reason"), None);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tcp_clients_line_carries_its_address() {
    let (up, gate) = Gate::new()
        .listen(format!("tcp:127.0.0.1:{}", free_port()))
        .opt("--log-format", "json")
        .start_instant()
        .await;
    served_with_id(&gate, "tcp", "tcp-1").await;
    let line = line_of(&gate, "tcp-1").await;
    let addr = line["peer_addr"]
        .as_str()
        .unwrap_or_else(|| panic!("no peer_addr: {line}"));
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    assert!(
        line.get("peer_uid").is_none(),
        "a TCP peer has no credentials: {line}"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debug_logging_follows_a_request_through_its_phases() {
    let (up, gate) = Gate::new()
        .env("SLOTGATE_LOG", "slotgate=debug")
        .start_instant()
        .await;
    served_with_id(&gate, "dbg", "dbg-1").await;
    gate.assert_settled(&up, 1).await;
    let log = gate.stderr_text();
    let mine: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("request_id=dbg-1"))
        .collect();
    for phase in ["routes:", "intake:", "decide:", "admit:", "forward:"] {
        assert!(
            mine.iter()
                .any(|l| l.contains(phase) && l.contains("DEBUG")),
            "no {phase} line for the request:\n{log}"
        );
    }
    assert!(mine.iter().any(|l| l.contains("slotgate::access")), "{log}");
}
