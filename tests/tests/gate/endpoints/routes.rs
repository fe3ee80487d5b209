//! `/health` from slotgate's readiness, llama-server's whole-server endpoints on the admin listener
//! only, host endpoints refused unless enabled, and a 404 that says slotgate forwards every route.

use std::time::Duration;

use http::Method;
use slotgate_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_answers_from_slotgates_readiness_in_llama_servers_shape() {
    let (up, gate) = Gate::new().start_instant().await;
    let client = gate.client();
    let checks_before = up.health_checks();
    for path in ["/health", "/v1/health"] {
        let resp = client.get(path).await;
        assert_eq!(resp.status, 200, "{path}: {}", resp.body);
        assert_eq!(resp.json(), serde_json::json!({"status": "ok"}));
        assert_eq!(
            resp.header("content-type").as_deref(),
            Some("application/json; charset=utf-8")
        );
    }
    // Answered by slotgate: no extra probe reached llama-server for them, and nothing was logged
    // or counted as a request.
    assert!(
        up.health_checks() <= checks_before + 2,
        "the health loop's own probes only"
    );
    assert!(
        !gate.stderr_text().contains("path=/health"),
        "{}",
        gate.stderr_text()
    );

    // llama-server gone: 503 as llama-server answers while it cannot serve.
    up.stop();
    let resp = eventually(Duration::from_secs(10), "/health 503", || async {
        let r = client.get("/health").await;
        (r.status == 503).then_some(r)
    })
    .await;
    assert_eq!(
        resp.json(),
        serde_json::json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_server_endpoints_are_refused_to_clients_and_forwarded_on_the_admin_listener() {
    let (up, gate) = Gate::new().start_instant().await;
    for (method, path) in [
        (Method::GET, "/slots"),
        (Method::POST, "/slots/0?action=erase"),
        (Method::GET, "/lora-adapters"),
        (Method::POST, "/props"),
        (Method::POST, "/models/load"),
    ] {
        let resp = gate.client().request(method.clone(), path).await;
        let ty = assert_error(&resp, 403, "admin_endpoint");
        assert_eq!(ty, "permission_error", "{method} {path}");
        // On the admin listener they reach llama-server (the fake has none of them: its 404).
        let resp = gate.admin().request(method.clone(), path).await;
        assert_eq!(resp.status, 404, "{method} {path}: {}", resp.body);
        assert!(
            resp.body.contains("File Not Found"),
            "llama-server's answer: {}",
            resp.body
        );
    }
    let reached: Vec<String> = up.passthrough_seen();
    assert_eq!(
        reached,
        [
            "/slots",
            "/slots/0",
            "/lora-adapters",
            "/props",
            "/models/load"
        ],
        "each forwarded once, from the admin listener only"
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_admin_routes_forward_the_groups_named_and_no_other() {
    let (up, gate) = Gate::new().start_instant().await;
    let resp = gate.client().get("/slots").await;
    assert_error_says(&resp, 403, "admin_endpoint", "--client-admin-routes");
    drop(gate);

    let gate = Gate::new()
        .arg("--client-admin-routes")
        .arg("slots,metrics")
        .upstream(&up)
        .start()
        .await;
    let client = gate.client();
    for (method, path) in [
        (Method::GET, "/slots"),
        (Method::POST, "/slots/0?action=erase"),
        (Method::GET, "/metrics"),
    ] {
        // The fake's own answer: its metrics, a 404 for the slot routes it does not serve.
        let resp = client.request(method.clone(), path).await;
        let want = if path == "/metrics" { 200 } else { 404 };
        assert_eq!(resp.status, want, "{method} {path}: {}", resp.body);
        assert!(
            resp.header("x-slotgate-reason").is_none(),
            "{method} {path}"
        );
    }
    for (method, path) in [(Method::POST, "/props"), (Method::POST, "/models/load")] {
        let resp = client.request(method.clone(), path).await;
        assert_error(&resp, 403, "admin_endpoint");
    }
    assert_eq!(up.passthrough_seen(), ["/slots", "/slots/0", "/metrics"]);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_endpoints_are_refused_unless_the_operator_enables_them() {
    let (up, gate) = Gate::new().start_instant().await;
    for (method, path) in [(Method::POST, "/tools"), (Method::GET, "/cors-proxy")] {
        let resp = gate.client().request(method, path).await;
        assert_error_says(&resp, 403, "host_endpoint", "--forward-host-endpoints");
    }
    assert!(up.passthrough_seen().is_empty());
    drop(gate);

    let gate = Gate::new()
        .arg("--forward-host-endpoints")
        .upstream(&up)
        .start()
        .await;
    let resp = gate.client().request(Method::POST, "/tools").await;
    assert_eq!(resp.status, 404, "the fake's own answer: {}", resp.body);
    assert_eq!(up.passthrough_seen(), ["/tools"]);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_route_llama_server_lacks_is_a_404_that_says_so_and_the_ui_is_forwarded() {
    let (up, gate) = Gate::new().start_instant().await;
    let resp = gate.client().get("/v1/files").await;
    assert_error_says(
        &resp,
        404,
        "not_found",
        "slotgate forwards every route llama-server serves",
    );
    // In Anthropic's shape on its API: a wrong method on /v1/messages.
    let resp = gate.client().get("/v1/messages").await;
    assert_eq!(resp.status, 405, "{}", resp.body);
    // The web UI's page and files are llama-server's to serve.
    for path in ["/", "/index.html", "/bundle.js"] {
        let resp = gate.client().get(path).await;
        assert_eq!(resp.status, 404, "the fake has no UI: {}", resp.body);
    }
    assert_eq!(up.passthrough_seen(), ["/", "/index.html", "/bundle.js"]);
    gate.assert_settled(&up, 1).await;
}
