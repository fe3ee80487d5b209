//! Admission by a shared KV pool as well as by slots: a request is admitted only while its
//! reservation (prompt + the most it may generate) fits beside those in service, so the requests in
//! service can never together exhaust llama-server's pool (it then fails all of them at once). The
//! fake gives each slot its own context, so the pool is set with `--kv-pool`; learning it from the
//! real llama-server is `llama_today/pool.rs`.

use slotgate_tests::*;

/// Four slots over a pool of 1000 tokens, slots of 1000 each.
async fn pooled() -> (RunningUpstream, RunningGate) {
    Gate::new()
        .slots(4)
        .queue_depth(8)
        .opt("--kv-pool", 1000)
        .start_with(FakeUpstream::instant().total_slots(4).n_ctx(1000))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_are_admitted_while_their_reservations_fit_the_pool() {
    let (up, gate) = pooled().await;
    eventually(ms(5000), "the slot context read", || async {
        (gate.status().await["kv_pool"]["n_ctx_slot"] == 1000).then_some(())
    })
    .await;
    // "hi" is about 1 token; with max_tokens 400, each reserves 401: two fit in 1000, a third not.
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let req = Req::chat(&format!("r{i}"))
                .set("max_tokens", 400)
                .delay(ms(300));
            spawn_post(&gate.client(), CHAT, &req)
        })
        .collect();
    let s = gate.wait_queue_depth(1).await;
    assert_eq!(
        (
            s["slots"]["busy"].as_u64(),
            s["requests_in_service"].as_u64()
        ),
        (Some(2), Some(2)),
        "{s}"
    );
    assert_eq!(s["kv_pool"]["tokens"], 1000, "{s}");
    assert_eq!(s["kv_pool"]["reserved_tokens"], 802, "{s}");
    for (resp, _) in join_all(calls).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(
        up.max_concurrency(),
        2,
        "two slots stayed free: the pool was the limit"
    );
    let m = gate.metrics().await;
    assert_eq!(m.value_or_zero("slotgate_kv_pool_tokens", &[]), 1000.0);
    gate.assert_settled(&up, 2).await;
    assert_eq!(gate.status().await["kv_pool"]["reserved_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_without_an_output_bound_takes_the_whole_pool() {
    let (up, gate) = pooled().await;
    eventually(ms(5000), "the slot context read", || async {
        (gate.status().await["kv_pool"]["n_ctx_slot"] == 1000).then_some(())
    })
    .await;
    let open = spawn_post(&gate.client(), CHAT, &Req::chat("open").delay(ms(300)));
    gate.wait_busy(1).await;
    let small = spawn_post(
        &gate.client(),
        CHAT,
        &Req::chat("small").set("max_tokens", 8),
    );
    let s = gate.wait_queue_depth(1).await;
    assert_eq!(
        s["kv_pool"]["reserved_tokens"], 1000,
        "it may generate until the pool is full: {s}"
    );
    for (resp, _) in join_all(vec![open, small]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.max_concurrency(), 1);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_is_assumed_when_llama_servers_command_line_cannot_be_seen() {
    // The fake is no llama-server process: auto cannot read a command line.
    let (up, gate) = Gate::new()
        .opt("--kv-pool", "auto")
        .start_with(FakeUpstream::instant().total_slots(2).n_ctx(3000))
        .await;
    let s = gate
        .wait_status(ms(5000), "the pool learned", |s| {
            s["kv_pool"]["tokens"] == 3000
        })
        .await;
    assert_eq!(s["kv_pool"]["shared"], true, "{s}");
    assert!(
        s["kv_pool"]["source"]
            .as_str()
            .unwrap()
            .starts_with("assumed"),
        "{s}"
    );
    assert!(gate
        .stderr_text()
        .contains("cannot see llama-server's command line"));
    gate.assert_settled(&up, 2).await;
}
