//! `slotgate top` for real: in an 80×24 tmux terminal, against slotgate before a llama-server run
//! with its own defaults (no `-np`: 4 slots over one shared KV pool), loaded with long streams from
//! three tenants, two of them waiting and one refused. The screen must show the four busy slots with
//! their requests and llama-server's own slot state, the waiters in order, the tenants with the
//! refusal, and the rates; the keys sort, filter and quit; `--once` prints the same picture.

use std::time::Duration;

use slotgate_tests::gate::binary_path;
use slotgate_tests::llama::{chat, serial, LlamaServer};
use slotgate_tests::tmux::Tmux;
use slotgate_tests::*;

/// A long stream (it runs until the test ends it) for `key`'s tenant, with `id` as its id.
fn stream(key: &str, id: &str) -> Req {
    Req::from_json(chat("tell me about the lighthouse", 6000, true))
        .header("authorization", &format!("Bearer {key}"))
        .header("x-request-id", id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn top_shows_a_loaded_slotgate_before_llama_server_with_its_defaults() {
    let _one = serial().await;
    let llama = LlamaServer::start_default(32768, &[]).await;
    let gate = Gate::new()
        .queue_depth(2)
        .queue_timeout("300s")
        .start_before(&llama)
        .await;
    gate.wait_status(Duration::from_secs(10), "the pool learned", |s| {
        s["kv_pool"]["n_ctx_slot"].is_u64() && s["slots"]["total"] == 4
    })
    .await;
    let client = gate.client();
    let mut streams = Vec::new();
    for (i, key) in ["team-a", "team-b", "team-a", "team-b"].iter().enumerate() {
        streams.push(spawn_post(&client, CHAT, &stream(key, &format!("run-{i}"))));
    }
    gate.wait_status(Duration::from_secs(20), "four in service", |s| {
        s["slots"]["busy"] == 4
    })
    .await;
    for (i, key) in ["team-a", "team-b"].iter().enumerate() {
        streams.push(spawn_post(
            &client,
            CHAT,
            &stream(key, &format!("wait-{i}")),
        ));
        gate.wait_queue_depth(i as u64 + 1).await;
    }
    let refused = client
        .post_json_with_headers(
            CHAT,
            &chat("one more", 10, false),
            &[("authorization", "Bearer team-c")],
        )
        .await;
    assert_eq!(refused.status, 429, "{}", refused.body);

    let top = Tmux::start(
        &[
            binary_path().display().to_string(),
            "top".into(),
            "--admin".into(),
            gate.admin_addr().to_owned(),
        ],
        80,
        24,
    );
    let screen = top.wait_for(Duration::from_secs(20), "the loaded gate", |s| {
        s.contains("Slots 4/4 busy") && s.contains("Queue 2/2") && s.matches("run ").count() >= 4
    });
    eprintln!("{screen}");
    let lines: Vec<&str> = screen.lines().collect();
    assert_eq!(lines.len(), 24, "{screen}");
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{screen}");
    assert!(
        lines[0].starts_with(&format!("slotgate {}", env!("CARGO_PKG_VERSION"))),
        "{screen}"
    );
    assert!(
        lines[0].contains("upstream ready (4 slots) unix:"),
        "{screen}"
    );
    assert!(
        lines[1].contains("req/s") && lines[1].contains("tok/s"),
        "{screen}"
    );
    let section = |title: &str| -> Vec<&str> {
        let at = lines
            .iter()
            .position(|l| l.contains(title))
            .unwrap_or_else(|| panic!("no {title}\n{screen}"));
        lines[at + 2..]
            .iter()
            .take_while(|l| !l.starts_with(' ') && !l.is_empty() && !l.starts_with("q quit"))
            .copied()
            .collect()
    };
    let slots = section("Slots 4/4 busy");
    assert_eq!(slots.len(), 4, "{screen}");
    for i in 0..4 {
        let row = slots
            .iter()
            .find(|l| l.contains(&format!("run-{i}")))
            .unwrap_or_else(|| panic!("no run-{i} on a slot\n{screen}"));
        // Its tenant (a hashed key), endpoint, and llama-server's slot generating.
        assert!(
            row.contains("sha256:") && row.contains("/v1/chat/compl"),
            "{row}"
        );
        assert!(row.trim_end().rsplit_once("run ").is_some(), "{row}");
    }
    assert!(!slots.iter().any(|l| l.contains("wait-")), "{screen}");
    let queue = section("Queue 2/2");
    assert_eq!(queue.len(), 2, "{screen}");
    // Both tenants have two in service: the earlier arrival goes first.
    assert!(
        queue[0].starts_with("1") && queue[0].contains("wait-0"),
        "{screen}"
    );
    assert!(
        queue[1].starts_with("2") && queue[1].contains("wait-1"),
        "{screen}"
    );
    assert!(queue.iter().all(|l| l.contains(" in ")), "{screen}");
    let tenants = section("Tenants 3");
    assert_eq!(tenants.len(), 3, "{screen}");
    let team_c = tenants
        .iter()
        .find(|l| l.contains("queue_full 1"))
        .unwrap_or_else(|| panic!("no refusal\n{screen}"));
    assert!(team_c.starts_with("sha256:"), "{team_c}");
    assert!(lines[23].starts_with("q quit"), "{screen}");

    // Generated tokens move on from one refresh to the next.
    // top shows `455`, then `3.2k` past a thousand (a slow machine gets there before the first
    // screen): both are read, so the sum moves on whichever the streams show.
    let count = |v: &str| -> Option<f64> {
        match v.strip_suffix('k') {
            Some(k) => k.parse::<f64>().ok().map(|k| k * 1000.0),
            None => v.parse::<f64>().ok(),
        }
    };
    let gen = |s: &str| -> f64 {
        s.lines()
            .filter(|l| l.contains("run-"))
            .filter_map(|l| count(l.split_whitespace().nth(5)?))
            .sum()
    };
    let before = gen(&screen);
    top.wait_for(Duration::from_secs(10), "more tokens generated", |s| {
        gen(s) > before
    });
    // And count in the rates while they stream, not only when the streams end.
    let busy = top.wait_for(Duration::from_secs(10), "tokens per second", |s| {
        let rates = s.lines().nth(1).unwrap_or("");
        rates.contains(" tok/s") && !rates.contains(" 0 tok/s")
    });
    eprintln!("{busy}");

    // Sort the queue by age, then filter down to one waiter.
    top.keys(&["Tab", "s"]);
    top.wait_for(Duration::from_secs(5), "the queue sorted by age", |s| {
        s.contains("Queue 2/2 · est. wait") && s.contains("by age")
    });
    top.keys(&["/"]);
    top.type_text("wait-1");
    top.keys(&["Enter"]);
    let filtered = top.wait_for(Duration::from_secs(5), "the filter applied", |s| {
        s.contains("filter \"wait-1\"") && !s.contains("wait-0") && !s.contains("run-0")
    });
    assert!(filtered.contains("wait-1"), "{filtered}");

    // The same picture for a script.
    let once = slotgate_tests::gate::run(&[
        "top",
        "--once",
        "--width",
        "80",
        "--admin",
        gate.admin_addr(),
    ]);
    let once = slotgate_tests::gate::succeeded(&once);
    for part in [
        "Slots 4/4 busy",
        "Queue 2/2",
        "run-0",
        "run-3",
        "wait-0",
        "wait-1",
        "queue_full 1",
    ] {
        assert!(once.contains(part), "no {part} in --once:\n{once}");
    }

    top.keys(&["q"]);
    top.wait_for(Duration::from_secs(5), "top to quit cleanly", |s| {
        s.contains("[exited 0]")
    });

    for s in &streams {
        s.abort();
    }
    gate.assert_idle().await;
    assert_eq!(gate.status().await["kv_pool"]["reserved_tokens"], 0);
    let v = gate.admin().get("/live").await.json();
    assert_eq!(v["requests"], serde_json::json!([]), "{v}");
    llama.assert_idle().await;
}
