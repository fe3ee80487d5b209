//! `slotgate policy check|eval`: load a policy exactly as the sidecar would, and run it offline
//! against a request, printing the decision, the fuel it burnt and the time it took.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use slotgate_sdk::{EvaluateInput, ABI_VERSION};

use crate::config::PolicySpec;
use crate::config::{ByteSize, Dur};
use crate::policy::compiled::{Compiled, Linking};
use crate::policy::guest::Contract;
use crate::policy::set::{canary_input, hex, read_settings, spec_limits};
use crate::policy::v2 as component;
use crate::policy::{EngineLimits, LoadError, PolicyEngine, PolicySet};

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check a policy: exports, ABI version, start function and (if given) its settings.
    Check(CheckArgs),
    /// Evaluate a policy against one request offline and print the decision, fuel used and time.
    Eval(EvalArgs),
    /// Create a policy project in Rust, Python or TypeScript that builds outside slotgate's
    /// repository and passes `slotgate policy check` as it is.
    New(super::policy_new::NewArgs),
    /// Run a policy's test cases (JSON fixtures) under the real host: its budgets, a clock the
    /// steps move, requests in and decisions out, in any language it is written in.
    Test(super::policy_test::TestArgs),
    /// Print the v2 contract, the WIT package `slotgate:policy@2.0.0`, for any component
    /// toolchain to generate its bindings from (`slotgate policy wit > wit/policy.wit`).
    Wit,
    /// Write a core module built with wit-bindgen against the v2 contract (a Rust policy with
    /// `export_component!`) as a standalone component. slotgate loads either; other tools need
    /// the component.
    Component(ComponentArgs),
}

#[derive(Debug, Args)]
pub struct ComponentArgs {
    /// The core module (.wasm) carrying the contract.
    pub module: PathBuf,
    /// Where to write the component.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The policy: a v2 component, or an ABI v1 module (.wasm, or .wat text).
    pub policy: PathBuf,
    /// Settings file (JSON, or TOML by its .toml extension).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The policy: a v2 component, or an ABI v1 module (.wasm, or .wat text).
    #[arg(long, value_name = "FILE")]
    pub policy: PathBuf,
    /// Settings file (JSON, or TOML by its .toml extension).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// The request, as JSON: a request summary (`{"method":..,"path":..}`) or an evaluate input
    /// (`{"request":{..},"now_unix_ms":..}`). Either may be partial, as the SDK's test helpers
    /// take it: what it leaves out is a POST to /v1/chat/completions with no key.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// The API key the request carries (policies see its `sha256:` form, as from `slotgate
    /// hash-key`).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
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
    /// Keep compiled policies here, as the sidecar's `--policy-cache-dir` does: a Python or
    /// JavaScript component takes seconds to compile, and a second check of the same file then
    /// takes a fraction of one. [default: $XDG_CACHE_HOME/slotgate/policies, else
    /// ~/.cache/slotgate/policies]
    #[arg(long, env = "SLOTGATE_POLICY_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile the policy afresh and keep nothing (over --cache-dir).
    #[arg(long)]
    pub no_cache: bool,
}

impl LimitArgs {
    /// Where compiled policies are kept: `--cache-dir`, else the user's cache directory; none with
    /// `--no-cache`, without a home, or where the user's is not safe to load code from (said, and
    /// the check goes on without it: only a directory asked for by name must be usable).
    pub(super) fn cache_dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        if let Some(dir) = &self.cache_dir {
            return Some(dir.clone());
        }
        let user_cache = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        let dir = user_cache.join("slotgate").join("policies");
        match crate::owner_only::dir(&dir) {
            Ok(()) => Some(dir),
            Err(e) => {
                eprintln!("warning: no compile cache ({}: {e})", dir.display());
                None
            }
        }
    }
}

/// What the compile cache did for one check or evaluation, for its report.
fn cache_note(dir: Option<&Path>, hits: usize) -> String {
    match (dir, hits) {
        (None, _) => "compiled now, not kept (--no-cache)".to_owned(),
        (Some(d), 0) => format!("compiled now, kept in {}", d.display()),
        (Some(d), _) => format!("read from the compile cache in {}", d.display()),
    }
}

pub fn run(cmd: PolicyCommand) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Check(a) => check(a),
        PolicyCommand::Eval(a) => eval(a),
        PolicyCommand::New(a) => super::policy_new::run(a),
        PolicyCommand::Test(a) => super::policy_test::run(a),
        PolicyCommand::Wit => {
            print!("{}", component::WIT);
            Ok(())
        }
        PolicyCommand::Component(a) => componentize(a),
    }
}

/// `slotgate policy check`: loads it as the sidecar would (validation and canary) and says what
/// it is.
fn check(a: CheckArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&a.policy).unwrap_or_default();
    if let Some(what) = not_wasm(&bytes) {
        bail!("{}: not a slotgate policy: {what}", a.policy.display());
    }
    let cache_dir = a.limits.cache_dir();
    let set = load(&a.policy, a.settings.as_ref(), &a.limits, cache_dir.clone())?;
    let chain = set.current();
    let p = chain.policies().next().context("the policy is loaded")?;
    let fuel_limit = spec_limits(&spec(&a.policy, a.settings.as_ref(), &a.limits)?).fuel;
    super::policy_cost::warn(&bytes, p, fuel_limit);
    let speaks = match (Contract::of(&bytes), p.policy.imports_wasi()) {
        (Contract::V2Embedded, _) => "is a v2 policy (slotgate:policy@2.0.0; a core module carrying the contract, made a component on load)".to_owned(),
        (Contract::V2, true) => "is a v2 component (slotgate:policy@2.0.0; its WASI imports get an empty context: no files, sockets, environment or arguments)".to_owned(),
        (Contract::V2, false) => "is a v2 component (slotgate:policy@2.0.0)".to_owned(),
        (Contract::V1, _) => format!("speaks ABI v{ABI_VERSION}"),
    };
    let hits = set.cache_status()["disk"]["hits"].as_u64().unwrap_or(0) as usize;
    println!(
        "ok: {} {speaks}; sha256 {}; validate_settings: {}; canary evaluation: passed; on_complete: {}; exact prompt count before deciding: {}; {}",
        a.policy.display(),
        hex(&p.sha256),
        if p.policy.has_validate() {
            "passed"
        } else {
            "not exported"
        },
        match (p.policy.contract(), p.policy.has_on_complete()) {
            (Contract::V1, true) => "exported",
            (Contract::V1, false) => "not exported",
            (_, true) => "wanted",
            (_, false) => "not wanted",
        },
        if p.needs_prompt_tokens {
            "needed (every request is counted first)"
        } else {
            "not needed"
        },
        cache_note(cache_dir.as_deref(), hits),
    );
    Ok(())
}

/// `slotgate policy eval`: one evaluation of the input given, with what it cost.
fn eval(a: EvalArgs) -> anyhow::Result<()> {
    // Not `load`: a module that fails its canary should still show what it does with this
    // input. The report says whether the sidecar would accept it.
    let spec = spec(&a.policy, a.settings.as_ref(), &a.limits)?;
    let settings = read_settings(a.settings.as_deref())?;
    let limits = spec_limits(&spec);
    // The sidecar's engine settings, so the compile cache serves both.
    let cache_dir = a.limits.cache_dir();
    let engine = PolicyEngine::with_disk_cache(EngineLimits::default(), cache_dir.as_deref())
        .map_err(|e| anyhow::anyhow!("starting wasmtime: {e:#}"))?;
    let usable =
        |e: LoadError| anyhow::anyhow!("{}: not a usable slotgate policy: {e}", a.policy.display());
    let bytes =
        std::fs::read(&a.policy).with_context(|| format!("reading {}", a.policy.display()))?;
    if let Some(what) = not_wasm(&bytes) {
        bail!("{}: not a slotgate policy: {what}", a.policy.display());
    }
    let module = Compiled::new(&engine, &bytes, limits).map_err(usable)?;
    let hits = engine.disk_cache_stats().map_or(0, |(h, _)| h);
    let name = spec.display_name();
    let link = || module.link(&engine, Arc::default(), &name, limits, Linking::default());
    let probe = link().map_err(usable)?;
    probe.validate_settings(&settings).map_err(usable)?;
    let canary = match probe.evaluate_input(&canary_input(&settings)) {
        Ok(_) => "passed".to_owned(),
        Err(e) => {
            eprintln!(
                "warning: the canary evaluation failed ({e}): the sidecar would refuse this policy"
            );
            format!("failed ({}): {e}", e.kind())
        }
    };
    let policy = link().map_err(usable)?;
    let input = read_input(&a.input, settings, a.api_key.as_deref())?;
    let (decision, ev) = policy
        .evaluate_input(&input)
        .map_err(|e| anyhow::anyhow!("evaluation failed ({}): {e}", e.kind()))?;
    let report = json!({
        "decision": decision,
        "fuel_consumed": ev.fuel_used,
        "elapsed_us": ev.elapsed.as_micros() as u64,
        "canary": canary,
        "compile": cache_note(cache_dir.as_deref(), hits),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// `slotgate policy component`: a core module carrying the v2 contract, made a component.
fn componentize(a: ComponentArgs) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&a.module).with_context(|| format!("reading {}", a.module.display()))?;
    match Contract::of(&bytes) {
        Contract::V2 => bail!("{} is a component already", a.module.display()),
        Contract::V1 => bail!(
            "{}: not built against the v2 contract (no `component-type` section naming slotgate:policy): build it with slotgate-sdk's `v2` feature and `export_component!`",
            a.module.display()
        ),
        Contract::V2Embedded => {}
    }
    let wrapped = component::componentize(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.module.display()))?;
    std::fs::write(&a.output, &wrapped)
        .with_context(|| format!("writing {}", a.output.display()))?;
    println!(
        "{}: a component of {} bytes",
        a.output.display(),
        wrapped.len()
    );
    Ok(())
}

/// What a file that is no WebAssembly module (binary or WAT text) is, when it can be told.
fn not_wasm(bytes: &[u8]) -> Option<String> {
    let build = "build the policy for wasm32-unknown-unknown (scripts/build-policies.sh, or cargo \
                 build --target wasm32-unknown-unknown --profile policy)";
    match bytes {
        [0, b'a', b's', b'm', 1, 0, 0, 0, ..] | [0, b'a', b's', b'm', 0x0d, 0, 1, 0, ..] | [] => {
            None
        }
        [0, b'a', b's', b'm', ..] => Some(
            "a WebAssembly binary of a version this slotgate does not know (a core module is \
             version 1, a component 0x0d layer 1)"
                .into(),
        ),
        [0x7f, b'E', b'L', b'F', ..] => Some(format!("an ELF binary, a native build: {build}")),
        [0xcf, 0xfa, 0xed, 0xfe, ..] | [0xfe, 0xed, 0xfa, 0xcf, ..] => {
            Some(format!("a Mach-O binary, a native build: {build}"))
        }
        [b'M', b'Z', ..] => Some(format!("a Windows binary, a native build: {build}")),
        [b'P', b'K', 3, 4, ..] => Some("a zip archive".into()),
        b if std::str::from_utf8(b).is_err() => {
            Some("neither a WebAssembly binary nor WAT text".into())
        }
        _ => None,
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
fn load(
    path: &Path,
    settings: Option<&PathBuf>,
    limits: &LimitArgs,
    cache_dir: Option<PathBuf>,
) -> anyhow::Result<PolicySet> {
    let spec = spec(path, settings, limits)?;
    PolicySet::load(&[spec], cache_dir).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a usable slotgate policy: {}",
            path.display(),
            e.error
        )
    })
}

/// The evaluate input of `--input`: partial JSON merged onto the SDK's defaults (a request summary
/// alone is the input's `request`), `now_unix_ms` now unless given, the settings and the key.
/// A field of the wrong type is named by its whole path.
fn read_input(
    path: &Path,
    settings: Value,
    api_key: Option<&str>,
) -> anyhow::Result<EvaluateInput> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("parsing {} as JSON", path.display()))?;
    if !v.is_object() {
        bail!("{}: expected a JSON object", path.display());
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64;
    let mut partial = if v.get("request").is_some() || v.get("settings").is_some() {
        v
    } else {
        json!({ "request": v })
    };
    if partial.get("now_unix_ms").is_none() {
        partial["now_unix_ms"] = json!(now);
    }
    if let Some(key) = api_key {
        partial["request"]["api_key"] = json!(crate::pipeline::intake::hash_api_key(key));
    }
    let full = slotgate_sdk::testing::full_input(partial);
    let mut input: EvaluateInput = serde_path_to_error::deserialize(full)
        .map_err(|e| anyhow::anyhow!("{}: `{}`: {}", path.display(), e.path(), e.inner()))?;
    if !settings.is_null() {
        input.settings = settings;
    }
    input.abi = ABI_VERSION;
    Ok(input)
}
