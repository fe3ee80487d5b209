//! A flood of made-up keys in front of a llama-server that checks keys (the fake playing
//! `--api-key`), with the `quota` policy and a state directory: each key is refused with
//! llama-server's 401 before it is charged, so the flood leaves no quota window, no ledger row and
//! no tenant state, the state file and the resident memory stay flat, and it takes no queue place
//! from the client with the real key (docs/security.md#who-is-asking).

use std::time::{Duration, Instant};

use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{hash_key, Gate};
use slotgate_tests::request::Req;
use slotgate_tests::soak::rss_kib;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

const KEY: &str = "sk-real-key-of-the-team";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_thousand_made_up_keys_leave_no_state_and_take_no_place() {
    let dir = unique_dir("made-up");
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("upstream-key");
    std::fs::write(&key_file, KEY).unwrap();
    let state = dir.join("state");
    // The tarpit off: this test measures what 20,000 refusals leave behind, as a flood from as
    // many peers would (one peer's flood is slowed: gate::keys).
    let (up, gate) = Gate::one_slot(8)
        .opt("--refusal-rate", "0")
        .opt("--upstream-api-key-file", key_file.display())
        .opt("--state-dir", state.display())
        .opt("--state-flush-interval", "100ms")
        .policies(&[(
            &wat::built("quota"),
            Some("{ period = \"day\", requests = 1000, tokens = 1000000 }"),
        )])
        .start_with(FakeUpstream::instant().api_key(KEY))
        .await;
    let client = gate.client();
    let real = Req::chat("real").api_key(KEY);
    assert_eq!(client.post_chat(&real).await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let file = state.join("state.redb");
    let size_before = std::fs::metadata(&file).unwrap().len();
    let rss_before = rss_kib(gate.pid());

    // The flood: 20,000 keys, each new, from 32 clients at once; the real client meanwhile.
    let keys = 20_000;
    let workers = 32;
    let started = Instant::now();
    let mut flood = Vec::new();
    for w in 0..workers {
        let client = client.clone();
        flood.push(tokio::spawn(async move {
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            for i in (w..keys).step_by(workers) {
                let auth = format!("Bearer sk-made-up-{i:05}");
                let resp = client
                    .get_with("/v1/models", &[("authorization", &auth)])
                    .await;
                *statuses.entry(resp.status.as_u16()).or_default() += 1;
            }
            statuses
        }));
    }
    let mut served = 0;
    for i in 0..8 {
        let resp = client
            .post_chat(&Req::chat(&format!("real-{i}")).api_key(KEY))
            .await;
        served += usize::from(resp.status == 200);
    }
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for f in flood {
        for (s, n) in f.await.unwrap() {
            *statuses.entry(s).or_default() += n;
        }
    }
    eprintln!(
        "{keys} made-up keys in {:.1} s: {statuses:?}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(statuses, [(401, keys)].into(), "every made-up key refused");
    assert_eq!(served, 8, "the real key was served 8 of 8 during the flood");

    // No quota window, no ledger row, no tenant but the real one.
    let quotas = gate.admin_get("/quotas").await.json();
    let real_tenant = hash_key(KEY);
    for q in quotas["quotas"].as_array().unwrap() {
        let key = q["key"].as_str().unwrap();
        assert!(
            key.ends_with(&format!(":{real_tenant}")),
            "only the real key has a quota: {q}"
        );
    }
    let usage = gate.admin_get("/usage").await.json();
    let tenants: Vec<&str> = usage["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, [real_tenant.as_str()], "{usage}");
    assert_eq!(usage["total"]["requests"], 9, "{usage}");
    let live = gate.admin_get("/live").await.json();
    let live_text = live.to_string();
    assert!(!live_text.contains("sk-made-up"), "no made-up key in /live");

    // The state file and the memory stay flat.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let size_after = std::fs::metadata(&file).unwrap().len();
    let rss_after = rss_kib(gate.pid());
    eprintln!(
        "state.redb {size_before} -> {size_after} bytes; RSS {rss_before} -> {rss_after} KiB"
    );
    assert!(
        size_after <= size_before + 256 * 1024,
        "state.redb grew from {size_before} to {size_after} bytes"
    );
    assert!(
        rss_after <= rss_before + 16 * 1024,
        "RSS grew from {rss_before} to {rss_after} KiB"
    );
    let refused = gate
        .metric(
            "slotgate_callers_refused_total",
            &[("reason", "refused_key")],
        )
        .await
        .unwrap_or(0.0);
    assert_eq!(refused, keys as f64);
    gate.assert_settled(&up, 1).await;
}
