//! Scale-out by load (issue 36, item 5): SMG, the Shepherd Model Gateway (PyPI `smg`, pinned by
//! `scripts/setup-smg.sh`), with its `least_load` policy in front of two llama-server + slotgate
//! pairs (one slot and one queue place each). SMG polls each worker's load every second from the
//! route SGLang engines serve, `GET /v1/loads`, which slotgate answers from its own queue
//! (`pipeline::loads`, docs/observability.md#load-polled-by-routers-v1loads).
//!
//! The load a router cannot see for itself is what the report is for: pair A is filled by clients
//! that reach it directly (its slot held, its queue place taken). With the report, SMG sends a
//! burst to pair B alone and A sees none of it; the same SMG policy without the report (its load
//! monitor off, so it counts only the requests it has in flight itself) sends A its share, which A
//! can only refuse.

use std::time::Duration;

use slotgate_tests::llama::chat;
use slotgate_tests::llama::PROMPT;
use slotgate_tests::pair::Pair;
use slotgate_tests::smg::Smg;
use slotgate_tests::*;

/// Each pair's queue: one place, so a held slot and one waiter fill it.
const QUEUE_DEPTH: usize = 1;
/// How long pair A's direct clients hold it: past SMG's next poll and both bursts.
const HOLD: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn smg_least_load_reads_v1_loads_and_spares_the_full_pair() {
    let _serial = slotgate_tests::llama::serial().await;
    let a = Pair::start("A", Gate::one_slot(QUEUE_DEPTH)).await;
    let b = Pair::start("B", Gate::one_slot(QUEUE_DEPTH)).await;
    let workers = [a.url(), b.url()];
    let least_load = ["--policy", "least_load", "--load-monitor-interval", "1"];
    let reading = Smg::start(&workers, &least_load).await;
    let blind = Smg::start(
        &workers,
        &[&least_load[..], &["--disable-load-monitoring"]].concat(),
    )
    .await;

    // What SMG reads: both pairs idle, from slotgate's /v1/loads.
    let idle = eventually(Duration::from_secs(10), "SMG polled both pairs", || async {
        let (ra, rb) = (
            reading.load_of(&a.url()).await,
            reading.load_of(&b.url()).await,
        );
        (ra.is_some() && rb.is_some()).then(|| (ra.unwrap(), rb.unwrap()))
    })
    .await;
    for rank in [&idle.0, &idle.1] {
        assert_eq!(rank["num_running_reqs"], 0, "{rank}");
        assert_eq!(rank["max_running_requests"], 1, "one slot: {rank}");
    }

    // Pair A filled by its own direct clients: one in service, one in its queue place.
    let tokens = a.llama.tokens_for(HOLD, (50, 4000)).await;
    let holders: Vec<_> = (0..2)
        .map(|i| {
            spawn_post(
                &a.gate.client(),
                CHAT,
                &Req::from_json(chat(PROMPT, tokens, false))
                    .header("x-tenant", &format!("direct-{i}")),
            )
        })
        .collect();
    a.gate.wait_busy(1).await;
    a.gate.wait_queue_depth(1).await;
    let seen = eventually(Duration::from_secs(10), "SMG read pair A full", || async {
        let rank = reading.load_of(&a.url()).await?;
        (rank["num_running_reqs"] == 1 && rank["num_waiting_reqs"] == 1).then_some(rank)
    })
    .await;
    eprintln!("SMG's view of pair A: {seen}");

    // With the report: the burst goes to B, and A sees none of it.
    let a_before = a.finished().await + a.overloaded().await;
    let b_before = b.outcome("ok").await;
    let (r0, r1) = tokio::join!(reading.chat("via-smg-0", 8), reading.chat("via-smg-1", 8));
    for r in [&r0, &r1] {
        assert_eq!(r.status, 200, "{}\n{}", r.body, reading.log_tail(30));
        assert_eq!(r.json()["usage"]["completion_tokens"], 8, "{}", r.body);
    }
    assert_eq!(b.outcome("ok").await - b_before, 2, "both served by pair B");
    assert_eq!(
        a.finished().await + a.overloaded().await,
        a_before,
        "the full pair was sent nothing"
    );

    // Without it (the same policy, blind to slotgate's load): A, whose queue is full, is sent its
    // share and refuses it.
    let refused_before = a.overloaded().await;
    let (r0, r1, r2) = tokio::join!(
        blind.chat("blind-0", 8),
        blind.chat("blind-1", 8),
        blind.chat("blind-2", 8)
    );
    let answers = [r0, r1, r2];
    let refused = a.overloaded().await - refused_before;
    eprintln!(
        "blind SMG: A refused {refused}; statuses {:?}",
        answers
            .iter()
            .map(|r| r.status.as_u16())
            .collect::<Vec<_>>()
    );
    assert!(
        refused >= 1,
        "a router blind to the load sends the full pair its share: {}",
        blind.log_tail(30)
    );

    for (r, _) in join_all(holders).await {
        assert_eq!(r.status, 200, "a direct client of pair A: {}", r.body);
    }
    for pair in [&a, &b] {
        pair.assert_idle().await;
    }
}
