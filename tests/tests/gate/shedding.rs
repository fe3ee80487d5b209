//! Sheddable work yields its slot (docs/scheduling.md#shedding), on the fake llama-server: with
//! `--sheddable-priority 10`, a request of priority 10 or more holding the one slot gives it to a
//! more urgent one. A stream under way ends with the documented error event in its API's shape and
//! then the abort, its upstream connection closed; a whole answer not yet come goes back to its place
//! in the queue and is answered once, later. The access line, `/status`, `/live` and the metrics
//! say so. The same on the real llama-server, with the SDKs: `tests/tests/llama/service_levels.rs`.

use std::time::Duration;

use slotgate_tests::*;

const COMPLETION: &str = "/completion";

async fn shedding_gate() -> (RunningUpstream, RunningGate) {
    Gate::one_slot(4)
        .queue_timeout("30s")
        .trust_client_priority()
        .opt("--sheddable-priority", 10)
        .opt("--log-format", "json")
        .start_instant()
        .await
}

/// The access line of the request with this `X-Request-Id`.
async fn access_line(gate: &RunningGate, id: &str) -> serde_json::Value {
    eventually(Duration::from_secs(5), "its access line", || async {
        gate.stderr_text().lines().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["target"] == "slotgate::access" && v["request_id"] == id).then_some(v)
        })
    })
    .await
}

/// Streams `background` (with `headers`) until its first event, then sends an urgent chat of
/// `priority` after `after`: the urgent answer (200) and how the background stream ended.
async fn stream_then_urgent(
    gate: &RunningGate,
    background: Req,
    headers: &[(&str, &str)],
    after: Duration,
    priority: i64,
) -> (slotgate_tests::Response, SseRead) {
    let client = gate.client();
    let mut stream = client
        .stream_with_headers(CHAT, &background.json(), headers)
        .await;
    assert_eq!(stream.status, 200);
    stream.first_event(Duration::from_secs(5)).await;
    let reader = tokio::spawn(stream.read_sse(Duration::from_secs(30)));
    tokio::time::sleep(after).await;
    let urgent = client
        .post_chat(&Req::chat("urgent").priority(priority))
        .await;
    assert_eq!(urgent.status, 200, "{}", urgent.body);
    (urgent, reader.await.unwrap())
}

/// A background stream holds the slot; a request of its own kind (priority 20) queues behind it
/// and sheds nothing; an urgent one (priority 0) takes the slot at once. The stream ends with the
/// `shed` error event in the shape of its API (OpenAI chat, llama-server's own `/completion`), no
/// `[DONE]`, then the abort; its upstream connection is closed; it is counted `shed` everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sheddable_stream_yields_to_an_urgent_request_with_the_documented_error() {
    let (up, gate) = shedding_gate().await;
    let client = gate.client();
    for (round, path) in [CHAT, COMPLETION].into_iter().enumerate() {
        let id = format!("bg-{round}");
        let body = match path {
            CHAT => Req::chat(&id),
            _ => Req::from_json(serde_json::json!({"prompt": "hi", "fake_tag": id})),
        }
        .chunks(500, ms(20))
        .priority(10);
        let mut stream = client
            .stream_with_headers(path, &body.json(), &[("x-request-id", id.as_str())])
            .await;
        assert_eq!(stream.status, 200);
        stream.first_event(Duration::from_secs(5)).await;
        assert_eq!(gate.status().await["shedding"]["sheddable_in_service"], 1);
        let reader = tokio::spawn(stream.read_sse(Duration::from_secs(30)));

        // Its own kind waits its turn and sheds nothing.
        let kin = gate
            .enqueue(&Req::chat(&format!("kin-{round}")).priority(20))
            .await;
        tokio::time::sleep(ms(200)).await;
        assert!(!reader.is_finished(), "shed for another sheddable request");
        assert_eq!(gate.status().await["shedding"]["yielding"], 0);

        let urgent = client
            .post_chat(&Req::chat(&format!("urgent-{round}")).priority(0))
            .await;
        assert_eq!(urgent.status, 200, "{}", urgent.body);
        let waited = queue_wait_ms(&urgent);
        assert!(waited < 1_000, "the urgent request waited {waited} ms");

        let shed = reader.await.unwrap();
        let last = shed.data.last().expect("events before the error");
        let event: serde_json::Value = serde_json::from_str(last).unwrap();
        assert_eq!(event["error"]["code"], "shed", "{last}");
        assert_eq!(event["error"]["type"], "server_error", "{last}");
        let retry_ms = event["error"]["retry_after_ms"].as_u64().unwrap();
        assert!(retry_ms >= 1, "{last}");
        let message = event["error"]["message"].as_str().unwrap();
        assert!(message.contains("retry after"), "{message}");
        assert!(
            shed.data.len() > 1 && shed.data.len() < 400,
            "{} events: ended long before its 500",
            shed.data.len()
        );
        assert!(!shed.done, "no [DONE] after a shed: {}", shed.raw);
        assert!(shed.error.is_some(), "aborted after the error event");
        // The fake saw its reader go: slotgate closed the upstream connection.
        eventually(
            Duration::from_secs(5),
            "the upstream stream cancelled",
            || async { (up.cancelled() > round).then_some(()) },
        )
        .await;

        let (kin, _) = kin.await.unwrap();
        assert_eq!(kin.status, 200, "{}", kin.body);
        let line = access_line(&gate, &id).await;
        assert_eq!(line["outcome"], "shed", "{line}");
        assert_eq!(line["priority"], 10, "{line}");
        assert_eq!(line["status"], 200, "{line}");
        assert!(line["retry_after"].as_u64() >= Some(1), "{line}");
        gate.wait_outcome("shed", round as u64 + 1).await;
        gate.assert_idle().await;
    }
    gate.wait_metric("slotgate_shed_total", &[("stage", "after_first_byte")], 2.0)
        .await;
    let s = gate.status().await;
    let shedding = &s["shedding"];
    assert_eq!(shedding["sheddable_priority"], 10, "{s}");
    assert_eq!(shedding["shed_after_first_byte"], 2, "{s}");
    assert_eq!(shedding["shed_before_first_byte"], 0, "{s}");
    assert_eq!(
        (&shedding["sheddable_in_service"], &shedding["yielding"]),
        (&0.into(), &0.into()),
        "{s}"
    );
    gate.assert_settled(&up, 1).await;
}

/// A whole answer (not streamed: its head comes with the end) is shed before its first byte: its
/// upstream attempt is dropped, it goes back to its place in the queue, and once the urgent request
/// is done it is forwarded again and its client gets one answer, 200, having waited. The access
/// line says `shed=1`, the metrics `before_first_byte`, and `/live` showed it queued again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_answer_shed_before_it_came_is_answered_once_after_the_urgent_one() {
    let (up, gate) = shedding_gate().await;
    let client = gate.client();
    let background = Req::chat("bg")
        .delay(ms(1_500))
        .priority(10)
        .header("x-request-id", "bg-whole");
    let bg = gate.hold_slot(&background).await;
    tokio::time::sleep(ms(200)).await;
    let urgent = spawn_post(
        &client,
        CHAT,
        &Req::chat("urgent").delay(ms(500)).priority(0),
    );
    // While the urgent request runs, the shed one waits in the queue again, its shed counted.
    let live = eventually(
        Duration::from_secs(5),
        "the shed request queued",
        || async {
            let live = gate.admin_get("/live").await.json();
            live["requests"]
                .as_array()?
                .iter()
                .any(|r| r["request_id"] == "bg-whole" && r["phase"] == "queued" && r["shed"] == 1)
                .then_some(live)
        },
    )
    .await;
    assert_eq!(live["slots"]["shed_before_first_byte"], 1, "{live}");
    let (urgent, _) = urgent.await.unwrap();
    assert_eq!(urgent.status, 200, "{}", urgent.body);
    assert!(queue_wait_ms(&urgent) < 1_000, "{:?}", urgent.headers);
    let (bg, took) = bg.await.unwrap();
    assert_eq!(bg.status, 200, "{}", bg.body);
    assert_eq!(bg.json()["fake_tag"], "bg", "{}", bg.body);
    assert!(
        queue_wait_ms(&bg) >= 400,
        "its wait for the slot again counts: {:?}",
        bg.headers
    );
    assert!(took >= ms(2_000), "answered after the urgent one: {took:?}");
    // Forwarded twice (the first attempt dropped), answered once, after the urgent one.
    assert_eq!(up.tags(), ["bg", "urgent", "bg"]);
    let line = access_line(&gate, "bg-whole").await;
    assert_eq!(line["outcome"], "ok", "{line}");
    assert_eq!(line["shed"], 1, "{line}");
    gate.wait_metric(
        "slotgate_shed_total",
        &[("stage", "before_first_byte")],
        1.0,
    )
    .await;
    let s = gate.status().await;
    assert_eq!(s["shedding"]["shed_before_first_byte"], 1, "{s}");
    assert_eq!(s["shedding"]["shed_after_first_byte"], 0, "{s}");
    gate.assert_idle().await;
    gate.assert_fds_settled().await;
}

/// Without `--sheddable-priority` nobody yields: the urgent request waits for the background
/// stream to end, which ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_is_shed_without_the_setting() {
    let (up, gate) = Gate::one_slot(4)
        .queue_timeout("30s")
        .trust_client_priority()
        .start_instant()
        .await;
    let bg = Req::chat("bg").chunks(30, ms(20)).priority(10);
    let (urgent, shed) = stream_then_urgent(&gate, bg, &[], Duration::ZERO, -10).await;
    assert!(shed.complete(), "{}", shed.raw);
    assert!(queue_wait_ms(&urgent) >= 300, "{:?}", urgent.headers);
    let s = gate.status().await;
    assert!(s["shedding"]["sheddable_priority"].is_null(), "{s}");
    assert_eq!(s["shedding"]["shed_after_first_byte"], 0, "{s}");
    gate.assert_settled(&up, 1).await;
}

/// A request that names a conversation (`X-Conversation-Id`) is never shed, whatever its
/// priority: llama-server finishes such an answer into the conversation whatever the connection,
/// so closing it would free nothing. The urgent request waits for it to end, and it ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conversation_is_never_shed() {
    let (up, gate) = shedding_gate().await;
    let talk = Req::chat("talk").chunks(30, ms(20)).priority(10);
    let conversation = [("x-conversation-id", "conv-1")];
    // Not even counted sheddable while it streams (looked at once it holds the slot).
    let watch = async { gate.wait_busy(1).await["shedding"]["sheddable_in_service"].clone() };
    let ((urgent, talk), sheddable) = tokio::join!(
        stream_then_urgent(&gate, talk, &conversation, ms(100), 0),
        watch
    );
    assert_eq!(sheddable, 0);
    assert!(talk.complete(), "{}", talk.raw);
    assert!(queue_wait_ms(&urgent) >= 300, "{:?}", urgent.headers);
    assert_eq!(gate.status().await["shedding"]["shed_after_first_byte"], 0);
    gate.assert_settled(&up, 1).await;
}

/// A stream whose last event (`[DONE]`) has gone is over for its client; only its end is still to
/// read. Told to yield then, it ends as it is: no error event after `[DONE]`, not counted shed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_whose_done_has_gone_ends_as_it_is() {
    let (up, gate) = shedding_gate().await;
    let bg = Req::chat("bg")
        .chunks(3, ms(10))
        .set("fake_linger_ms", 1_500)
        .priority(10);
    // Its [DONE] is out 300 ms on; the fake holds the stream open a while longer.
    let (_, bg) = stream_then_urgent(&gate, bg, &[], ms(300), 0).await;
    assert!(bg.complete(), "{}", bg.raw);
    assert!(!bg.raw.contains("\"shed\""), "{}", bg.raw);
    let s = gate.status().await;
    assert_eq!(s["shedding"]["shed_after_first_byte"], 0, "{s}");
    gate.assert_settled(&up, 1).await;
}

/// llama-server's events may reach slotgate cut across frames. A shed that comes mid-event waits
/// for the event's end: the error event is never glued to half of another, and every event the
/// client gets parses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_error_event_never_lands_inside_another() {
    let (up, gate) = shedding_gate().await;
    let bg = Req::chat("bg")
        .chunks(500, ms(20))
        .set("fake_split_events", true)
        .priority(10);
    let (_, shed) = stream_then_urgent(&gate, bg, &[], ms(200), 0).await;
    for data in &shed.data {
        serde_json::from_str::<serde_json::Value>(data)
            .unwrap_or_else(|e| panic!("an event that does not parse ({e}): {data}"));
    }
    let last: serde_json::Value = serde_json::from_str(shed.data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "shed", "{last}");
    gate.assert_settled(&up, 1).await;
}
