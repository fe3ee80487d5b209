//! Budgets that outlive the process (`state.dir`, docs/policies.md#state): token-budget as a fixed
//! quota keeps what a tenant spent across a SIGKILL, a clean stop and a reload; with `state.dir off`
//! a restart forgets it, as slotgate says at start. A state directory that cannot serve (one it
//! cannot create, a file that is no state database, one another slotgate holds) fails the start
//! with the reason, never starting over with full budgets.

use std::path::Path;
use std::time::Duration;

use slotgate_tests::errors::assert_error;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::{wat, RunningUpstream};

/// A fixed quota: 400 tokens, never refilled.
const QUOTA: Option<&str> = Some("{ capacity = 400, refill_per_second = 0 }");

fn gate_on(state_dir: &str) -> Gate {
    gate_with_slots(state_dir, 1)
}

fn gate_with_slots(state_dir: &str, slots: usize) -> Gate {
    Gate::new()
        .slots(slots)
        .opt("--state-dir", state_dir)
        .policies(&[(&wat::built("token-budget"), QUOTA)])
}

/// One request of 100 tokens (charged up front as its estimate, settled to its usage).
fn hundred(tag: &str) -> serde_json::Value {
    Req::chat(tag)
        .set("max_tokens", 90)
        .prompt_tokens(10)
        .completion_tokens(90)
        .json()
}

/// Sends 100-token requests until the quota refuses one; returns how many were served.
async fn spend_it_all(gate: &RunningGate) -> usize {
    let before = gate
        .metric("slotgate_requests_total", &[("outcome", "ok")])
        .await
        .unwrap_or(0.0) as u64;
    for served in 0..10 {
        let resp = gate
            .client()
            .post_json(CHAT, &hundred(&format!("spend-{}", fastrand::u64(..))))
            .await;
        if resp.status == 429 {
            assert_error(&resp, 429, "policy_denied");
            return served;
        }
        assert_eq!(resp.status, 200, "{}", resp.body);
        // Settled before the next one is charged.
        gate.wait_outcome("ok", before + served as u64 + 1).await;
    }
    panic!("a 400-token quota served ten 100-token requests")
}

async fn one_more(gate: &RunningGate) -> u16 {
    gate.client()
        .post_json(CHAT, &hundred(&format!("after-{}", fastrand::u64(..))))
        .await
        .status
        .as_u16()
}

/// The levels of token-budget's buckets, as `/status` → `state.buckets` shows them.
async fn levels(gate: &RunningGate) -> Vec<(String, f64)> {
    let s = gate.status().await;
    s["state"]["buckets"]["emptiest"]
        .as_array()
        .unwrap_or_else(|| panic!("no state.buckets in {s}"))
        .iter()
        .filter(|b| b["policy"] == "token-budget")
        .map(|b| {
            (
                b["key"].as_str().unwrap().to_owned(),
                b["level"].as_f64().unwrap(),
            )
        })
        .collect()
}

async fn settled(gate: &RunningGate, up: &RunningUpstream) {
    gate.assert_settled(up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_quota_stays_spent_across_a_sigkill_a_stop_and_a_reload() {
    let dir = unique_dir("durable").join("state");
    let dir = dir.to_str().unwrap();
    let up = FakeUpstream::instant().start().await;
    let mut gate = gate_on(dir).upstream(&up).start().await;
    let served = spend_it_all(&gate).await;
    assert!(
        (3..=4).contains(&served),
        "{served} served of a 400-token quota"
    );
    let s = gate.status().await;
    assert_eq!(s["state"]["file"], format!("{dir}/state.redb"), "{s}");
    // A reload keeps it.
    gate.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(one_more(&gate).await, 429);
    // What is left shows in /status, read without taking.
    let before = levels(&gate).await;
    assert_eq!(before.len(), 1, "one tenant: {before:?}");
    assert!(before[0].1 < 100.0, "less than a request left: {before:?}");
    // Past a flush interval (100 ms), SIGKILL: nothing runs on the way out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.signal("KILL");
    gate.wait_exit(Duration::from_secs(5)).await;

    let mut gate = gate_on(dir).upstream(&up).start().await;
    assert_eq!(levels(&gate).await, before, "the same level after the kill");
    assert_eq!(
        one_more(&gate).await,
        429,
        "the quota was spent before the kill"
    );
    assert!(
        gate.stderr_text()
            .contains("policy budgets and the usage ledger kept on disk"),
        "{}",
        gate.stderr_text()
    );
    // A clean stop writes what changed (nothing here), and the next start still refuses.
    gate.sigterm();
    gate.wait_exit(Duration::from_secs(10)).await;
    let gate = gate_on(dir).upstream(&up).start().await;
    assert_eq!(one_more(&gate).await, 429);
    settled(&gate, &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_state_dir_off_a_restart_forgets_and_says_so() {
    let up = FakeUpstream::instant().start().await;
    let mut gate = gate_on("off").upstream(&up).start().await;
    assert!(
        gate.stderr_text()
            .contains("state.dir is off: policy budgets live in memory only"),
        "{}",
        gate.stderr_text()
    );
    spend_it_all(&gate).await;
    gate.signal("KILL");
    gate.wait_exit(Duration::from_secs(5)).await;
    let gate = gate_on("off").upstream(&up).start().await;
    assert_eq!(one_more(&gate).await, 200, "a full budget again");
    assert!(gate.status().await["state"]["file"].is_null());
    settled(&gate, &up).await;
}

/// The start refused, with `says` in its error.
async fn refused(state_dir: &Path, says: &str) {
    let exited = gate_on(state_dir.to_str().unwrap())
        .upstream_url("http://127.0.0.1:1")
        .run_to_exit(Duration::from_secs(15))
        .await;
    assert!(!exited.status.success(), "{}", exited.stderr);
    assert!(exited.stderr.contains(says), "{says}: {}", exited.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_dir_that_cannot_serve_fails_the_start_with_its_reason() {
    let base = unique_dir("durable-bad");
    // Under a file: it cannot be created.
    let file = base.join("a-file");
    std::fs::write(&file, "x").unwrap();
    refused(&file.join("state"), "cannot create it").await;
    // A file that is no state database: left alone, named.
    let foreign = base.join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("state.redb"), vec![0x5a; 8192]).unwrap();
    refused(&foreign, "cannot be read as slotgate's state").await;
    assert_eq!(
        std::fs::read(foreign.join("state.redb")).unwrap(),
        vec![0x5a; 8192],
        "nothing was changed"
    );
    // Held by another slotgate.
    let shared = base.join("shared");
    let up = FakeUpstream::instant().start().await;
    let first = gate_on(shared.to_str().unwrap())
        .upstream(&up)
        .start()
        .await;
    refused(&shared, "open in another slotgate").await;
    settled(&first, &up).await;
}

/// A small tmpfs at a fresh directory, unmounted when dropped (the test runs as root, as CI does).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let at = unique_dir("durable-tmpfs");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount a tmpfs at {} (needs root)", at.display());
        Tmpfs(at)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the file system of `dir` until it refuses another byte.
fn fill(dir: &Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_is_logged_and_counted_and_written_once_there_is_room_again() {
    let disk = Tmpfs::mount("4m");
    let dir = disk.0.join("state");
    let dir = dir.to_str().unwrap();
    let up = FakeUpstream::instant().start().await;
    let mut gate = gate_with_slots(dir, 8).upstream(&up).start().await;
    let filler = fill(&disk.0);
    // Every API key is a tenant with a bucket of its own: the rows outgrow the pages free in the
    // file, and the disk has no room for more.
    let mut tenants = 0;
    while gate
        .metric("slotgate_state_writes_total", &[("result", "error")])
        .await
        .is_none()
    {
        assert!(tenants < 4000, "4000 new buckets, and no write failed");
        let batch: Vec<_> = (tenants..tenants + 8)
            .map(|i| {
                let client = gate.client();
                tokio::spawn(async move {
                    let key = format!("Bearer tenant-{i}");
                    let body = hundred(&format!("t-{i}"));
                    let r = client
                        .post_json_with_headers(CHAT, &body, &[("authorization", key.as_str())])
                        .await;
                    assert_eq!(r.status, 200, "{}", r.body);
                })
            })
            .collect();
        for b in batch {
            b.await.unwrap();
        }
        tenants += 8;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Budgets are still enforced, from memory.
    spend_it_all(&gate).await;
    assert_eq!(one_more(&gate).await, 429);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = gate.stderr_text();
    assert_eq!(
        log.matches("policy budgets cannot be written to disk")
            .count(),
        1,
        "logged once, not every interval: {log}"
    );
    // Room again: what waited is written, and survives a SIGKILL.
    std::fs::remove_file(&filler).unwrap();
    slotgate_tests::wait::eventually(Duration::from_secs(10), "a write again", || async {
        gate.stderr_text()
            .contains("policy budgets are written to disk again")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.signal("KILL");
    gate.wait_exit(Duration::from_secs(5)).await;
    let gate = gate_on(dir).upstream(&up).start().await;
    assert_eq!(one_more(&gate).await, 429, "the spent quota was kept");
    let r = gate
        .client()
        .post_json_with_headers(
            CHAT,
            &hundred("another"),
            &[("authorization", "Bearer tenant-0")],
        )
        .await;
    assert_eq!(r.status, 200, "tenant-0 had 300 tokens left: {}", r.body);
    // The first gate ran eight at once on the same fake.
    gate.assert_settled(&up, 8).await;
}

/// A budget belongs to the name the module gives itself (the SDK writes its crate's), not to its
/// file's: a renamed file keeps it. Two files of one module would share it: refused, with the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renamed_policy_file_keeps_its_budgets() {
    let base = unique_dir("durable-rename");
    let dir = base.join("state");
    let dir = dir.to_str().unwrap();
    let (v1, v2) = (base.join("budget-v1.wasm"), base.join("budget-v2.wasm"));
    std::fs::copy(wat::built("token-budget"), &v1).unwrap();
    let up = FakeUpstream::instant().start().await;
    let on = |file: &Path| {
        Gate::new()
            .opt("--state-dir", dir)
            .policies(&[(file, QUOTA)])
            .upstream(&up)
    };
    let mut gate = on(&v1).start().await;
    spend_it_all(&gate).await;
    let s = gate.status().await;
    assert_eq!(s["policies"]["chain"][0]["name"], "budget-v1", "{s}");
    assert_eq!(
        s["policies"]["chain"][0]["state_key"], "token-budget",
        "{s}"
    );
    gate.sigterm();
    gate.wait_exit(Duration::from_secs(10)).await;

    std::fs::rename(&v1, &v2).unwrap();
    let gate = on(&v2).start().await;
    assert_eq!(
        one_more(&gate).await,
        429,
        "the renamed file's budget is the same"
    );
    settled(&gate, &up).await;

    // The module twice, unnamed: one budget for both would be wrong, so the start is refused.
    std::fs::copy(&v2, &v1).unwrap();
    let exited = Gate::new()
        .opt("--state-dir", base.join("other").to_str().unwrap())
        .policies(&[(&v1, QUOTA), (&v2, QUOTA)])
        .upstream_url("http://127.0.0.1:1")
        .run_to_exit(Duration::from_secs(15))
        .await;
    assert!(!exited.status.success(), "{}", exited.stderr);
    assert!(
        exited.stderr.contains("give each its own `name`"),
        "{}",
        exited.stderr
    );
}
