//! The llama-server people run today, for real (the one `scripts/setup-llama.sh` builds, tiny
//! random-weight models): its default shared KV pool, every endpoint its clients use (the Anthropic
//! and OpenAI SDKs from PyPI among them), requests that take several slots, a server that wants a
//! key, and CORS as it does it. Each test starts its own llama-server; they run one at a time on
//! this machine's two cores.

mod api_key;
mod cors;
mod dialects;
mod pool;
mod resumable;
mod sdks;
mod several;
mod waiting;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::gate::free_port;
// Holds the machine for one test (one lock for the whole `llama` binary).
use slotgate_tests::llama::{serial, try_sample, RunningLlama};
use slotgate_tests::*;

/// `gate` before `llama` on a TCP port as well as its Unix socket (the SDKs speak TCP): the gate
/// and `http://127.0.0.1:PORT`.
pub(crate) async fn gate_before(llama: &RunningLlama, gate: Gate) -> (RunningGate, String) {
    let port = free_port();
    let gate = gate
        .listen(format!(
            "unix:{}",
            unique_dir("sock").join("slotgate.sock").display()
        ))
        .listen(format!("tcp:127.0.0.1:{port}"))
        .start_before(llama)
        .await;
    (gate, format!("http://127.0.0.1:{port}"))
}

/// Waits until slotgate has read llama-server's `/props` (and its command line).
async fn learned(gate: &RunningGate) -> Value {
    gate.wait_status(Duration::from_secs(10), "the slot context learned", |s| {
        s["kv_pool"]["n_ctx_slot"].is_u64()
    })
    .await
}

/// How every scenario ends: nothing queued, busy or in flight at the gate, llama-server idle with
/// nothing deferred.
async fn assert_both_idle(gate: &RunningGate, llama: &RunningLlama) {
    gate.assert_idle().await;
    assert_eq!(gate.status().await["kv_pool"]["reserved_tokens"], 0);
    llama.assert_idle().await;
}

/// Samples llama-server's `requests_deferred` every 20 ms; the largest seen.
pub fn watch_deferred(socket: &std::path::Path) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let peak = Arc::new(AtomicU64::new(0));
    let (p, socket) = (peak.clone(), socket.to_owned());
    let task = tokio::spawn(async move {
        loop {
            if let Some(s) = try_sample(&socket, Duration::from_secs(1)).await {
                p.fetch_max(s.load.requests_deferred as u64, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (peak, task)
}
