//! Each agent's headless run: its command line, its environment (nothing inherited but `PATH`), the
//! configuration files it reads from its fresh home, and its output read back as an answer or an error.
//!
//! What keeps each on loopback (each was checked with `strace -e connect` and against the sentinel
//! proxy; docs/agents.md):
//! - Claude Code: `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` (telemetry, error reports, update
//!   checks) and `DISABLE_AUTOUPDATER`.
//! - the Codex CLI: `[analytics] enabled = false` (else it exports metrics to OpenAI at start),
//!   `check_for_update_on_startup = false`, and the plugin, app and remote plugin features off (else
//!   it looks up GitHub for its curated plugins).
//! - opencode: `autoupdate` off, `OPENCODE_DISABLE_MODELS_FETCH` (the models.dev catalogue), no LSP
//!   downloads, no sharing, `--pure` (no external plugins), and a config folder whose `package.json`
//!   and lock already name `@opencode-ai/plugin`: opencode installs it from npm into each config
//!   folder that lacks it, at every start.

use std::path::Path;

use serde_json::{json, Value};
use tokio::process::Command;

use super::{Agent, AgentPaths, PROMPT};

/// The most tokens an agent asks for (Claude Code's and opencode's `max_tokens`): the grammar's answer
/// is 18; a run whose grammar was lost ends at this limit instead of the slot's context.
const MAX_OUTPUT_TOKENS: u64 = 256;

/// The variable the Codex CLI reads its key from (its provider's `env_key`).
const CODEX_KEY_VAR: &str = "SLOTGATE_AGENT_KEY";

/// The command for one run of `agent` in `dir` (its home and working directory are made there).
pub(super) fn command(agent: Agent, dir: &Path, base: &str, key: &str) -> Command {
    let paths = AgentPaths::get();
    let (home, work) = (dir.join("home"), dir.join("work"));
    for d in [&home, &work] {
        std::fs::create_dir_all(d).expect("create the agent's folders");
    }
    let program = match agent {
        Agent::ClaudeCode => &paths.claude_code,
        Agent::Codex => &paths.codex,
        Agent::OpenCode => &paths.opencode,
    };
    let mut cmd = Command::new(program);
    // No key, proxy or setting of the caller's reaches the agent; `PATH` does (its shell tools).
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("LANG", "C.UTF-8")
        .current_dir(&work);
    match agent {
        Agent::ClaudeCode => claude_code(&mut cmd, base, key),
        Agent::Codex => codex(&mut cmd, dir, base, key),
        Agent::OpenCode => opencode(&mut cmd, dir, &home, base, key),
    }
    cmd
}

fn claude_code(cmd: &mut Command, base: &str, key: &str) {
    cmd.args(["-p", PROMPT, "--output-format", "json"])
        .env("ANTHROPIC_BASE_URL", base)
        .env("ANTHROPIC_AUTH_TOKEN", key)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env(
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
            MAX_OUTPUT_TOKENS.to_string(),
        );
}

fn codex(cmd: &mut Command, dir: &Path, base: &str, key: &str) {
    let codex_home = dir.join("codex");
    std::fs::create_dir_all(&codex_home).expect("create CODEX_HOME");
    let config = format!(
        r#"model = "tiny"
model_provider = "under_test"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false

[model_providers.under_test]
name = "llama-server"
base_url = "{base}/v1"
wire_api = "responses"
env_key = "{CODEX_KEY_VAR}"
"#
    );
    std::fs::write(codex_home.join("config.toml"), config).expect("write config.toml");
    cmd.args(["exec", "--skip-git-repo-check", "--json", PROMPT])
        .env("CODEX_HOME", &codex_home)
        .env(CODEX_KEY_VAR, key);
}

fn opencode(cmd: &mut Command, dir: &Path, home: &Path, base: &str, key: &str) {
    let config = json!({
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": false,
        "share": "disabled",
        "model": "under-test/tiny",
        "small_model": "under-test/tiny",
        "provider": {
            "under-test": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "llama-server",
                "options": { "baseURL": format!("{base}/v1"), "apiKey": key },
                "models": {
                    "tiny": {
                        "name": "tiny",
                        "limit": { "context": super::CTX_PER_SLOT, "output": MAX_OUTPUT_TOKENS }
                    }
                }
            }
        }
    });
    let file = dir.join("opencode.json");
    std::fs::write(&file, config.to_string()).expect("write opencode.json");
    // What opencode would otherwise fetch from npm at every start (see the module's comment).
    let folder = home.join(".config/opencode");
    std::fs::create_dir_all(folder.join("node_modules")).expect("create opencode's config folder");
    let deps = json!({ "@opencode-ai/plugin": "*" });
    let lock = json!({ "lockfileVersion": 3, "packages": { "": { "dependencies": deps } } });
    std::fs::write(folder.join("package-lock.json"), lock.to_string()).expect("write the lock");
    let manifest = json!({ "dependencies": deps });
    std::fs::write(folder.join("package.json"), manifest.to_string()).expect("write package.json");
    cmd.args(["run", "--pure", "--format", "json", PROMPT])
        .env("OPENCODE_CONFIG", &file);
    for var in [
        "OPENCODE_DISABLE_AUTOUPDATE",
        "OPENCODE_DISABLE_MODELS_FETCH",
        "OPENCODE_DISABLE_LSP_DOWNLOAD",
        "OPENCODE_DISABLE_SHARE",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS",
    ] {
        cmd.env(var, "1");
    }
}

/// The final answer and the run's error, from what `agent` printed on stdout.
pub(super) fn read_outcome(agent: Agent, stdout: &str) -> (Option<String>, Option<String>) {
    match agent {
        Agent::ClaudeCode => claude_code_outcome(stdout),
        Agent::Codex => codex_outcome(stdout),
        Agent::OpenCode => opencode_outcome(stdout),
    }
}

/// `--output-format json`: one result object; `is_error` says whether `result` is the answer or
/// the error.
fn claude_code_outcome(stdout: &str) -> (Option<String>, Option<String>) {
    let Some(v) = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
    else {
        return (None, Some("no JSON result on stdout".into()));
    };
    let result = v["result"].as_str().map(str::to_owned);
    match v["is_error"].as_bool() {
        Some(false) => (result, None),
        _ => (None, Some(result.unwrap_or_else(|| v.to_string()))),
    }
}

/// `exec --json`: one event a line; the answer is the last `agent_message` item, the error a
/// `turn.failed` (its `error` events before that are retries it reports and goes on from).
fn codex_outcome(stdout: &str) -> (Option<String>, Option<String>) {
    let (mut answer, mut error, mut completed) = (None, None, false);
    for v in events(stdout) {
        match v["type"].as_str() {
            Some("item.completed") if v["item"]["type"] == "agent_message" => {
                answer = v["item"]["text"].as_str().map(str::to_owned);
            }
            Some("turn.failed") => {
                error = Some(
                    v["error"]["message"]
                        .as_str()
                        .map_or_else(|| v.to_string(), str::to_owned),
                );
            }
            Some("turn.completed") => completed = true,
            _ => {}
        }
    }
    if error.is_none() && !completed {
        error = Some("no turn.completed event".into());
    }
    (answer, error)
}

/// `run --format json`: one event a line; the answer is its `text` parts, an `error` event the error.
fn opencode_outcome(stdout: &str) -> (Option<String>, Option<String>) {
    let (mut text, mut error) = (String::new(), None);
    for v in events(stdout) {
        match v["type"].as_str() {
            Some("text") => text.push_str(v["part"]["text"].as_str().unwrap_or_default()),
            Some("error") => {
                error = Some(
                    v["error"]["data"]["message"]
                        .as_str()
                        .map_or_else(|| v["error"].to_string(), str::to_owned),
                );
            }
            _ => {}
        }
    }
    ((!text.is_empty()).then_some(text), error)
}

fn events(stdout: &str) -> impl Iterator<Item = Value> + '_ {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
}
