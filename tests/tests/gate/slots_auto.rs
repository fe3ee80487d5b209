//! `--slots auto` (the default) follows llama-server's `total_slots` from `/props`, also across a
//! restart with another `-np`; a fixed `--slots` that differs is warned about in the log, `/status`
//! and `slotgate_slots_mismatch`.

use std::time::Duration;

use slotgate_tests::*;

/// Waits until `/status` reports `n` slots, and returns it.
async fn wait_slots(gate: &RunningGate, n: u64) -> serde_json::Value {
    gate.wait_status(
        Duration::from_secs(5),
        &format!("slots.total == {n}"),
        |s| s["slots"]["total"].as_u64() == Some(n),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auto_takes_the_servers_slot_count_and_serves_that_many_at_once() {
    let slow = FakeUpstream::instant().total_slots(3).delay(ms(800));
    let (up, gate) = Gate::new().queue_depth(8).start_with(slow).await;
    let st = wait_slots(&gate, 3).await;
    assert_eq!(st["slots"]["configured"], "auto", "{st}");
    assert_eq!(st["slots"]["upstream_total_slots"], 3, "{st}");
    assert_eq!(st["slots"]["mismatch"], false, "{st}");
    assert!(
        st["slots"]["source"].as_str().unwrap().contains("/props"),
        "{st}"
    );
    assert_eq!(gate.metric("slotgate_slots_total", &[]).await, Some(3.0));
    assert_eq!(gate.metric("slotgate_upstream_slots", &[]).await, Some(3.0));

    // Three go at once, the fourth waits for one of them.
    let client = gate.client();
    let held: Vec<_> = (0..4)
        .map(|i| spawn_post(&client, CHAT, &Req::chat(&format!("r{i}"))))
        .collect();
    gate.wait_busy(3).await;
    gate.wait_queue_depth(1).await;
    for h in held {
        let (resp, _) = h.await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    assert_eq!(up.max_concurrency(), 3);
    gate.assert_settled(&up, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auto_follows_a_restart_with_another_slot_count_and_waiters_get_the_new_slots() {
    let path = wait::unique_dir("up").join("llama.sock");
    let up = FakeUpstream::instant()
        .total_slots(1)
        .at(&path)
        .start()
        .await;
    let gate = Gate::new().queue_depth(8).upstream(&up).start().await;
    wait_slots(&gate, 1).await;
    drop(up);
    gate.wait_status(Duration::from_secs(3), "upstream not ready", |s| {
        s["upstream"]["ready"] == false
    })
    .await;
    // Requests sent while the server is away wait for it (and for its slots).
    let client = gate.client();
    let waiting: Vec<_> = (0..3)
        .map(|i| spawn_post(&client, CHAT, &Req::chat(&format!("w{i}"))))
        .collect();
    let up = FakeUpstream::instant()
        .total_slots(4)
        .delay(ms(300))
        .at(&path)
        .start()
        .await;
    wait_slots(&gate, 4).await;
    for h in waiting {
        let (resp, _) = h.await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    // With four slots, four at once.
    let held: Vec<_> = (0..4)
        .map(|i| spawn_post(&client, CHAT, &Req::chat(&format!("r{i}"))))
        .collect();
    gate.wait_busy(4).await;
    for h in held {
        assert_eq!(h.await.unwrap().0.status, 200);
    }
    gate.assert_settled(&up, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixed_count_that_differs_from_the_server_is_warned_about_and_kept() {
    let (up, gate) = Gate::new()
        .slots(2)
        .start_with(FakeUpstream::instant().total_slots(3))
        .await;
    let st = gate
        .wait_status(Duration::from_secs(5), "the mismatch seen", |s| {
            s["slots"]["mismatch"] == true
        })
        .await;
    assert_eq!(
        st["slots"]["total"], 2,
        "the operator's number stands: {st}"
    );
    assert_eq!(st["slots"]["configured"], "2", "{st}");
    assert_eq!(st["slots"]["upstream_total_slots"], 3, "{st}");
    assert_eq!(st["slots"]["source"], "fixed (--slots)", "{st}");
    assert_eq!(gate.metric("slotgate_slots_mismatch", &[]).await, Some(1.0));
    let log = std::fs::read_to_string(gate.dir().join("stderr.log")).unwrap();
    assert_eq!(
        log.matches("--slots differs from llama-server's total_slots")
            .count(),
        1,
        "one warning, not one per health probe:\n{log}"
    );
    assert!(log.contains("extra slots stay idle"), "{log}");
    gate.assert_settled(&up, 2).await;

    // The same number: no mismatch.
    let (up, gate) = Gate::new()
        .slots(3)
        .start_with(FakeUpstream::instant().total_slots(3))
        .await;
    gate.wait_metric("slotgate_upstream_slots", &[], 3.0).await;
    gate.wait_metric("slotgate_slots_mismatch", &[], 0.0).await;
    assert_eq!(gate.status().await["slots"]["mismatch"], false);
    gate.assert_settled(&up, 3).await;
}

#[test]
fn slots_take_auto_or_a_number() {
    let check = |args: &[&str]| {
        gate::command()
            .arg("check")
            .args(args)
            .output()
            .expect("run slotgate check")
    };
    let out = check(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("slots = \"auto\""), "the default:\n{text}");
    let out = check(&["--slots", "4"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("slots = 4"));
    let out = check(&["--slots", "many"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use auto or a number"), "{err}");
}
