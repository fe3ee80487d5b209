//! The picture from a known `/live` and `/slots`: what each table shows, the pairing of
//! llama-server's slots with requests, and an 80×24 screen.

use super::model::{Live, LlamaSlot, Picture};
use super::text;
use super::view::{self, ViewState};

fn live() -> Live {
    serde_json::from_value(serde_json::json!({
        "version": "9.9.9",
        "uptime_seconds": 3725.0,
        "upstream": {"target": "unix:/run/llama.sock", "ready": true, "total_slots": 2},
        "slots": {"total": 2, "busy": 2, "in_service": 2, "kv_pool_tokens": 4096, "kv_reserved_tokens": 900,
                  "sheddable": 1, "shed_before_first_byte": 2, "shed_after_first_byte": 1},
        "queue": {"depth": 2, "capacity": 64, "estimated_wait_seconds": 3.5, "waiters": [
            {"request_id": "wait-b", "path": "/v1/completions", "tenant": "bob", "priority": 0,
             "effective_priority": 0, "age_seconds": 0.4, "reserved_tokens": 300, "slots": 1,
             "expected_start_seconds": 1.5},
            {"request_id": "wait-a", "path": "/v1/chat/completions", "tenant": "alice", "priority": 5,
             "effective_priority": 4, "age_seconds": 2.0, "reserved_tokens": 1200, "slots": 1,
             "expected_start_seconds": 3.0, "deadline_in_seconds": 4.5, "band": "background"}
        ]},
        "requests": [
            {"request_id": "old-one", "method": "POST", "path": "/v1/chat/completions", "tenant": "alice",
             "phase": "answering", "age_seconds": 9.0, "in_service_seconds": 8.0, "slots": 1,
             "prompt_tokens": 120, "generated_tokens": 34},
            {"request_id": "new-one", "method": "POST", "path": "/completion", "tenant": "bob",
             "phase": "upstream", "age_seconds": 1.0, "in_service_seconds": 0.5, "slots": 1,
             "prompt_tokens": 7, "generated_tokens": 0},
            {"request_id": "wait-b", "method": "POST", "path": "/v1/completions", "tenant": "bob",
             "phase": "queued", "age_seconds": 0.4, "slots": 0}
        ],
        "tenants": [
            {"tenant": "alice", "requests": 10, "served_tokens": 3000, "share": 0.75, "virtual_tokens": 3100.0,
             "waiting": 1, "in_service": 1, "refused": {}},
            {"tenant": "bob", "requests": 9, "served_tokens": 1000, "share": 0.25, "virtual_tokens": 1100.0,
             "waiting": 1, "in_service": 1, "refused": {"queue_full": 4, "tenant_queue_full": 1}}
        ],
        "rates": {"window_seconds": 10, "requests_per_second": 2.5, "tokens_per_second": 410.0,
                  "refused_per_second": 0.4, "queue_wait_p50_seconds": 0.012, "queue_wait_p95_seconds": 1.9},
        "history": {"requests": [0, 1, 2, 4, 8], "tokens": [], "refused": []},
        "budgets": [
            {"policy": "quota", "key": "tokens:bob", "kind": "quota", "left": 250.0, "limit": 1000.0},
            {"policy": "quota", "key": "requests:bob", "kind": "quota", "left": 90.0, "limit": 100.0},
            {"policy": "quota", "key": "tokens:alicia", "kind": "quota", "left": 0.0, "limit": 1000.0}
        ]
    }))
    .unwrap()
}

fn llama(slots: serde_json::Value) -> Result<Vec<LlamaSlot>, String> {
    Ok(serde_json::from_value(slots).unwrap())
}

#[test]
fn the_snapshot_shows_slots_queue_tenants_and_rates() {
    // llama-server's slot 1 took the older task: the older request is shown on it.
    let p = Picture {
        live: live(),
        llama_slots: llama(serde_json::json!([
            {"id": 0, "n_ctx": 2048, "is_processing": true, "id_task": 41, "next_token": [{"n_decoded": 0}]},
            {"id": 1, "n_ctx": 2048, "is_processing": true, "id_task": 17, "next_token": [{"n_decoded": 33}]}
        ])),
    };
    let out = text(&p, &mut ViewState::new("tcp:127.0.0.1:9464".into()), 80);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("slotgate 9.9.9 · up 1h02m"), "{out}");
    assert!(
        lines[0].contains("upstream ready (2 slots) unix:/run/llama.sock"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("2.5 req/s  410 tok/s  0.4 429/s  wait p50 12ms p95 1.9s"),
        "{out}"
    );
    assert!(lines[1].ends_with(" ▁▂▄█"), "{out}");
    let row = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle} in\n{out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert!(
        out.contains("Slots 2/2 busy · KV 900/4.1k · sheddable 1 · shed 2+1"),
        "{out}"
    );
    assert_eq!(
        row("old-one"),
        [
            "1",
            "old-one",
            "alice",
            "/v1/chat/completions",
            "120",
            "34",
            "8.0s",
            "run",
            "33"
        ]
    );
    assert_eq!(
        row("new-one"),
        [
            "0",
            "new-one",
            "bob",
            "/completion",
            "7",
            "0",
            "500ms",
            "run",
            "0"
        ]
    );
    assert!(
        out.contains("Queue 2/64 · background 1 · est. wait 3.5s"),
        "{out}"
    );
    assert_eq!(
        row("wait-a"),
        [
            "2",
            "wait-a",
            "5>4",
            "alice",
            "/v1/chat/completions",
            "2.0s",
            "1.2k",
            "3.0s",
            "≤4.5s"
        ]
    );
    // `tokens:alicia` is not alice's.
    let alice: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with("alice "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(alice.last(), Some(&"-"), "{alice:?}");
    let bob: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with("bob "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        bob,
        [
            "bob",
            "1.0k",
            "25%",
            "1.1k",
            "1",
            "1",
            "5",
            "250/1.0k",
            "queue_full",
            "4"
        ]
    );
    // A filter keeps what names it.
    let mut only = ViewState::new(String::new());
    only.filter = "ALICE".into();
    let out = text(&p, &mut only, 80);
    assert!(out.contains("old-one") && out.contains("wait-a"), "{out}");
    assert!(!out.contains("new-one") && !out.contains("wait-b"), "{out}");
}

#[test]
fn unpaired_or_missing_llama_slots_are_said() {
    let mut p = Picture {
        live: live(),
        llama_slots: Err("llama-server's /slots answered 501".into()),
    };
    let out = text(&p, &mut ViewState::new(String::new()), 80);
    assert!(out.contains("llama-server's /slots unavailable"), "{out}");
    assert!(out.contains("old-one") && out.contains("new-one"), "{out}");
    // One busy by llama-server's count, two by slotgate's: not paired.
    p.llama_slots = llama(serde_json::json!([
        {"id": 0, "is_processing": true, "id_task": 3},
        {"id": 1, "is_processing": false}
    ]));
    let out = text(&p, &mut ViewState::new(String::new()), 80);
    assert!(out.contains("unpaired"), "{out}");
}

#[test]
fn an_80_by_24_screen_keeps_every_part() {
    let mut l = live();
    // More waiters than fit: the table says how many it shows.
    let w = l.queue.waiters[0].clone();
    l.queue.waiters = (0..40).map(|_| w.clone()).collect();
    let p = Picture {
        live: l,
        llama_slots: Err("-".into()),
    };
    let state = ViewState::new("tcp:127.0.0.1:9464".into());
    let backend = ratatui::backend::TestBackend::new(80, 24);
    let mut term = ratatui::Terminal::new(backend).unwrap();
    term.draw(|f| view::draw(f, &p, &state)).unwrap();
    let buf = term.backend().buffer();
    let lines: Vec<String> = (0..24)
        .map(|y| (0..80).map(|x| buf[(x, y)].symbol()).collect::<String>())
        .collect();
    let screen = lines.join("\n");
    for part in [
        "slotgate 9.9.9",
        "Slots 2/2",
        "Queue 2/64",
        "of 40 shown",
        "Tenants 2",
        "q quit",
    ] {
        assert!(screen.contains(part), "no {part:?} in\n{screen}");
    }
    assert!(lines[23].starts_with("q quit"), "{screen}");
}

/// In front of a router: three models, one loaded, one loading, one whose load failed.
fn router_live() -> Live {
    let mut l = live();
    l.models = serde_json::from_value(serde_json::json!([
        {"model": "alpha", "admitting": true, "slots": 2, "busy": 2, "depth": 1, "capacity": 64,
         "estimated_wait_seconds": 1.5, "load": {"last_seconds": 0.8, "failures": 0}},
        {"model": "beta", "admitting": false, "slots": 1, "busy": 0, "depth": 3, "capacity": 64,
         "estimated_wait_seconds": 4.0, "load": {"doing": "waiting for room", "for_seconds": 2.06}},
        {"model": "broken", "admitting": false, "slots": 1, "busy": 0, "depth": 0, "capacity": 64,
         "load": {"failures": 2, "error": "its llama-server exited with code 1 while loading",
                  "retry_in_seconds": 3.0}}
    ]))
    .unwrap();
    l
}

#[test]
fn a_router_shows_each_models_pool() {
    let p = Picture {
        live: router_live(),
        llama_slots: Err("-".into()),
    };
    let out = text(&p, &mut ViewState::new(String::new()), 100);
    let line = |model: &str| {
        out.lines()
            .find(|l| l.starts_with(model))
            .unwrap_or_else(|| panic!("no {model} row in\n{out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(out.contains("Models 1/3 loaded"), "{out}");
    assert_eq!(line("alpha"), "alpha loaded 2/2 1/64 1.5s 800ms");
    assert_eq!(line("beta"), "beta waiting for room 2.1s 0/1 3/64 4.0s -");
    assert!(
        line("broken")
            .starts_with("broken failed, retry in 3.0s 0/1 0/64 0ms - its llama-server exited"),
        "{}",
        line("broken")
    );
    // Without a router there is no models table.
    let out = text(
        &Picture {
            live: live(),
            llama_slots: Err("-".into()),
        },
        &mut ViewState::new(String::new()),
        100,
    );
    assert!(!out.contains("Models"), "{out}");
    // On 80x24 every part stays.
    let state = ViewState::new("tcp:127.0.0.1:9464".into());
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(80, 24)).unwrap();
    term.draw(|f| view::draw(f, &p, &state)).unwrap();
    let buf = term.backend().buffer();
    let screen: String = (0..24)
        .map(|y| (0..80).map(|x| buf[(x, y)].symbol()).collect::<String>() + "\n")
        .collect();
    for part in [
        "Models 1/3",
        "alpha",
        "Slots 2/2",
        "Queue 2/64",
        "Tenants 2",
        "q quit",
    ] {
        assert!(screen.contains(part), "no {part:?} in\n{screen}");
    }
}

#[test]
fn durations_and_counts_read_as_people_write_them() {
    assert_eq!(
        [0.0123, 2.06, 65.0, 3725.0].map(view::dur),
        ["12ms", "2.1s", "1m05s", "1h02m"]
    );
    assert_eq!(
        [7.0, 2.5, 410.0, 1234.0, 5.6e6].map(view::count),
        ["7", "2.5", "410", "1.2k", "5.6M"]
    );
    assert_eq!(view::sparkline(&[0, 1, 2, 4, 8, 8], 5), "▁▂▄██");
}
