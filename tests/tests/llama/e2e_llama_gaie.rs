//! What a load-aware endpoint picker (the Gateway API Inference Extension's EPP) reads from a
//! llama.cpp replica behind slotgate, on slotgate's one admin `/metrics`: queued requests
//! (`slotgate_queue_depth`), running ones (`slotgate_slots_busy`), the KV cache reserved
//! (`slotgate_kv_cache_reserved_ratio`), and llama-server's own `llamacpp:*` series appended. The
//! combined scrape is checked with `promtool check metrics`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use slotgate_tests::llama::{chat, LlamaServer, PROMPT};
use slotgate_tests::*;

/// `promtool check metrics` on `text`: the combined scrape must be valid exposition format.
fn promtool_accepts(text: &str) {
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {promtool} ({e}): run scripts/setup-prometheus.sh"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Lint findings (naming advice) are printed but only a parse error fails the check here.
    assert!(
        !said.contains("error while linting") && !said.contains("text format parsing error"),
        "promtool check metrics:\n{said}\n--- scrape:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_scrape_has_the_queue_the_running_requests_the_kv_estimate_and_llama_servers_own() {
    let _serial = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(2).await;
    let gate = Gate::new().queue_depth(8).start_before(&llama).await;
    gate.wait_status(Duration::from_secs(5), "two slots from /props", |s| {
        s["slots"]["total"] == 2
    })
    .await;

    let m = gate.metrics().await;
    for name in [
        "slotgate_queue_depth",
        "slotgate_slots_busy",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:prompt_tokens_total",
    ] {
        assert!(
            m.has_samples(name),
            "{name} missing from the scrape:\n{}",
            m.text
        );
    }
    promtool_accepts(&m.text);

    // Three long answers on two slots: two run, one waits in slotgate, none in llama-server.
    let max_tokens = llama.tokens_for(Duration::from_secs(3), (64, 1500)).await;
    let client = gate.client();
    let long: Vec<_> = (0..3)
        .map(|i| {
            let body = chat(&format!("{PROMPT} {i}"), max_tokens, false);
            let client = client.clone();
            tokio::spawn(async move { client.post_json(CHAT, &body).await })
        })
        .collect();
    gate.wait_busy(2).await;
    gate.wait_queue_depth(1).await;
    let m = gate.metrics().await;
    m.assert_present("slotgate_queue_depth", &[], 1.0);
    assert_eq!(m.value("slotgate_slots_busy", &[]), Some(2.0));
    assert_eq!(m.value("llamacpp:requests_deferred", &[]), Some(0.0));
    let kv = m
        .value("slotgate_kv_cache_reserved_ratio", &[])
        .expect("the KV estimate");
    assert!(kv > 0.0 && kv <= 1.0, "kv {kv}");
    promtool_accepts(&m.text);
    for h in long {
        let resp = h.await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.body);
    }

    // Idle again: all three read zero.
    let m = gate.metrics().await;
    assert_eq!(m.value("slotgate_queue_depth", &[]), Some(0.0));
    assert_eq!(m.value("slotgate_slots_busy", &[]), Some(0.0));
    assert_eq!(m.value("slotgate_kv_cache_reserved_ratio", &[]), Some(0.0));
    gate.assert_idle().await;
    llama.assert_idle().await;

    // Turned off, the scrape is slotgate's alone.
    let gate = Gate::new()
        .opt("--upstream-metrics", "false")
        .start_before(&llama)
        .await;
    let m = gate.metrics().await;
    assert!(!m.text.contains("llamacpp:"), "{}", m.text);
    gate.assert_idle().await;
}
