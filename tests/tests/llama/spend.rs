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

/// One chat of 1,000 prompt tokens (900 cached) and 50 generated, as the fake llama-server
/// reports it, sent with `secret`: 100 × 3 + 900 × 0.3 + 50 × 15 per million USD.
async fn fake_chat(gate: &RunningGate, secret: &str) {
    let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 50, "fake_prompt_tokens": 1000, "fake_cached_tokens": 900,
                      "fake_completion_tokens": 50});
    let r = gate
        .client()
        .send_with(
            http::Method::POST,
            request::CHAT,
            &[("x-api-key", secret)],
            body.to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

const FAKE_ONE: f64 = (100.0 * 3.0 + 900.0 * 0.3 + 50.0 * 15.0) / 1e6;

/// The month's report is the operator's month: with `--state-usage-zone Europe/Berlin`, requests
/// at 23:30 UTC on 30 November are December's (00:30 in Berlin), and those an hour earlier are
/// November's; `usage --month` gives one row per person, in money. Written by slotgates whose wall
/// clock libfaketime sets (from the clients' venv, hence this suite), on the fake llama-server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_months_report_is_one_row_per_person_in_the_operators_zone() {
    let dir = wait::unique_dir("spend-zone");
    let config = dir.join("spend.toml");
    std::fs::write(&config, PRICES).unwrap();
    let gate = |at: Option<&str>| {
        let g = Gate::one_slot(8)
            .opt("--client-auth", "keys")
            .opt("--state-dir", dir.join("state").display())
            .opt("--state-usage-zone", "Europe/Berlin")
            .config_file(&config)
            .admin_token("admin-token-zone");
        match at {
            Some(at) => g
                .env(
                    "LD_PRELOAD",
                    python::libfaketime(&python::python()).to_str().unwrap(),
                )
                .env("FAKETIME", &format!("@{at}"))
                .env("TZ", "UTC")
                .env("DONT_FAKE_MONOTONIC", "1"),
            None => g,
        }
    };
    let mut secrets = std::collections::BTreeMap::new();
    // (the wall clock, and who sends how many)
    let phases = [
        ("2026-11-30 23:30:00", [("alice", 2), ("bob", 1)]),
        ("2026-11-30 22:30:00", [("alice", 1), ("carol", 1)]),
    ];
    for (at, sends) in phases {
        let (_up, mut g) = gate(Some(at))
            .start_with(fake_upstream::FakeUpstream::instant())
            .await;
        let mut sent = 0;
        for (who, n) in sends {
            let secret = secrets.entry(who).or_insert_with(|| {
                let (ok, out, err) = g.admin_cli(&["key", "create", "--json", "--tenant", who]);
                assert!(ok, "{out}{err}");
                serde_json::from_str::<Value>(out.trim()).unwrap()["secret"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            });
            for _ in 0..n {
                fake_chat(&g, secret).await;
                sent += 1;
            }
        }
        g.wait_outcome("ok", sent).await;
        // A clean stop writes the ledger whole.
        g.sigterm();
        g.wait_exit(std::time::Duration::from_secs(15)).await;
    }

    let (_up, g) = gate(None)
        .start_with(fake_upstream::FakeUpstream::instant())
        .await;
    let month = |m: &str| {
        let (ok, csv, err) = g.admin_cli(&["usage", "--month", m, "--by", "tenant", "--csv"]);
        assert!(ok, "{err}");
        csv.lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(
        month("2026-12"),
        [
            format!("alice,2,2000,1800,100,{:.6}", 2.0 * FAKE_ONE),
            format!("bob,1,1000,900,50,{FAKE_ONE:.6}"),
        ],
        "December in Berlin: 00:30 on the 1st"
    );
    assert_eq!(
        month("2026-11"),
        [
            format!("alice,1,1000,900,50,{FAKE_ONE:.6}"),
            format!("carol,1,1000,900,50,{FAKE_ONE:.6}"),
        ],
        "still November in Berlin at 23:30"
    );
    let december = g.admin_get("/usage?month=2026-12&by=tenant").await.json();
    assert_eq!(december["total"]["requests"], 3, "{december}");
    let cost = december["total"]["cost"].as_f64().unwrap();
    assert!((cost - 3.0 * FAKE_ONE).abs() < 1e-9, "{december}");
    g.assert_idle().await;
}
