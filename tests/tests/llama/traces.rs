//! Traces with the real llama-server (its own defaults: 4 slots over one shared KV pool): a streamed
//! chat through slotgate, traced from a caller's `traceparent`, arrives at an OTLP/HTTP receiver as
//! one trace whose server and upstream spans carry the usage llama-server reported, the first token
//! as an event, and llama-server answered the request that carried slotgate's `traceparent`.

use std::time::Duration;

use slotgate_tests::llama::{chat, serial, stream_usage, LlamaServer};
use slotgate_tests::otlp::OtlpReceiver;
use slotgate_tests::*;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_chat_is_traced_with_llama_servers_own_usage() {
    let _one = serial().await;
    let llama = LlamaServer::start_default(8192, &[]).await;
    let otlp = OtlpReceiver::start();
    let gate = Gate::new()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_SERVICE_NAME", "slotgate-e2e")
        .start_before(&llama)
        .await;
    let traceparent = format!("00-{TRACE}-b7ad6b7169203331-01");
    let stream = gate
        .client()
        .stream_with_headers(
            CHAT,
            &chat("a lighthouse", 24, true),
            &[
                ("traceparent", &traceparent),
                ("x-request-id", "traced-e2e"),
            ],
        )
        .await;
    assert_eq!(stream.status, 200);
    let usage = stream_usage(&stream.read_sse(Duration::from_secs(60)).await, 24);

    let spans = otlp
        .wait_for(
            |s| s.iter().any(|s| s.trace_id == TRACE && s.kind == "server"),
            Duration::from_secs(10),
        )
        .await;
    let server = spans
        .iter()
        .find(|s| s.trace_id == TRACE && s.kind == "server")
        .unwrap();
    assert_eq!(server.service_name, "slotgate-e2e");
    assert_eq!(server.attr_str("slotgate.request_id"), Some("traced-e2e"));
    assert_eq!(server.attr_str("slotgate.outcome"), Some("ok"));
    assert_eq!(
        server.attr_i64("gen_ai.usage.input_tokens"),
        Some(usage.prompt as i64)
    );
    assert_eq!(server.attr_i64("gen_ai.usage.output_tokens"), Some(24));
    assert_eq!(server.attr_i64("gen_ai.request.max_tokens"), Some(24));
    let upstream = spans
        .iter()
        .find(|s| s.trace_id == TRACE && s.kind == "client")
        .unwrap_or_else(|| panic!("no upstream span in {spans:#?}"));
    assert_eq!(upstream.parent_span_id, server.span_id);
    assert_eq!(upstream.attr_i64("gen_ai.usage.output_tokens"), Some(24));
    assert!(
        upstream.events_named("gen_ai.first_token").next().is_some(),
        "{upstream:#?}"
    );
    gate.assert_idle().await;
    llama.assert_idle().await;
}
