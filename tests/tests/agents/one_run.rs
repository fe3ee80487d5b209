//! One run of each agent direct, then the same run through slotgate: they end alike.

use slotgate_tests::agents::{Agent, Stage};
use slotgate_tests::llama::serial;
use slotgate_tests::*;

use super::{probes_answered_as_direct, served, KEY};

/// Each agent once direct and once through slotgate on one slot: both exit 0 with the grammar's
/// answer and no error; slotgate served each prompt request 200 and answered whatever else the
/// agent sent (Claude Code's `HEAD /`) as llama-server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_agent_ends_through_slotgate_as_it_ends_direct() {
    let _one = serial().await;
    let stage = Stage::start(1, Gate::new()).await;
    for agent in Agent::ALL {
        let direct = agent.run(&stage.direct(KEY)).await;
        let through = agent.run(&stage.through(KEY)).await;
        through.assert_same_as(&direct);
        eprintln!(
            "{}: direct {:?}, through slotgate {:?}, both {:?}",
            agent.name(),
            direct.took,
            through.took,
            through.answer.as_deref().unwrap_or_default()
        );
    }
    let log = served(&stage, &Agent::ALL).await;
    for a in &log {
        let prompt = Agent::ALL.iter().any(|agent| agent.route() == a.path);
        assert!(
            !prompt || (a.outcome == "ok" && a.status == 200),
            "a prompt request not served: {a:?}"
        );
    }
    // Claude Code's `HEAD /` to its base URL, before its prompt: answered too (below).
    assert!(
        log.iter().any(|a| a.method == "HEAD" && a.path == "/"),
        "Claude Code sent no HEAD /: {log:#?}"
    );
    probes_answered_as_direct(&stage, &log).await;
    stage.assert_idle().await;
}
