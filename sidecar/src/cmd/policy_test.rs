//! `slotgate policy test`: runs a policy's test cases under the real host, whatever language it is
//! written in. Each fixture file gets the policy loaded as the sidecar loads it (compile, settings,
//! canary), budgets of its own, and a clock that stands still until a step moves it: requests in,
//! decisions out, budgets checked between them (docs/policies.md, "Testing a policy").

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};
use slotgate_sdk::testing::{self, matches, Fixture, Step, STEP_KINDS};
use slotgate_sdk::{Completion, EvaluateInput};

use crate::config::PolicySpec;
use crate::policy::fold::ChainOutcome;
use crate::policy::PolicySet;

/// Where a fixture's clock starts: the SDKs' test inputs' `now_unix_ms` (2027-01-15T08:00:00Z).
pub const START_MS: i64 = 1_800_000_000_000;

#[derive(Debug, Args)]
pub struct TestArgs {
    /// The policy: a v2 component, or an ABI v1 module (.wasm, or .wat text).
    pub policy: PathBuf,
    /// Fixture files (`*.json`), or folders of them, run in name order.
    #[arg(required = true, value_name = "FIXTURE")]
    pub fixtures: Vec<PathBuf>,
    #[command(flatten)]
    pub limits: super::policy::LimitArgs,
}

pub fn run(a: TestArgs) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for f in &a.fixtures {
        if f.is_dir() {
            let mut found: Vec<_> = std::fs::read_dir(f)
                .with_context(|| format!("reading {}", f.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            if found.is_empty() {
                bail!("{}: no *.json fixtures in it", f.display());
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(f.clone());
        }
    }
    let cache_dir = a.limits.cache_dir();
    let scratch = tempdir()?;
    let mut failed = 0;
    for file in &files {
        match run_fixture(&a, file, cache_dir.clone(), &scratch) {
            Ok(1) => println!("ok   {} (1 step)", file.display()),
            Ok(steps) => println!("ok   {} ({steps} steps)", file.display()),
            Err(e) => {
                failed += 1;
                println!("FAIL {}: {e:#}", file.display());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let n = files.len();
    println!(
        "{n} fixture{}: {} passed, {failed} failed ({})",
        if n == 1 { "" } else { "s" },
        n - failed,
        a.policy.display()
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// Runs one fixture from fresh budgets and the clock at [`START_MS`]: how many steps it ran.
fn run_fixture(
    a: &TestArgs,
    file: &Path,
    cache_dir: Option<PathBuf>,
    scratch: &Path,
) -> anyhow::Result<usize> {
    let fixture = Fixture::read(file).map_err(|e| anyhow::anyhow!(e))?;
    let steps = fixture.steps;
    let settings_value = settings_of(fixture.settings, &steps)?;
    let settings = scratch.join("settings.json");
    std::fs::write(&settings, settings_value.to_string())?;
    let spec = PolicySpec {
        fuel: a.limits.fuel,
        deadline: a.limits.deadline,
        memory: a.limits.memory,
        ..PolicySpec::from_path(a.policy.clone(), Some(settings))
    };
    crate::config::check_policy_limits(&spec)?;
    let set = PolicySet::load(&[spec], cache_dir)
        .map_err(|e| anyhow::anyhow!("not a usable slotgate policy: {}", e.error))?;
    let shared = set.shared();
    shared.clock().set_wall_ms(START_MS);
    let chain = set.current();
    let state_key = chain
        .policies()
        .next()
        .context("a policy")?
        .state_key
        .clone();
    let count = steps.len();
    for (i, step) in steps.into_iter().enumerate() {
        let at = || format!("step {}", i + 1);
        match step {
            Step {
                input: Some(input),
                expect,
                ..
            } => {
                let input = evaluate_input(input, shared.clock().wall_ms()).with_context(at)?;
                let (outcome, _) = chain.evaluate_each_at(&input.request, input.now_unix_ms);
                check(&outcome, expect.as_ref()).with_context(at)?;
            }
            Step {
                complete: Some(completion),
                ..
            } => {
                let completion = completion_of(completion).with_context(at)?;
                let own = [Some(completion.decision.clone())];
                chain.complete(&completion, &own);
            }
            Step {
                advance_ms: Some(ms),
                ..
            } => shared.clock().advance_ms(ms),
            Step {
                set_wall_ms: Some(ms),
                ..
            } => shared.clock().set_wall_ms(ms),
            Step {
                set_quota_limit: Some(q),
                ..
            } => {
                shared
                    .set_quota_limit(&state_key, &q.key, &q.period, q.limit)
                    .map_err(|e| anyhow::anyhow!(e))
                    .with_context(at)?;
            }
            Step {
                budgets: Some(want),
                ..
            } => check_budgets(shared, &state_key, &want).with_context(at)?,
            Step { .. } => bail!("{}: a step is one of {STEP_KINDS}", at()),
        }
    }
    Ok(count)
}

/// The settings the policy is loaded with: the fixture's, else those its inputs carry (the SDKs'
/// test inputs may): the host gives a policy one set of settings, so all must agree.
fn settings_of(fixture: Option<Value>, steps: &[Step]) -> anyhow::Result<Value> {
    let mut settings = fixture;
    for (i, step) in steps.iter().enumerate() {
        let Some(own) = step.input.as_ref().and_then(|input| input.get("settings")) else {
            continue;
        };
        match &settings {
            None => settings = Some(own.clone()),
            Some(s) if s == own => {}
            Some(_) => bail!(
                "step {}: its input's settings differ from the fixture's: the host loads a policy \
                 with one set of settings, so put a case with other settings in a fixture of its \
                 own",
                i + 1
            ),
        }
    }
    Ok(settings.unwrap_or(Value::Null))
}

/// A partial evaluate input merged onto the SDKs' defaults, at the fixture's clock unless it says,
/// its caller named as the host names it unless it says.
fn evaluate_input(partial: Value, now_ms: i64) -> anyhow::Result<EvaluateInput> {
    let mut partial = partial;
    if partial.get("now_unix_ms").is_none() {
        partial["now_unix_ms"] = json!(now_ms.max(0));
    }
    let full = testing::full_input(partial);
    serde_path_to_error::deserialize(full)
        .map_err(|e| anyhow::anyhow!("the input's `{}`: {}", e.path(), e.inner()))
}

/// A partial completion merged onto the SDKs' defaults (the request allowed, answered 200 with no
/// usage), its caller named as the host names it unless it says.
fn completion_of(partial: Value) -> anyhow::Result<Completion> {
    serde_path_to_error::deserialize(testing::full_completion(partial))
        .map_err(|e| anyhow::anyhow!("the completion's `{}`: {}", e.path(), e.inner()))
}

/// Checks the chain's outcome against `expect`.
fn check(outcome: &ChainOutcome, expect: Option<&Value>) -> anyhow::Result<()> {
    let decision = match outcome {
        ChainOutcome::Allow(d) | ChainOutcome::Deny { decision: d, .. } => d,
        ChainOutcome::Failed { error, .. } => {
            let want = expect.and_then(|e| e.get("error")).and_then(Value::as_str);
            if want == Some(error.kind()) {
                return Ok(());
            }
            bail!("the evaluation failed ({}): {error}", error.kind());
        }
    };
    let Some(expect) = expect else {
        return Ok(());
    };
    let got = serde_json::to_value(decision)?;
    let mut why = String::new();
    if !matches(expect, &got, "decision", &mut why) {
        bail!("the decision does not match `expect`:\n{why}  decision: {got}");
    }
    Ok(())
}

/// Checks the policy's buckets and quotas as `/status` and `/quotas` show them now.
fn check_budgets(
    shared: &crate::budgets::Budgets,
    state_key: &str,
    want: &Value,
) -> anyhow::Result<()> {
    let (buckets, _) = shared.bucket_levels(usize::MAX);
    let (quotas, _) = shared.quota_levels(usize::MAX);
    let got = json!({
        "buckets": buckets
            .iter()
            .filter(|b| &*b.name.policy == state_key)
            .map(|b| (b.name.key.clone(), json!(b.level)))
            .collect::<serde_json::Map<_, _>>(),
        "quotas": quotas
            .iter()
            .filter(|q| &*q.quota.policy == state_key)
            .map(|q| (format!("{} {}", q.quota.key, q.quota.period), json!(q.left)))
            .collect::<serde_json::Map<_, _>>(),
    });
    let mut why = String::new();
    if !matches(want, &got, "budgets", &mut why) {
        bail!("the budgets do not match:\n{why}  budgets: {got}");
    }
    Ok(())
}

/// A folder of slotgate's own for the fixtures' settings files.
fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("slotgate-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
