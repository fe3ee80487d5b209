//! `slotgate policy check|eval`: load a policy exactly as the sidecar would, and run it offline
//! against a request, printing the decision, the fuel it burnt and the time it took.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use slotgate_sdk::{EvaluateInput, RequestSummary, ABI_VERSION};

use crate::config::PolicySpec;
use crate::config::{ByteSize, Dur};
use crate::policy::set::{canary_input, hex, read_settings, spec_limits};
use crate::policy::{EngineLimits, LoadError, Policy, PolicyEngine, PolicySet};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check a policy: exports, ABI version, start function and (if given) its settings.
    Check(CheckArgs),
    /// Evaluate a policy against one request offline and print the decision, fuel used and time.
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The policy module (.wasm, or .wat text).
    pub policy: PathBuf,
    /// Settings file (JSON, or TOML by its .toml extension).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The policy module (.wasm, or .wat text).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// Settings file (JSON, or TOML by its .toml extension).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// The request: a request summary (`{"method":..,"path":..}`) or a whole evaluate input
    /// (`{"abi":1,"request":{..},"settings":..}`), as JSON.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// The per-evaluation caps, as in a `[[policy]]` entry.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Fuel (roughly, wasm instructions) one evaluation may burn. [default: 10000000]
    #[arg(long)]
    pub fuel: Option<u64>,
    /// Deadline of one evaluation, in the time it ran: time spent waiting for a core is not counted,
    /// up to a wall-clock ceiling of a few deadlines. [default: 20ms]
    #[arg(long, value_name = "DURATION")]
    pub deadline: Option<Dur>,
    /// Largest linear memory. [default: 16MiB]
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<ByteSize>,
}

pub fn run(cmd: PolicyCommand) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Check(a) => {
            let set = load(&a.policy, a.settings.as_ref(), &a.limits)?;
            let chain = set.current();
            let p = chain.policies().next().context("the policy is loaded")?;
            println!(
                "ok: {} speaks ABI v{ABI_VERSION}; sha256 {}; validate_settings: {}; canary evaluation: passed; on_complete: {}; exact prompt count before deciding: {}",
                a.policy.display(),
                hex(&p.sha256),
                if p.policy.has_validate() {
                    "passed"
                } else {
                    "not exported"
                },
                if p.policy.has_on_complete() {
                    "exported"
                } else {
                    "not exported"
                },
                if p.needs_prompt_tokens {
                    "needed (every request is counted first)"
                } else {
                    "not needed"
                },
            );
            Ok(())
        }
        PolicyCommand::Eval(a) => {
            // Not `load`: a module that fails its canary should still show what it does with this
            // input. The report says whether the sidecar would accept it.
            let spec = spec(&a.policy, a.settings.as_ref(), &a.limits)?;
            let settings = read_settings(a.settings.as_deref())?;
            let limits = spec_limits(&spec);
            let engine = PolicyEngine::new(EngineLimits {
                max_instances: 4,
                ..EngineLimits::default()
            })
            .map_err(|e| anyhow::anyhow!("starting wasmtime: {e:#}"))?;
            let usable = |e: LoadError| {
                anyhow::anyhow!("{}: not a usable slotgate policy: {e}", a.policy.display())
            };
            let bytes = std::fs::read(&a.policy)
                .with_context(|| format!("reading {}", a.policy.display()))?;
            let module = Policy::compile(&engine, &bytes, limits).map_err(usable)?;
            let name = spec.display_name();
            let probe =
                Policy::link(&engine, Arc::default(), &name, &module, limits).map_err(usable)?;
            probe.validate_settings(&settings).map_err(usable)?;
            let canary = match probe.evaluate(&canary_input(&settings)) {
                Ok(_) => "passed".to_owned(),
                Err(e) => {
                    eprintln!("warning: the canary evaluation failed ({e}): the sidecar would refuse this policy");
                    format!("failed ({}): {e}", e.kind())
                }
            };
            let policy =
                Policy::link(&engine, Arc::default(), &name, &module, limits).map_err(usable)?;
            let input = read_input(&a.input, settings)?;
            let (decision, ev) = policy
                .evaluate(&input)
                .map_err(|e| anyhow::anyhow!("evaluation failed ({}): {e}", e.kind()))?;
            let report = json!({
                "decision": decision,
                "fuel_consumed": ev.fuel_used,
                "elapsed_us": ev.elapsed.as_micros() as u64,
                "canary": canary,
            });
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
    }
}

fn spec(path: &Path, settings: Option<&PathBuf>, limits: &LimitArgs) -> anyhow::Result<PolicySpec> {
    let spec = PolicySpec {
        fuel: limits.fuel,
        deadline: limits.deadline,
        memory: limits.memory,
        ..PolicySpec::from_path(path.to_owned(), settings.cloned())
    };
    crate::config::check_policy_limits(&spec)?;
    Ok(spec)
}

/// Loads the policy exactly as the sidecar does: compile, ABI check, settings, one canary evaluation.
fn load(path: &Path, settings: Option<&PathBuf>, limits: &LimitArgs) -> anyhow::Result<PolicySet> {
    let spec = spec(path, settings, limits)?;
    PolicySet::load(&[spec], None).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a usable slotgate policy: {}",
            path.display(),
            e.error
        )
    })
}

fn read_input(path: &Path, settings: Value) -> anyhow::Result<EvaluateInput> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing {} as JSON", path.display()))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64;
    if v.get("request").is_some() {
        let mut input: EvaluateInput = serde_json::from_value(v)
            .with_context(|| format!("{}: not an evaluate input", path.display()))?;
        if !settings.is_null() {
            input.settings = settings;
        }
        if input.abi == 0 {
            input.abi = ABI_VERSION;
        }
        return Ok(input);
    }
    if !v.is_object() {
        bail!("{}: expected a JSON object", path.display());
    }
    let request: RequestSummary = serde_json::from_value(v)
        .with_context(|| format!("{}: not a request summary", path.display()))?;
    Ok(EvaluateInput {
        abi: ABI_VERSION,
        request,
        settings,
        now_unix_ms: now,
    })
}
