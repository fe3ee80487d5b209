//! An answer from llama-server is `ok` only when llama-server served it: its 5xx is `upstream_5xx`
//! (the `SlotgateUpstreamFailures` alert counts it), its 4xx `upstream_4xx`, in the access log and in
//! `slotgate_requests_total` alike. Nothing it refused is charged to the tenant.

use slotgate_tests::fake_upstream::Scripted;
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_servers_failures_and_refusals_are_counted_as_such() {
    let (up, gate) = Gate::new()
        .slots(1)
        .start_with(FakeUpstream::errors([
            Scripted::ServerError,
            Scripted::Busy,
            Scripted::BadRequest,
        ]))
        .await;
    for (want, tag) in [(500, "a"), (503, "b"), (400, "c")] {
        let resp = gate
            .client()
            .post_json(CHAT, &Req::chat(tag).api_key("k").json())
            .await;
        assert_eq!(resp.status, want, "{}", resp.body);
    }
    let ok = gate
        .client()
        .post_json(CHAT, &Req::chat("fine").api_key("k").json())
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    gate.wait_outcome("upstream_5xx", 2).await;
    gate.wait_outcome("upstream_4xx", 1).await;
    gate.wait_outcome("ok", 1).await;
    let log = gate.stderr_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("slotgate::access"))
        .collect();
    for (outcome, status) in [
        ("upstream_5xx", 500),
        ("upstream_5xx", 503),
        ("upstream_4xx", 400),
        ("ok", 200),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("outcome={outcome}"))
                    && l.contains(&format!("status={status}"))),
            "no access line with outcome={outcome} status={status}:\n{}",
            lines.join("\n")
        );
    }
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("outcome=ok") && !l.contains("status=200")),
        "{lines:#?}"
    );
    // Only the answer that was served is charged: its usage, 10 + 5 by the fake.
    let m = gate.metrics().await;
    let charged: f64 = m.sum("slotgate_tenant_tokens_total", &[]);
    assert_eq!(charged, 15.0, "{}", m.text);
    gate.assert_settled(&up, 1).await;
}
