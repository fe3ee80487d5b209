//! End to end: two real llama-servers, each behind its own slotgate, and one real Redis. One
//! tenant's token-budget quota is the fleet's: spent on either, it is spent on both, settled from
//! the usage each llama-server reported.

use std::time::Duration;

use slotgate_tests::llama::{chat, chat_usage, LlamaServer, RunningLlama, PROMPT};
use slotgate_tests::redis::{wait_connected, RunningRedis};
use slotgate_tests::*;

const MAX_TOKENS: u64 = 8;

async fn fleet_gate(llama: &RunningLlama, redis: &RunningRedis, settings: &str) -> RunningGate {
    let gate = Gate::new()
        .upstream_path(llama.socket())
        .slots(1)
        .policies(&[(&wat::built("token-budget"), Some(settings))])
        .opt("--cost-tokenizer", "estimate");
    let gate = redis.backend_for(gate).start().await;
    wait_connected(&gate).await;
    gate
}

/// The tenant's quota holds six estimates of its request (the prompt's characters / 4 plus
/// `max_tokens`); llama-server counts the chat template too, so every request uses more than its
/// estimate and is settled with an extra charge. Sent to the two sidecars in turn, the fleet admits
/// at most six in all (in-memory budgets would admit up to six on each), and then both refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_llama_servers_behind_two_sidecars_share_one_budget() {
    let _serial = slotgate_tests::llama::serial().await;
    let redis = RunningRedis::start();
    let estimate = (PROMPT.chars().count() as u64).div_ceil(4) + MAX_TOKENS;
    let settings = format!("{{ capacity = {}, refill_per_second = 0 }}", 6 * estimate);
    let (l1, l2) = (LlamaServer::start(1).await, LlamaServer::start(1).await);
    let (g1, g2) = (
        fleet_gate(&l1, &redis, &settings).await,
        fleet_gate(&l2, &redis, &settings).await,
    );
    let body = chat(PROMPT, MAX_TOKENS, false);
    let (mut served, mut used) = ([0u64; 2], 0u64);
    let mut refused_in_a_row = 0;
    let mut i = 0;
    while refused_in_a_row < 6 {
        let gate = [&g1, &g2][i % 2];
        let resp = gate.client().post_json(CHAT, &body).await;
        match resp.status.as_u16() {
            200 => {
                let u = chat_usage(&resp, MAX_TOKENS);
                assert!(u.total() > estimate, "precondition: {u:?} > {estimate}");
                used += u.total();
                served[i % 2] += 1;
                refused_in_a_row = 0;
                // Let the settlement (on_complete, then the next sync) reach the fleet bucket.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            429 => {
                assert_error(&resp, 429, "policy_denied");
                refused_in_a_row += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("unexpected {other}: {}", resp.body),
        }
        i += 1;
        assert!(i < 200, "never ran dry");
    }
    let total = served[0] + served[1];
    eprintln!(
        "served {served:?}, {used} tokens used of a {} quota",
        6 * estimate
    );
    assert!(
        total <= 6,
        "the fleet admitted {total} requests on a quota of six estimates"
    );
    assert!(
        served[0] >= 1 && served[1] >= 1,
        "both sidecars served: {served:?}"
    );
    // Admitted on estimates, settled from real usage: the overrun is at most the last request's.
    assert!(used <= 6 * estimate + used / total, "{used} tokens used");
    for (gate, llama) in [(&g1, &l1), (&g2, &l2)] {
        gate.assert_idle().await;
        llama.assert_idle().await;
    }
}
