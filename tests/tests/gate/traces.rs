//! OpenTelemetry traces against a real OTLP/HTTP receiver that decodes the protobuf
//! (`slotgate_tests::otlp`): a server span per request continuing the caller's `traceparent`, a
//! child per phase, the upstream client span whose context llama-server gets as its `traceparent`
//! with the first token as an event, GenAI and slotgate attributes; a refusal traced with its
//! reason. Off (no `OTEL_EXPORTER_OTLP_ENDPOINT`), nothing is exported and the caller's
//! `traceparent` reaches llama-server as it came.

use std::time::Duration;

use slotgate_tests::gate::command;
use slotgate_tests::otlp::{OtlpReceiver, ReceivedSpan, Traceparent};
use slotgate_tests::*;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn caller() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_is_one_trace_continuing_the_callers_through_to_llama_server() {
    let otlp = OtlpReceiver::start();
    let (up, gate) = Gate::one_slot(1)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .start_instant()
        .await;
    let client = gate.client();
    // One in service, so the traced request waits in the queue; a third is refused.
    let first = spawn_post(
        &client,
        CHAT,
        &Req::chat("first").chunks(10, Duration::from_millis(40)),
    );
    gate.wait_status(Duration::from_secs(3), "one in service", |s| {
        s["slots"]["busy"] == 1
    })
    .await;
    let traced = Req::chat("traced")
        .chunks(5, Duration::from_millis(20))
        .set("max_tokens", 7)
        .header("traceparent", &caller())
        .header("x-request-id", "traced-1");
    let traced = spawn_post(&client, CHAT, &traced);
    gate.wait_queue_depth(1).await;
    let refused = client
        .post_chat(&Req::chat("refused").header("x-request-id", "refused-1"))
        .await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    for (resp, _) in join_all(vec![first, traced]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }

    let spans = otlp
        .wait_for(
            |s| {
                s.iter().filter(|s| s.kind == "server").count() >= 3
                    && s.iter().filter(|s| s.kind == "client").count() >= 2
            },
            Duration::from_secs(10),
        )
        .await;
    let server = spans
        .iter()
        .find(|s| s.attr_str("slotgate.request_id") == Some("traced-1"))
        .unwrap_or_else(|| panic!("no server span of traced-1 in {spans:#?}"));
    // The caller's trace, continued.
    assert_eq!(
        (server.trace_id.as_str(), server.parent_span_id.as_str()),
        (CALLER_TRACE, CALLER_SPAN)
    );
    assert_eq!(server.name, "POST /v1/chat/completions");
    assert_eq!(server.kind, "server");
    assert_eq!(server.status, "ok");
    assert_eq!(server.service_name, "slotgate");
    let attr = |k: &str| {
        server
            .attr(k)
            .cloned()
            .unwrap_or_else(|| panic!("no {k} on {server:#?}"))
    };
    assert_eq!(attr("http.request.method"), "POST");
    assert_eq!(attr("url.path"), CHAT);
    assert_eq!(attr("http.response.status_code"), 200);
    assert_eq!(attr("slotgate.outcome"), "ok");
    assert_eq!(attr("gen_ai.operation.name"), "chat");
    assert_eq!(attr("gen_ai.provider.name"), "llama.cpp");
    assert_eq!(attr("gen_ai.request.model"), "fake");
    assert_eq!(attr("gen_ai.request.max_tokens"), 7);
    assert_eq!(attr("gen_ai.usage.input_tokens"), 10);
    assert_eq!(attr("gen_ai.usage.output_tokens"), 5);
    assert!(
        server.attr_i64("slotgate.queue_wait_ms").unwrap() > 50,
        "{server:#?}"
    );
    assert!(server.attr_str("slotgate.tenant").is_some(), "{server:#?}");

    // Its phases, children of the server span, in order, inside it.
    let children: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id == server.span_id)
        .collect();
    let mut names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["chat fake", "intake", "policy", "queue"],
        "{children:#?}"
    );
    for c in &children {
        assert_eq!(c.trace_id, CALLER_TRACE);
        assert!(
            c.start_unix_nanos >= server.start_unix_nanos
                && c.end_unix_nanos <= server.end_unix_nanos,
            "{c:#?}"
        );
    }
    let queue = children.iter().find(|s| s.name == "queue").unwrap();
    assert!(queue.duration() >= Duration::from_millis(50), "{queue:#?}");
    // Counted while it waited: under the queue.
    for count in named(&spans, "count") {
        if count.trace_id == CALLER_TRACE {
            assert_eq!(count.parent_span_id, queue.span_id, "{count:#?}");
        }
    }
    let upstream = children.iter().find(|s| s.name == "chat fake").unwrap();
    assert_eq!(upstream.kind, "client");
    assert_eq!(upstream.attr_i64("http.response.status_code"), Some(200));
    assert_eq!(upstream.attr_i64("gen_ai.usage.output_tokens"), Some(5));
    let first_token = upstream
        .events_named("gen_ai.first_token")
        .next()
        .expect("a first-token event");
    assert!(first_token.time_unix_nanos > upstream.start_unix_nanos);
    // llama-server got the upstream span's context as its traceparent.
    let seen: Vec<Traceparent> = up
        .traceparents_seen()
        .into_iter()
        .filter(|(path, _)| path == CHAT)
        .filter_map(|(_, tp)| Traceparent::parse(&tp?))
        .collect();
    let sent = seen
        .iter()
        .find(|tp| tp.trace_id == CALLER_TRACE)
        .unwrap_or_else(|| panic!("llama-server never saw the caller's trace: {seen:?}"));
    assert_eq!(sent.span_id, upstream.span_id);
    assert!(sent.sampled);

    // A refusal is traced too, with its reason; it is the client's, not an error of the server.
    let refusal = spans
        .iter()
        .find(|s| s.attr_str("slotgate.request_id") == Some("refused-1"))
        .unwrap_or_else(|| panic!("no span of the refusal in {spans:#?}"));
    assert_eq!(refusal.attr_i64("http.response.status_code"), Some(429));
    assert_eq!(refusal.attr_str("slotgate.outcome"), Some("queue_full"));
    assert_eq!(refusal.attr_str("error.type"), Some("queue_full"));
    assert!(
        refusal.attr_i64("slotgate.retry_after").is_some(),
        "{refusal:#?}"
    );
    assert_eq!(refusal.status, "ok");
    // Without a caller's traceparent: a trace of its own.
    assert!(refusal.parent_span_id.is_empty() && refusal.trace_id != CALLER_TRACE);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn off_nothing_is_exported_and_the_callers_traceparent_goes_through() {
    let (up, gate) = Gate::new().start_instant().await;
    let resp = gate
        .client()
        .post_json_with_headers(CHAT, &Req::chat("x").json(), &[("traceparent", &caller())])
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let seen: Vec<Option<String>> = up
        .traceparents_seen()
        .into_iter()
        .filter(|(p, _)| p == CHAT)
        .map(|(_, tp)| tp)
        .collect();
    assert_eq!(seen, [Some(caller())]);
    assert!(
        !gate.stderr_text().contains("traces are exported"),
        "{}",
        gate.stderr_text()
    );
    gate.assert_settled(&up, 4).await;
}

#[test]
fn an_otlp_protocol_slotgate_cannot_speak_is_refused_at_start() {
    let out = command()
        .args([
            "--upstream",
            "unix:/nonexistent.sock",
            "--admin-listen",
            "off",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported")
            && err.contains("http/protobuf"),
        "{err}"
    );
}
