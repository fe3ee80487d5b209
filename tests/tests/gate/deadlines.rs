//! Per-request deadlines (docs/scheduling.md#deadlines): a client's `X-Slotgate-Deadline-Ms` or a
//! policy's `deadline_ms`. A waiter reaching its deadline leaves with 504 `deadline_exceeded` and is
//! never forwarded; within a priority level the earliest deadline is served first; a header that is
//! no deadline is a 400 before anything else happens; the access line and `/live` carry it.

use std::time::Duration;

use slotgate_tests::gate::hash_key;
use slotgate_tests::*;

const DEADLINE: &str = "x-slotgate-deadline-ms";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_reaching_its_own_deadline_leaves_with_504_and_is_never_forwarded() {
    let (up, gate) = Gate::one_slot(4)
        .queue_timeout("30s")
        .opt("--log-format", "json")
        .start_instant()
        .await;
    let client = gate.client();
    let slow = gate.hold_slot(&Req::chat("slow").delay(ms(1500))).await;
    let req = Req::chat("due")
        .header(DEADLINE, "300")
        .header("x-request-id", "due-1");
    let (due, took) = spawn_post(&client, CHAT, &req).await.unwrap();
    assert_error(&due, 504, "deadline_exceeded");
    assert_eq!(
        due.header("x-slotgate-reason").as_deref(),
        Some("deadline_exceeded")
    );
    assert!(
        took >= ms(250) && took < Duration::from_secs(1),
        "504 after {took:?}; expected about its 300 ms deadline, not the 30 s queue timeout"
    );
    let (slow, _) = slow.await.unwrap();
    assert_eq!(slow.status, 200, "{}", slow.body);
    assert!(
        !up.saw_tag("due"),
        "a request past its deadline was forwarded"
    );
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("deadline_exceeded", 1).await;
    let line = eventually(Duration::from_secs(3), "its access line", || async {
        gate.stderr_text().lines().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["target"] == "slotgate::access" && v["request_id"] == "due-1").then_some(v)
        })
    })
    .await;
    assert_eq!(line["outcome"], "deadline_exceeded", "{line}");
    assert_eq!(line["deadline_ms"], 300, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn within_a_priority_the_earliest_deadline_is_served_first() {
    let (up, gate) = Gate::one_slot(8).queue_timeout("30s").start_instant().await;
    let client = gate.client();
    let hold = gate.hold_slot(&Req::chat("hold").delay(ms(400))).await;
    // Three tenants, so that nobody is ahead of another's share: arrival order none, late, soon.
    let queued = [
        ("none", None),
        ("late", Some("20000")),
        ("soon", Some("5000")),
    ];
    let mut tasks = Vec::new();
    for (tag, deadline) in queued {
        let mut req = Req::chat(tag).api_key(&format!("key-{tag}"));
        if let Some(d) = deadline {
            req = req.header(DEADLINE, d);
        }
        tasks.push(spawn_post(&client, CHAT, &req));
        gate.wait_status(Duration::from_secs(5), "it queued", |s| {
            s["queue"]["depth"].as_u64() == Some(tasks.len() as u64)
        })
        .await;
    }
    // The live view shows the waiters in that order, with their deadlines.
    let live = gate.admin().get("/live").await.json();
    let waiters = live["queue"]["waiters"].as_array().unwrap();
    let tenants: Vec<String> = waiters
        .iter()
        .map(|w| w["tenant"].as_str().unwrap().to_owned())
        .collect();
    let by_tag = |t: &str| hash_key(&format!("key-{t}"));
    assert_eq!(tenants, [by_tag("soon"), by_tag("late"), by_tag("none")]);
    let due = waiters[0]["deadline_in_seconds"].as_f64().unwrap();
    assert!(due > 3.0 && due <= 5.0, "{due}");
    assert!(waiters[2]["deadline_in_seconds"].is_null());
    let live_deadline: Vec<_> = live["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["deadline_ms"].as_u64())
        .collect();
    assert_eq!(live_deadline.len(), 2, "{live}");
    assert_eq!(gate.status().await["queue"]["with_deadline"], 2);
    hold.await.unwrap();
    for (resp, _) in join_all(tasks).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.tags(), ["hold", "soon", "late", "none"]);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_header_that_is_no_deadline_is_refused_and_a_passthrough_ignores_it() {
    let (up, gate) = Gate::one_slot(4).start_instant().await;
    for bad in ["0", "-5", "2s", "1.5", ""] {
        let resp = gate
            .client()
            .post_json_with_headers(CHAT, &Req::chat("bad").json(), &[(DEADLINE, bad)])
            .await;
        assert_error(&resp, 400, "invalid_deadline");
        assert!(
            resp.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains(DEADLINE),
            "{}",
            resp.body
        );
    }
    assert!(!up.saw_tag("bad"));
    // Outside the slots it means nothing: forwarded as it came.
    let resp = gate
        .client()
        .send_with(http::Method::GET, "/v1/models", &[(DEADLINE, "nope")], "")
        .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    gate.wait_outcome("bad_request", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_sets_a_deadline_that_a_client_may_shorten_but_not_lengthen() {
    // The tenant-priority policy (a real wasm module) gives tenant `ide` a 300 ms deadline.
    let settings = format!(
        "{{ tenants = {{ ide = {{ api_keys = [\"{}\"], priority = 0, deadline_ms = 300 }} }} }}",
        hash_key("key-ide")
    );
    let (up, gate) = Gate::one_slot(4)
        .queue_timeout("30s")
        .policies(&[(&wat::built("tenant-priority"), Some(&settings))])
        .start_instant()
        .await;
    let client = gate.client();
    let slow = gate.hold_slot(&Req::chat("slow").delay(ms(1500))).await;
    // The tenant's 300 ms; a client asking for 10 s more does not get it.
    let req = Req::chat("ide")
        .api_key("key-ide")
        .header(DEADLINE, "10000");
    let (resp, took) = spawn_post(&client, CHAT, &req).await.unwrap();
    assert_error(&resp, 504, "deadline_exceeded");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Another client's own shorter deadline wins over no policy deadline at all.
    let req = Req::chat("other").header(DEADLINE, "200");
    let (resp, took) = spawn_post(&client, CHAT, &req).await.unwrap();
    assert_error(&resp, 504, "deadline_exceeded");
    assert!(took < Duration::from_secs(1), "{took:?}");
    slow.await.unwrap();
    assert!(!up.saw_tag("ide") && !up.saw_tag("other"));
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("deadline_exceeded", 2).await;
}
