//! What slotgate holds in memory: idle, and per queued request. Not a test: it prints figures and the
//! ratios to issue 9's targets (≤ 10 MB idle, ≤ 12 KiB per queued request beyond its body) and
//! asserts nothing.
//!
//! One slot, held by a request the fake upstream never answers; then `QUEUED` requests, each with a
//! 2 KB prompt on a connection of its own, wait in the queue. RSS (`VmRSS`, split into anonymous and
//! file-backed) is read after start-up, once the slot is held, and once everyone waits. The same is
//! done for a gate with the example token-budget policy, whose engine and module add their own fixed
//! cost. Per queued request = (RSS with everyone queued − RSS with the slot held) / `QUEUED` − body.
//!
//! Run with `SLOTGATE_BIN=target/release/slotgate cargo bench -p slotgate-tests --bench memory`
//! (release binary; `scripts/build-policies.sh` first for the policy row).

use std::time::Duration;

use slotgate_tests::soak::proc_status;
use slotgate_tests::*;

const QUEUED: usize = 500;
const PROMPT_BYTES: usize = 2048;

fn main() {
    bench_main(run());
}

struct Figures {
    idle: u64,
    held: u64,
    queued: u64,
    anon_idle: u64,
    body: usize,
}

async fn run() {
    println!(
        "slotgate {}: 1 slot held, {QUEUED} requests with a {PROMPT_BYTES}-byte prompt queued\n",
        gate::binary_path().display()
    );
    let plain = measure(Gate::new()).await;
    report("no policy", &plain);
    let budget = wat::built("token-budget");
    let with_policy = measure(Gate::new().policies(&[(
        &budget,
        Some("{ capacity = 1000000000, refill_per_second = 1000000 }"),
    )]))
    .await;
    report("token-budget", &with_policy);
}

fn report(label: &str, f: &Figures) {
    let per = (f.queued.saturating_sub(f.held) as f64 * 1024.0 / QUEUED as f64) - f.body as f64;
    let idle_mb = f.idle as f64 * 1024.0 / 1e6;
    println!(
        "{label:<14} idle RSS {idle_mb:.1} MB (anon {:.1} MB; target 10 MB: {:.2}x) | per queued request beyond its {} B body: {:.1} KiB (target 12 KiB: {:.2}x)",
        f.anon_idle as f64 * 1024.0 / 1e6,
        idle_mb / 10.0,
        f.body,
        per / 1024.0,
        per / 1024.0 / 12.0
    );
}

async fn measure(builder: Gate) -> Figures {
    let (_up, gate) = builder
        .slots(1)
        .queue_depth(QUEUED + 8)
        .queue_timeout("600s")
        .opt("--tenant-queue-share", "1")
        .opt("--upstream-first-byte-timeout", "0s")
        .start_with(FakeUpstream::hang())
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = gate.pid();
    let idle = proc_status(pid, "VmRSS");
    let anon_idle = proc_status(pid, "RssAnon");
    let holder = spawn_post(&gate.client(), CHAT, &Req::chat("holder"));
    gate.wait_busy(1).await;
    // Warm the paths a queued request takes (and the allocator) before the baseline.
    let warm: Vec<_> = (0..8)
        .map(|i| spawn_post(&gate.client(), CHAT, &prompt_req(&format!("warm-{i}"))))
        .collect();
    gate.wait_queue_depth(8).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = proc_status(pid, "VmRSS");
    let body = prompt_req("x").json().to_string().len();
    let waiting: Vec<_> = (0..QUEUED)
        .map(|i| spawn_post(&gate.client(), CHAT, &prompt_req(&format!("q-{i}"))))
        .collect();
    gate.wait_queue_depth((QUEUED + 8) as u64).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let queued = proc_status(pid, "VmRSS");
    for h in waiting.into_iter().chain(warm) {
        h.abort();
    }
    holder.abort();
    Figures {
        idle,
        held,
        queued,
        anon_idle,
        body,
    }
}

fn prompt_req(tag: &str) -> Req {
    let prompt: String = "lighthouse ".repeat(PROMPT_BYTES / 11);
    Req::chat(tag).set(
        "messages",
        serde_json::json!([{"role": "user", "content": prompt}]),
    )
}
