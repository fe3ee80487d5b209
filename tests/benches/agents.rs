//! Coding agents on one slot, measured: the wall time of a burst of agent runs (Claude Code, the
//! Codex CLI, opencode, headless; docs/agents.md) against llama-server direct and through slotgate,
//! and the ratio through / direct. Not a test: it prints figures and asserts nothing about time
//! (every run must still answer, else a figure would hide a failure).
//!
//! Each round runs the burst direct and through slotgate, in turns (the first of the pair alternates
//! from round to round, so a machine that warms up or gets busier favours neither side); the figure
//! is the median of the rounds' ratios.
//!
//! Run with `bash scripts/bench-agents.sh` (release binary), or by hand:
//! `SLOTGATE_BIN=target/release/slotgate cargo bench -p slotgate-tests --bench agents`.
//! `AGENTS_CLAUDE_CODE`, `AGENTS_CODEX` and `AGENTS_OPENCODE` set the burst (default 5, 2 and 1, the
//! `agents` test's), `AGENTS_ROUNDS` the rounds (default 3).

use std::time::Duration;

use slotgate_tests::agents::{burst, Agent, Stage, Target};
use slotgate_tests::*;

const KEY: &str = "sk-agents-bench";

fn main() {
    bench_main(run());
}

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{var}={v} is not a count"))
        })
        .unwrap_or(default)
}

async fn run() {
    let mut runs = Vec::new();
    for (agent, var, default) in [
        (Agent::ClaudeCode, "AGENTS_CLAUDE_CODE", 5),
        (Agent::Codex, "AGENTS_CODEX", 2),
        (Agent::OpenCode, "AGENTS_OPENCODE", 1),
    ] {
        runs.extend(std::iter::repeat_n(agent, count(var, default)));
    }
    let rounds = count("AGENTS_ROUNDS", 3).max(1);
    let stage = Stage::start(1, Gate::new()).await;
    let (direct, through) = (stage.direct(KEY), stage.through(KEY));
    println!(
        "a burst of {} agent runs ({} Claude Code, {} Codex CLI, {} opencode) on one llama-server slot, {rounds} rounds",
        runs.len(),
        runs.iter().filter(|&&a| a == Agent::ClaudeCode).count(),
        runs.iter().filter(|&&a| a == Agent::Codex).count(),
        runs.iter().filter(|&&a| a == Agent::OpenCode).count(),
    );
    // One run of each first: the agents' first start reads their binaries from disk.
    for agent in Agent::ALL {
        agent.run(&direct).await.assert_answered();
    }
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let (d, t) = if round % 2 == 0 {
            let d = timed(&runs, &direct).await;
            (d, timed(&runs, &through).await)
        } else {
            let t = timed(&runs, &through).await;
            (timed(&runs, &direct).await, t)
        };
        let ratio = t.as_secs_f64() / d.as_secs_f64();
        println!(
            "round {}: direct {:.1} s, through slotgate {:.1} s, ratio {ratio:.2}",
            round + 1,
            d.as_secs_f64(),
            t.as_secs_f64()
        );
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let refused = agents_log_refusals(&stage);
    println!(
        "wall time through slotgate / direct: {median:.2} (median of {rounds}); slotgate turned away {refused} prompt requests, which the agents retried"
    );
    stage.assert_idle().await;
}

/// One burst; every run must answer.
async fn timed(runs: &[Agent], target: &Target) -> Duration {
    let (outcomes, took) = burst(runs, target).await;
    for o in &outcomes {
        o.assert_answered();
    }
    took
}

fn agents_log_refusals(stage: &Stage) -> usize {
    agents::access_log(&stage.gate.stderr_text())
        .iter()
        .filter(|a| a.status == 429)
        .count()
}
