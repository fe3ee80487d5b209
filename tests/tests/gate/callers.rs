//! Who is asking (docs/security.md#who-is-asking), on the fake llama-server playing `--api-key`:
//! the credential slotgate charges is the one llama-server checks, read by its rules; a request
//! whose credentials could be read two ways is refused with 400 before anything is charged; a caller
//! llama-server would refuse is refused with its 401 before it is charged, counted or queued; and
//! only the caller who started a conversation reads or stops it.

use std::time::Duration;

use http::Method;
use serde_json::json;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{hash_key, Gate, RunningGate};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::unique_dir;

/// The key llama-server (the fake) takes.
const KEY: &str = "sk-the-real-key-0001";

/// llama-server's own refusal of a key, which slotgate answers in its place.
const INVALID_KEY: &str =
    r#"{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}"#;

/// A one-slot gate holding `KEY` for its own calls, in front of a fake that checks keys.
async fn keyed() -> (slotgate_tests::fake_upstream::RunningUpstream, RunningGate) {
    let dir = unique_dir("callers");
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("upstream-key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    Gate::one_slot(8)
        .opt("--upstream-api-key-file", key_file.display())
        .start_with(FakeUpstream::instant().api_key(KEY))
        .await
}

fn chat() -> serde_json::Value {
    json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_llama_server_would_refuse_is_refused_before_it_is_charged() {
    let (up, gate) = keyed().await;
    let client = gate.client();
    let body = chat().to_string();
    for headers in [
        &[][..],
        &[("authorization", "Bearer sk-made-up")],
        &[("x-api-key", "sk-made-up-too")],
        // Another spelling of the scheme is part of the key for llama-server.
        &[("authorization", "bearer sk-the-real-key-0001")],
    ] {
        let resp = client
            .send_with(Method::POST, CHAT, headers, body.clone())
            .await;
        assert_eq!(resp.status, 401, "{headers:?}: {}", resp.body);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&resp.body).unwrap(),
            serde_json::from_str::<serde_json::Value>(INVALID_KEY).unwrap(),
            "llama-server's own answer"
        );
        assert!(
            resp.header("x-slotgate-prompt-tokens").is_none(),
            "nothing counted for a refused caller"
        );
    }
    assert_eq!(
        up.requests_seen().len(),
        0,
        "no refused caller reached a slot"
    );
    // The key llama-server takes, in each spelling llama-server takes it.
    for headers in [
        &[("authorization", "Bearer sk-the-real-key-0001")][..],
        &[("authorization", KEY)],
        &[("x-api-key", KEY)],
        &[("authorization", ""), ("x-api-key", KEY)],
    ] {
        let resp = client
            .send_with(Method::POST, CHAT, headers, body.clone())
            .await;
        assert_eq!(resp.status, 200, "{headers:?}: {}", resp.body);
    }
    // One tenant for the four: the key llama-server checked.
    let usage = gate.admin_get("/usage").await.json();
    let rows = usage["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{usage}");
    assert_eq!(rows[0]["tenant"], hash_key(KEY), "{usage}");
    assert_eq!(rows[0]["requests"], 4, "{usage}");
    assert_eq!(rows[0]["model"], "fake", "the model llama-server serves");
    let refused = gate
        .metric("slotgate_callers_refused_total", &[("reason", "no_key")])
        .await;
    assert_eq!(refused, Some(1.0));
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_read_two_ways_are_refused_before_anything_is_charged() {
    let (up, gate) = keyed().await;
    let client = gate.client();
    let body = chat().to_string();
    // The two tricks that made llama-server serve a spent key while slotgate charged another.
    let tricks: [&[(&str, &str)]; 3] = [
        &[("authorization", KEY), ("x-api-key", "sk-random-1")],
        &[
            ("authorization", "Bearer sk-random-2"),
            ("connection", "authorization"),
            ("x-api-key", KEY),
        ],
        &[("x-api-key", KEY), ("connection", "keep-alive, X-Api-Key")],
    ];
    for headers in tricks {
        let resp = client
            .send_with(Method::POST, CHAT, headers, body.clone())
            .await;
        assert_eq!(resp.status, 400, "{headers:?}: {}", resp.body);
        assert_eq!(
            resp.json()["error"]["code"],
            "ambiguous_credentials",
            "{}",
            resp.body
        );
        assert!(!resp.body.contains(KEY), "the key is not echoed");
    }
    assert_eq!(up.requests_seen().len(), 0, "nothing reached llama-server");
    let usage = gate.admin_get("/usage").await.json();
    assert_eq!(usage["rows"], json!([]), "nothing booked: {usage}");
    let ambiguous = gate
        .metric("slotgate_callers_refused_total", &[("reason", "ambiguous")])
        .await;
    assert_eq!(ambiguous, Some(3.0));
    gate.assert_settled(&up, 1).await;
}

/// `DELETE` or `GET /v1/stream?conv_id=ID` with these headers; its status.
async fn stream_route(gate: &RunningGate, method: Method, id: &str, key: Option<&str>) -> u16 {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let path = format!("/v1/stream?conv_id={id}");
    gate.client()
        .send_with(method, &path, &headers, "")
        .await
        .status
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_caller_who_started_a_conversation_stops_or_reads_it() {
    // An open llama-server: keys are tenants, and a keyless caller on the socket is its uid.
    let (up, gate) = Gate::one_slot(8).start_instant().await;
    let holder = gate
        .hold_slot(&Req::chat("hold").delay(Duration::from_millis(1500)))
        .await;
    let victim = gate
        .enqueue(
            &Req::chat("victim")
                .api_key("sk-alice")
                .header("x-conversation-id", "conv-alice"),
        )
        .await;
    // Another tenant, and a keyless caller, each try to stop and to read it; and an id nobody has.
    for key in [Some("sk-mallory"), None] {
        let stop = stream_route(&gate, Method::DELETE, "conv-alice", key).await;
        let stop_unknown = stream_route(&gate, Method::DELETE, "conv-nobody", key).await;
        assert_eq!(
            stop, stop_unknown,
            "a stop says nothing of whether the id exists"
        );
        let read = stream_route(&gate, Method::GET, "conv-alice", key).await;
        let read_unknown = stream_route(&gate, Method::GET, "conv-nobody", key).await;
        assert_eq!(
            read, read_unknown,
            "a read says nothing of whether the id exists"
        );
        assert_ne!(read, 503, "not told the conversation waits");
    }
    let lookup = gate
        .client()
        .send_with(
            Method::POST,
            "/v1/streams/lookup",
            &[("authorization", "Bearer sk-mallory")],
            json!({"conversation_ids": ["conv-alice"]}).to_string(),
        )
        .await;
    assert_ne!(lookup.status, 503);
    let status = gate.status().await;
    assert_eq!(
        status["queue"]["depth"], 1,
        "the victim still waits: {status}"
    );
    // Its own caller reads it (told to come back) and stops it.
    assert_eq!(
        stream_route(&gate, Method::GET, "conv-alice", Some("sk-alice")).await,
        503
    );
    stream_route(&gate, Method::DELETE, "conv-alice", Some("sk-alice")).await;
    let (resp, _) = victim.await.unwrap();
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert!(resp.body.contains("cancelled by a stop"), "{}", resp.body);
    let (held, _) = holder.await.unwrap();
    assert_eq!(held.status, 200);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ledger_books_the_served_model_not_the_name_a_client_sends() {
    let (up, gate) = keyed().await;
    let client = gate.client();
    let names = 65_000;
    // Many clients at once, each a run of model names of its own.
    let workers = 16;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..names).step_by(workers) {
                let path = format!("/v1/models?model=m-{i}");
                let resp = client
                    .get_with(&path, &[("authorization", &format!("Bearer {KEY}"))])
                    .await;
                assert_eq!(resp.status, 200, "{}", resp.body);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // A request naming a model never seen is booked under the served one too.
    let resp = client
        .send_with(
            Method::POST,
            CHAT,
            &[("authorization", &format!("Bearer {KEY}"))],
            json!({"model": "brand-new", "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        )
        .await;
    assert_eq!(resp.status, 200);
    let usage = gate.admin_get("/usage").await.json();
    let rows = usage["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "one tenant, one served model: {usage}");
    assert_eq!(rows[0]["model"], "fake");
    assert_eq!(rows[0]["tenant"], hash_key(KEY));
    assert_eq!(rows[0]["requests"], names as u64 + 1);
    gate.assert_settled(&up, 1).await;
}
