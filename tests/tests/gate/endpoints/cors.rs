//! CORS as llama-server does it: a preflight is llama-server's to answer (slotgate answers for it
//! while it is down), and slotgate's own answers carry the `Access-Control-Allow-Origin` llama-server
//! would have sent. The fake answers preflights with llama-server's default rule (echo the origin);
//! the real llama-server's other rules are in `llama_today/cors.rs`.

use http::Method;
use slotgate_tests::*;

const ORIGIN: &str = "http://app.example";

fn assert_allows_origin(resp: &Response) {
    assert_eq!(
        resp.header("access-control-allow-origin").as_deref(),
        Some(ORIGIN),
        "{}",
        resp.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn preflights_and_slotgates_own_answers_carry_llama_servers_cors_headers() {
    let (up, gate) = Gate::one_slot(0).start_instant().await;
    let client = gate.client();
    let preflight = |client: Client| async move {
        client
            .send_with(
                Method::OPTIONS,
                "/v1/messages",
                &[
                    ("origin", ORIGIN),
                    ("access-control-request-method", "POST"),
                ],
                "",
            )
            .await
    };
    let resp = preflight(client.clone()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_allows_origin(&resp);
    assert_eq!(
        resp.header("access-control-allow-methods").as_deref(),
        Some("GET, POST, DELETE, OPTIONS")
    );

    // slotgate's own refusal (a full queue) as llama-server would answer a browser.
    let held = gate.hold_slot(&Req::chat("held").delay(ms(300))).await;
    let refused = client
        .post_chat(&Req::chat("late").header("origin", ORIGIN))
        .await;
    assert_error(&refused, 429, "queue_full");
    assert_allows_origin(&refused);
    held.await.unwrap();
    let health = client.get_with("/health", &[("origin", ORIGIN)]).await;
    assert_allows_origin(&health);
    gate.assert_settled(&up, 1).await;

    // llama-server down: slotgate answers the preflight as llama-server would.
    up.stop();
    eventually(
        std::time::Duration::from_secs(10),
        "upstream down",
        || async { (gate.readyz().await == 503).then_some(()) },
    )
    .await;
    let resp = preflight(client.clone()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_allows_origin(&resp);
    assert_eq!(
        resp.header("access-control-allow-credentials").as_deref(),
        Some("true")
    );
}
