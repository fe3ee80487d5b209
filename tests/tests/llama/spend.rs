//! Spend on the real llama-server (docs/spend.md): the same long prompt sent again is served partly
//! from llama-server's prompt cache, and the ledger's cost is the tokens times the prices, the
//! cached part at the cached price, exactly as llama-server reported them, whole answers and
//! streams, chat and the Messages API alike.

use serde_json::{json, Value};
use slotgate_tests::llama::{chat, serial, LlamaServer};
use slotgate_tests::*;

const PRICES: &str = "[prices]\ncurrency = \"USD\"\n\
[prices.default]\ninput = 3.0\ncached-input = 0.3\noutput = 15.0\n";

/// (prompt, cached, completion) as llama-server reported them in one answer, whole or streamed.
fn reported(body: &str) -> (u64, u64, u64) {
    let docs: Vec<Value> = match serde_json::from_str::<Value>(body) {
        Ok(v) => vec![v],
        Err(_) => body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect(),
    };
    let n = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_u64);
    let (mut prompt, mut cached, mut completion) = (None, None, None);
    for v in &docs {
        // Chat: `usage` with its details. Messages: `message_start`'s input (uncached) and cache
        // read, `message_delta`'s output.
        if let Some(p) = n(v, "/usage/prompt_tokens") {
            prompt = Some(p);
            cached = n(v, "/usage/prompt_tokens_details/cached_tokens");
            completion = n(v, "/usage/completion_tokens");
        }
        if let Some(i) = n(v, "/message/usage/input_tokens") {
            let c = n(v, "/message/usage/cache_read_input_tokens").unwrap_or(0);
            prompt = Some(i + c);
            cached = Some(c);
        }
        if v["type"] == "message_delta" {
            completion = n(v, "/usage/output_tokens");
        }
    }
    (
        prompt.expect("a prompt count"),
        cached.expect("a cached count"),
        completion.expect("a completion count"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ledgers_cost_is_the_reported_tokens_times_the_prices_cached_apart() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let dir = unique_dir("llama-spend");
    let config = dir.join("prices.toml");
    std::fs::write(&config, PRICES).unwrap();
    let gate = Gate::new()
        .opt("--state-dir", dir.join("state").display())
        .config_file(&config)
        .start_before(&llama)
        .await;
    let client = gate.client();
    let prompt = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(12);
    let mut answers = Vec::new();
    for stream in [false, true, false] {
        let r = client.post_json(CHAT, &chat(&prompt, 4, stream)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        answers.push(reported(&r.body));
    }
    let messages = json!({"model": "tiny", "max_tokens": 4, "stream": true,
                          "messages": [{"role": "user", "content": prompt}]});
    let r = client.post_json("/v1/messages", &messages).await;
    assert_eq!(r.status, 200, "{}", r.body);
    answers.push(reported(&r.body));
    eprintln!("(prompt, cached, completion) of each answer: {answers:?}");
    assert!(
        answers[1..].iter().all(|(_, cached, _)| *cached > 0),
        "the prompt sent again is read from llama-server's cache: {answers:?}"
    );

    let (mut prompt_sum, mut cached_sum, mut out_sum, mut cost) = (0, 0, 0, 0.0);
    for (p, c, o) in &answers {
        prompt_sum += p;
        cached_sum += c;
        out_sum += o;
        cost += ((p - c) as f64 * 3.0 + *c as f64 * 0.3 + *o as f64 * 15.0) / 1e6;
    }
    gate.wait_outcome("ok", 4).await;
    let usage = gate.admin_get("/usage?by=model").await.json();
    let t = &usage["total"];
    assert_eq!(
        (
            t["requests"].as_u64(),
            t["prompt_tokens"].as_u64(),
            t["cached_tokens"].as_u64(),
            t["completion_tokens"].as_u64()
        ),
        (Some(4), Some(prompt_sum), Some(cached_sum), Some(out_sum)),
        "{usage}"
    );
    let booked = t["cost"].as_f64().unwrap();
    assert!(
        (booked - cost).abs() < 1e-9,
        "booked {booked}, reported tokens times prices {cost}"
    );
    assert_eq!(usage["currency"], "USD");
    gate.assert_idle().await;
    llama.assert_idle().await;
}
