//! The coding agents CI runs headless against slotgate and the real llama-server (docs/agents.md):
//! Claude Code (`claude -p`, the Anthropic Messages API), the Codex CLI (`codex exec`, the Responses
//! API) and opencode (`opencode run`, chat completions), pinned and installed by
//! `scripts/setup-agents.sh`. A run is one agent in a home of its own, configured for one base URL
//! and nothing else, and what it ended with: its exit status, its final answer, the error it reported.
//!
//! llama-server runs the long-context tiny model with a grammar ([`GRAMMAR`]): random weights never
//! stop by themselves, and an agent takes an answer cut at its token limit for an error (Claude Code
//! exits 1); under the grammar every answer is [`ANSWER`] and ends as a model's turn ends, so a run
//! through slotgate and a run direct can be compared word for word.
//!
//! - [`headless`]: each agent's command line, environment and configuration files.
//! - [`loopback`]: a relay from TCP to llama-server's Unix socket (the agents speak TCP), a sentinel
//!   proxy that records any attempt to leave loopback, and slotgate's access log read back.

mod headless;
mod loopback;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use loopback::{access_log, Access, Relay, Sentinel};

use crate::gate::{free_port, Gate, RunningGate};
use crate::llama::{default_argv, LlamaServer, RunningLlama};
use crate::wait::unique_dir;

/// Every answer the model gives under [`GRAMMAR`].
pub const ANSWER: &str = "Hello from the tiny model.";

/// llama-server's `--grammar`: its default for every request that brings none (the agents bring
/// none). Short on purpose: llama-server checks every candidate token against the grammar, tens of
/// milliseconds a token for a long one.
pub const GRAMMAR: &str = r#"root ::= "Hello from the tiny model.""#;

/// The agents' system prompts and tool lists run to 3k to 5k tokens of this model's vocabulary.
pub const CTX_PER_SLOT: usize = 16_384;

/// What each agent is asked.
pub const PROMPT: &str = "Say hello in one short sentence.";

/// How long one run may take before it counts as hung; a burst on one slot takes about 30 s.
const RUN_TIMEOUT: Duration = Duration::from_secs(150);

/// llama-server as the agents tests run it: the long-context tiny model, `np` slots of
/// [`CTX_PER_SLOT`] tokens, [`GRAMMAR`], and `-n 1024` for a request that sets no limit of its own
/// (the Codex CLI sends none).
pub fn llama_argv(np: usize) -> Vec<String> {
    let slots = np.to_string();
    default_argv(
        CTX_PER_SLOT * np,
        &["-np", &slots, "-n", "1024", "--grammar", GRAMMAR],
    )
}

/// The three programs `scripts/setup-agents.sh` installs.
#[derive(Debug, Clone)]
pub struct AgentPaths {
    pub claude_code: PathBuf,
    pub codex: PathBuf,
    pub opencode: PathBuf,
}

const SETUP: &str = "eval \"$(bash scripts/setup-agents.sh)\" && export CLAUDE_CODE CODEX OPENCODE";

impl AgentPaths {
    /// `CLAUDE_CODE`, `CODEX` and `OPENCODE` if all are set, else what `scripts/setup-agents.sh`
    /// prints (it installs them from npm the first time). Panics with the reason when neither works:
    /// a test that skipped would claim what it never ran.
    pub fn get() -> &'static AgentPaths {
        static PATHS: OnceLock<Result<AgentPaths, String>> = OnceLock::new();
        match PATHS.get_or_init(resolve) {
            Ok(paths) => paths,
            Err(e) => panic!("{e}\n(the agents come from `{SETUP}`)"),
        }
    }
}

fn resolve() -> Result<AgentPaths, String> {
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let paths = match (var("CLAUDE_CODE"), var("CODEX"), var("OPENCODE")) {
        (Some(claude_code), Some(codex), Some(opencode)) => AgentPaths {
            claude_code,
            codex,
            opencode,
        },
        _ => {
            let script = "setup-agents.sh";
            let stdout = crate::setup_script(script)?;
            let field = |key: &str| crate::setup_value(script, &stdout, key);
            AgentPaths {
                claude_code: field("CLAUDE_CODE")?,
                codex: field("CODEX")?,
                opencode: field("OPENCODE")?,
            }
        }
    };
    for p in [&paths.claude_code, &paths.codex, &paths.opencode] {
        if !p.is_file() {
            return Err(format!("{} is not a file", p.display()));
        }
    }
    Ok(paths)
}

/// One of the agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    ClaudeCode,
    Codex,
    OpenCode,
}

impl Agent {
    pub const ALL: [Agent; 3] = [Agent::ClaudeCode, Agent::Codex, Agent::OpenCode];

    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "Claude Code",
            Agent::Codex => "Codex CLI",
            Agent::OpenCode => "opencode",
        }
    }

    /// The path of the request that carries its prompt.
    pub fn route(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "/v1/messages",
            Agent::Codex => "/v1/responses",
            Agent::OpenCode => "/v1/chat/completions",
        }
    }

    /// Runs the agent once on [`PROMPT`] against `target`, in a fresh home and working directory;
    /// waits for its end (at most [`RUN_TIMEOUT`], then it is killed and the outcome says so).
    pub async fn run(self, target: &Target) -> Outcome {
        let dir = target
            .cacheable
            .clone()
            .unwrap_or_else(|| unique_dir("agent"));
        let mut cmd = headless::command(self, &dir, &target.base, &target.key);
        if let (Some(n), Agent::ClaudeCode) = (target.retries, self) {
            cmd.env("CLAUDE_CODE_MAX_RETRIES", n.to_string());
        }
        if target.cacheable.is_some() && self == Agent::ClaudeCode {
            cmd.env("CLAUDE_CODE_ATTRIBUTION_HEADER", "0");
        }
        // Not Claude Code: with a proxy set it leaves out the `HEAD /` it sends its base URL first,
        // which slotgate must answer as llama-server does. Its one switch for other traffic
        // (`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`) was checked under `strace` (docs/agents.md).
        if self != Agent::ClaudeCode {
            for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
                cmd.env(var, &target.proxy)
                    .env(var.to_lowercase(), &target.proxy);
            }
            for var in ["NO_PROXY", "no_proxy"] {
                cmd.env(var, "127.0.0.1,localhost,::1");
            }
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let t0 = Instant::now();
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.name()));
        let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await;
        let took = t0.elapsed();
        if target.cacheable.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let (code, stdout, stderr) = match out {
            Ok(Ok(o)) => (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ),
            Ok(Err(e)) => panic!("{}: {e}", self.name()),
            Err(_) => (
                None,
                String::new(),
                format!("still running after {RUN_TIMEOUT:?}"),
            ),
        };
        let (answer, error) = headless::read_outcome(self, &stdout);
        Outcome {
            agent: self,
            code,
            answer,
            error,
            took,
            stdout,
            stderr,
        }
    }
}

/// Where a run sends its requests: a base URL (`http://127.0.0.1:PORT`), the key it presents, and
/// the proxy it is given for every other host ([`Sentinel`]; all but Claude Code, see
/// [`Agent::run`]).
#[derive(Debug, Clone)]
pub struct Target {
    pub base: String,
    pub key: String,
    pub proxy: String,
    /// Claude Code's own retries of a failed call (`CLAUDE_CODE_MAX_RETRIES`); its default when
    /// `None`. A run meant to be refused sets 0: it would otherwise back off and ask again.
    pub retries: Option<u32>,
    /// Runs as a developer's agent runs all day, so llama-server's prompt cache can match their
    /// prompts: in one home and working directory (the system prompt names it), and Claude Code
    /// without its attribution header (`CLAUDE_CODE_ATTRIBUTION_HEADER=0`, as operators of local
    /// models run it: the header opens the system prompt with a hash that changes every request).
    /// `None`: a fresh directory per run.
    pub cacheable: Option<std::path::PathBuf>,
}

impl Target {
    /// The same target, without Claude Code's retries: for a run that is to be refused.
    pub fn no_retries(mut self) -> Target {
        self.retries = Some(0);
        self
    }

    /// The same target, its runs' prompts cacheable ([`Target::cacheable`]).
    pub fn cacheable(mut self) -> Target {
        self.cacheable = Some(unique_dir("agent-cacheable"));
        self
    }
}

/// A burst: every run in `runs` started at once against `target`; their outcomes in that order, and
/// the wall time from the first start to the last end.
pub async fn burst(runs: &[Agent], target: &Target) -> (Vec<Outcome>, Duration) {
    let t0 = Instant::now();
    let tasks = runs
        .iter()
        .map(|&agent| {
            let target = target.clone();
            tokio::spawn(async move { agent.run(&target).await })
        })
        .collect();
    let outcomes = crate::join_all(tasks).await;
    (outcomes, t0.elapsed())
}

/// llama-server ([`llama_argv`]) and slotgate before it on TCP, as the agents reach them, with a
/// relay for the direct runs and the sentinel for everything else.
pub struct Stage {
    pub llama: RunningLlama,
    pub gate: RunningGate,
    pub relay: Relay,
    pub sentinel: Sentinel,
    /// slotgate's TCP address, `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Stage {
    /// llama-server with `np` slots, and `gate` before it on TCP only (its access log in JSON).
    pub async fn start(np: usize, gate: Gate) -> Stage {
        let llama = LlamaServer::start_argv(llama_argv(np)).await;
        let port = free_port();
        let gate = gate
            .listen(format!("tcp:127.0.0.1:{port}"))
            .opt("--log-format", "json")
            .start_before(&llama)
            .await;
        let relay = Relay::to_unix(llama.socket()).await;
        Stage {
            llama,
            gate,
            relay,
            sentinel: Sentinel::start().await,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// llama-server, direct (through the relay).
    pub fn direct(&self, key: &str) -> Target {
        self.target(self.relay.url(), key)
    }

    /// slotgate.
    pub fn through(&self, key: &str) -> Target {
        self.target(self.base.clone(), key)
    }

    fn target(&self, base: String, key: &str) -> Target {
        Target {
            base,
            key: key.to_owned(),
            proxy: self.sentinel.url(),
            retries: None,
            cacheable: None,
        }
    }

    /// How every scenario ends: slotgate's queue, in-flight requests and busy slots back at 0 in its
    /// `/status` and its `/metrics`, nothing reserved, llama-server idle with nothing deferred, and no
    /// agent tried to leave loopback.
    pub async fn assert_idle(&self) {
        self.gate.assert_idle().await;
        let m = self.gate.metrics().await;
        for gauge in [
            "slotgate_queue_depth",
            "slotgate_inflight",
            "slotgate_slots_busy",
        ] {
            assert_eq!(m.value(gauge, &[]), Some(0.0), "{gauge}");
        }
        assert_eq!(self.gate.status().await["kv_pool"]["reserved_tokens"], 0);
        self.llama.assert_idle().await;
        self.sentinel.assert_quiet();
    }
}

/// How one run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub agent: Agent,
    /// The exit status; `None` when it was killed (a signal, or still running at the timeout).
    pub code: Option<i32>,
    /// Its final answer, as its own output reports it.
    pub answer: Option<String>,
    /// The error it reported for the run, if any (Claude Code's `is_error` result, the Codex CLI's
    /// `turn.failed`, opencode's `error` event).
    pub error: Option<String>,
    pub took: Duration,
    pub stdout: String,
    pub stderr: String,
}

/// What two runs of one agent must share to have ended the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub code: Option<i32>,
    pub answer: Option<String>,
    pub error: Option<String>,
}

impl Outcome {
    pub fn ending(&self) -> Ending {
        Ending {
            code: self.code,
            answer: self.answer.clone(),
            error: self.error.clone(),
        }
    }

    /// Exit status 0, no error, and the answer [`ANSWER`].
    pub fn assert_answered(&self) {
        assert!(
            self.code == Some(0) && self.error.is_none() && self.answer.as_deref() == Some(ANSWER),
            "{} did not answer: {:?}\n--- stdout ---\n{}\n--- stderr (end) ---\n{}",
            self.agent.name(),
            self.ending(),
            self.stdout,
            tail(&self.stderr, 30)
        );
    }

    /// This run ended as `direct` did (same status, answer and error), and answered.
    pub fn assert_same_as(&self, direct: &Outcome) {
        direct.assert_answered();
        assert_eq!(
            self.ending(),
            direct.ending(),
            "{} through slotgate did not end as it did direct\n--- stdout ---\n{}\n--- stderr (end) ---\n{}",
            self.agent.name(),
            self.stdout,
            tail(&self.stderr, 30)
        );
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
