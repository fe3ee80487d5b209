//! The load report a router reads off a response (docs/observability.md): ORCA's
//! `endpoint-load-metrics` on the answers and refusals of slot routes, when the request asks
//! (`asked`, the default) or on every one (`always`), with the slots, queue and expected wait as
//! they are when it is written.

use std::collections::BTreeMap;

use slotgate_tests::*;

const LOAD: &str = "endpoint-load-metrics";
const ASK: &str = "endpoint-load-metrics-format";

/// The named figures of a TEXT report.
fn figures(resp: &Response) -> BTreeMap<String, f64> {
    let v = resp
        .header(LOAD)
        .unwrap_or_else(|| panic!("no {LOAD} on a {}: {}", resp.status, resp.body));
    let text = v
        .strip_prefix("TEXT ")
        .unwrap_or_else(|| panic!("not TEXT: {v}"));
    text.split(", ")
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (
                k.trim_start_matches("named_metrics.").to_owned(),
                v.parse().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_is_sent_when_asked_and_says_the_load() {
    let (up, gate) = Gate::one_slot(1).start_instant().await;
    let client = gate.client();
    // Not asked: none.
    let plain = client.post_chat(&Req::chat("plain")).await;
    assert_eq!(plain.status, 200, "{}", plain.body);
    assert!(plain.header(LOAD).is_none(), "{:?}", plain.header(LOAD));

    // One in service and one waiting: the waiter's own answer (written when it has the slot) and
    // a refusal of a third, each with the load of that moment.
    let held = gate
        .hold_slot(&Req::chat("held").delay(ms(600)).header(ASK, "TEXT"))
        .await;
    let waiter = gate.enqueue(&Req::chat("waiter").header(ASK, "text")).await;
    let refused = client
        .post_chat(&Req::chat("refused").header(ASK, "TEXT"))
        .await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let f = figures(&refused);
    assert_eq!(
        (
            f["slots_in_use"],
            f["slots_total"],
            f["num_requests_waiting"]
        ),
        (1.0, 1.0, 1.0),
        "{f:?}"
    );
    assert_eq!(
        f["application_utilization"], 2.0,
        "one busy, one waiting, one slot: {f:?}"
    );
    assert!(f["expected_wait_seconds"] > 0.0, "{f:?}");
    let (held, _) = held.await.unwrap();
    let (waiter, _) = waiter.await.unwrap();
    for r in [&held, &waiter] {
        assert_eq!(r.status, 200, "{}", r.body);
        let f = figures(r);
        assert_eq!(
            f["slots_in_use"], 1.0,
            "its own slot, as it is answered: {f:?}"
        );
    }
    assert_eq!(figures(&waiter)["num_requests_waiting"], 0.0);

    // JSON when asked so.
    let json = client
        .post_chat(&Req::chat("json").header(ASK, "JSON"))
        .await;
    let v = json.header(LOAD).unwrap();
    let body: serde_json::Value =
        serde_json::from_str(v.strip_prefix("JSON ").expect("JSON form")).unwrap();
    assert_eq!(body["named_metrics"]["slots_total"], 1.0, "{body}");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn always_and_never() {
    for (setting, sent) in [("always", true), ("never", false)] {
        let (up, gate) = Gate::one_slot(1)
            .opt("--load-report", setting)
            .start_instant()
            .await;
        let client = gate.client();
        let resp = client
            .post_chat(&Req::chat("one").header(ASK, "TEXT"))
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        let unasked = client.post_chat(&Req::chat("two")).await;
        assert_eq!(resp.header(LOAD).is_some(), sent, "{setting}");
        assert_eq!(unasked.header(LOAD).is_some(), sent, "{setting}");
        // Not a slot route: never.
        let models = client.get("/v1/models").await;
        assert!(models.header(LOAD).is_none(), "{setting}");
        // The polled report follows the setting: `never` has no such route.
        let polled = client.get("/v1/loads").await;
        assert_eq!(
            polled.status,
            if sent { 200 } else { 404 },
            "{setting}: {}",
            polled.body
        );
        gate.assert_settled(&up, 1).await;
    }
}

/// The load a router polls (`GET /v1/loads`, SGLang's engine route, which SMG reads): the queue as
/// it is, in the schema's fields, to a caller llama-server answers. The caller's own credentials
/// are what llama-server is shown (on `/v1/models`), never slotgate's key; not a slot route, so it
/// takes no slot and leaves no access line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn v1_loads_reports_the_queue_to_a_polling_router() {
    let dir = unique_dir("loads-key");
    let key_file = dir.join("llama.key");
    std::fs::write(&key_file, "sk-slotgates-own-key\n").unwrap();
    let (up, gate) = Gate::one_slot(1)
        .opt("--upstream-api-key-file", key_file.display())
        .start_instant()
        .await;
    // Its own keyless `/v1/models` (does llama-server check keys?) comes before the caller's.
    up.wait_readiness_calls().await;
    let client = gate.client();
    let rank = |r: &Response| -> serde_json::Value {
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["dp_rank_count"], 1, "{v}");
        v["loads"][0].clone()
    };
    let idle = client
        .get_with("/v1/loads", &[("authorization", "Bearer the-callers-key")])
        .await;
    let r = rank(&idle);
    assert_eq!(
        (
            &r["num_running_reqs"],
            &r["num_waiting_reqs"],
            &r["max_running_requests"]
        ),
        (&0.into(), &0.into(), &1.into()),
        "{r}"
    );
    // The `Authorization` llama-server was last shown on `/v1/models`, where the key is checked.
    let shown = || {
        up.credentials_seen()
            .into_iter()
            .rev()
            .find(|(p, _, _)| p == "/v1/models")
            .map(|(_, auth, _)| auth)
            .expect("the caller's credentials shown to llama-server on /v1/models")
    };
    assert_eq!(shown().as_deref(), Some("Bearer the-callers-key"));

    let held = gate.hold_slot(&Req::chat("held").delay(ms(600))).await;
    let waiter = gate.enqueue(&Req::chat("waiter")).await;
    let busy = rank(&client.get("/v1/loads").await);
    assert_eq!(busy["num_running_reqs"], 1, "{busy}");
    assert_eq!(busy["num_waiting_reqs"], 1, "{busy}");
    assert_eq!(busy["num_total_reqs"], 2, "{busy}");
    assert_eq!(busy["utilization"], 1.0, "{busy}");
    // No key of the caller's: none reached llama-server either (slotgate's is never lent).
    assert_eq!(shown(), None, "slotgate's own key lent to a load poll");
    for (r, _) in [held.await.unwrap(), waiter.await.unwrap()] {
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let post = client.post_json("/v1/loads", &serde_json::json!({})).await;
    assert_eq!(post.status, 405, "{}", post.body);
    assert_eq!(
        gate.metrics()
            .await
            .sum("slotgate_requests_total", &[])
            .round() as u64,
        3,
        "the two chats and the 405, not the polls"
    );
    gate.assert_settled(&up, 1).await;
}
