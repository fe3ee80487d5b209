//! Coding agents in CI (docs/agents.md): Claude Code, the Codex CLI and opencode, headless, against
//! the real llama-server and the long-context tiny model, each run direct and through slotgate and
//! compared: same exit status, same answer, no error. Then a burst of them on one slot. Every scenario
//! ends with slotgate and llama-server idle and no agent having tried to leave loopback. The agents
//! come from `scripts/setup-agents.sh` (npm, pinned); a missing one fails the test, naming the script.

mod burst;
mod keys;
mod one_run;

use std::time::Duration;

use http::Method;
use slotgate_tests::agents::{access_log, Access, Agent, Stage};
use slotgate_tests::*;

/// The key the agents present (one tenant for all of them, as a CI job's agents share one).
const KEY: &str = "sk-agents-in-ci";

/// slotgate's access lines, once every agent in `runs` has at least one prompt request in them.
async fn served(stage: &Stage, runs: &[Agent]) -> Vec<Access> {
    eventually(
        Duration::from_secs(5),
        "an access line for every run",
        || async {
            let log = access_log(&stage.gate.stderr_text());
            let answered = |agent: Agent| {
                log.iter()
                    .filter(|a| a.path == agent.route() && a.outcome == "ok")
                    .count()
            };
            Agent::ALL
                .iter()
                .all(|&agent| answered(agent) >= runs.iter().filter(|&&r| r == agent).count())
                .then_some(log.clone())
        },
    )
    .await
}

/// Every request the agents sent besides their prompts (Claude Code's `HEAD /` first, whatever else
/// they probe): slotgate answered it as llama-server answers it direct.
async fn probes_answered_as_direct(stage: &Stage, log: &[Access]) {
    let direct = Client::unix(stage.llama.socket());
    let prompts = Agent::ALL.map(Agent::route);
    let mut probes: Vec<(&str, &str, u16)> = log
        .iter()
        .filter(|a| !prompts.contains(&a.path.as_str()))
        .map(|a| (a.method.as_str(), a.path.as_str(), a.status))
        .collect();
    probes.sort_unstable();
    probes.dedup();
    eprintln!("what the agents sent besides their prompts: {probes:?}");
    for (method, path, status) in probes {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let want = direct.request(method.clone(), path).await.status.as_u16();
        assert_eq!(
            status, want,
            "{method} {path}: slotgate answered {status}, llama-server answers {want}"
        );
    }
}
