//! A burst of agents on one llama-server slot: direct, llama-server queues them itself; through
//! slotgate, it forwards one at a time and turns away what its queue cannot hold, and the agents'
//! own retries carry every run through. Every run ends as it did direct.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use slotgate_tests::agents::{burst, Access, Agent, Stage};
use slotgate_tests::llama::{serial, try_sample};
use slotgate_tests::*;

use super::{probes_answered_as_direct, served, KEY};

/// Five Claude Code runs, two of the Codex CLI and one of opencode at once.
const RUNS: [Agent; 8] = [
    Agent::ClaudeCode,
    Agent::Codex,
    Agent::ClaudeCode,
    Agent::OpenCode,
    Agent::ClaudeCode,
    Agent::Codex,
    Agent::ClaudeCode,
    Agent::ClaudeCode,
];

/// The burst direct, then through slotgate (its defaults: a queue of 8, a tenant holding at most
/// half of it), each time as another client's long answer holds the slot: each run ends as its twin
/// did direct; llama-server never had a second request waiting behind its slot; each prompt request
/// through slotgate was served or turned away (429, or 529 on the Messages API), and some were
/// turned away and carried through by the agents' own retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_agents_on_one_slot_ends_through_slotgate_as_direct() {
    let _one = serial().await;
    let stage = Stage::start(1, Gate::new()).await;
    let held = spawn_post(&Client::unix(stage.llama.socket()), CHAT, &hold());
    eventually(HOLD_START, "the hold in llama-server's slot", || async {
        (stage.llama.busy_slots().await == 1).then_some(())
    })
    .await;
    let (direct, direct_took) = burst(&RUNS, &stage.direct(KEY)).await;
    assert_eq!(held.await.unwrap().0.status, 200);
    for d in &direct {
        d.assert_answered();
    }
    stage.llama.assert_idle().await;

    // slotgate measures the agents' throughput first, as a gate that has served them a while has:
    // else its first measure is the hold's, a hundred times slower a token under its grammar, and
    // it refuses the agents' waits as doomed (the Codex CLI's requests, which set no limit, count
    // as a whole context each), which Claude Code takes for a failure.
    Agent::ClaudeCode
        .run(&stage.through(KEY))
        .await
        .assert_answered();
    let (deferred, busy, watch) = watch_llama(&stage);
    let held = stage.gate.hold_slot(&hold()).await;
    let (through, through_took) = burst(&RUNS, &stage.through(KEY)).await;
    assert_eq!(held.await.unwrap().0.status, 200);
    watch.abort();
    for (t, d) in through.iter().zip(&direct) {
        t.assert_same_as(d);
    }
    assert_eq!(
        deferred.load(Ordering::Relaxed),
        0,
        "llama-server deferred a request"
    );
    assert!(
        busy.load(Ordering::Relaxed) <= 1,
        "llama-server ran two at once"
    );

    let log = served(&stage, &RUNS).await;
    let prompts: Vec<_> = log
        .iter()
        .filter(|a| Agent::ALL.iter().any(|agent| agent.route() == a.path))
        .collect();
    for a in &prompts {
        assert!(
            (a.outcome == "ok" && a.status == 200) || turned_away(a),
            "a prompt request neither served nor turned away: {a:?}"
        );
    }
    let refused = prompts.iter().filter(|a| turned_away(a)).count();
    let waited = prompts
        .iter()
        .filter(|a| a.queue_wait_ms.unwrap_or(0) > 0)
        .count();
    eprintln!(
        "a burst of {} agents on one slot: direct {direct_took:?}, through slotgate {through_took:?} \
         ({waited} prompt requests waited in its queue, {refused} were turned away and retried)",
        RUNS.len()
    );
    assert!(
        refused > 0,
        "slotgate turned no prompt request away: the agents' retries went untested"
    );
    probes_answered_as_direct(&stage, &log).await;
    stage.assert_idle().await;
}

/// Tokens of the hold's answer: about 5 s under its grammar (below) on this machine.
const HOLD_TOKENS: u64 = 100;

const HOLD_START: Duration = Duration::from_secs(5);

/// A request that holds the slot as a burst starts, so that the burst meets a full queue: a long
/// answer under a grammar of its own, which llama-server samples slowly (tens of ms a token).
fn hold() -> Req {
    Req::from_json(serde_json::json!({
        "messages": [{"role": "user", "content": "Hold the slot."}],
        "max_tokens": HOLD_TOKENS,
        "ignore_eos": true,
        "grammar": "root ::= [a-z ]+",
    }))
}

/// A prompt request slotgate turned away: 429, or on the Messages API Anthropic's 529 for an
/// overloaded server.
fn turned_away(a: &Access) -> bool {
    a.status == 429 || (a.status == 529 && a.path == "/v1/messages")
}

/// Samples llama-server every 20 ms: the most requests it deferred and the most slots busy at once.
fn watch_llama(stage: &Stage) -> (Arc<AtomicU64>, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let (deferred, busy) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (d, b, socket) = (
        deferred.clone(),
        busy.clone(),
        stage.llama.socket().to_owned(),
    );
    let task = tokio::spawn(async move {
        loop {
            if let Some(s) = try_sample(&socket, Duration::from_secs(1)).await {
                d.fetch_max(s.load.requests_deferred as u64, Ordering::Relaxed);
                b.fetch_max(s.busy_slots as u64, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (deferred, busy, task)
}
