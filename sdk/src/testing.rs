//! Native test helper: runs a policy on JSON the way the host does (bytes in, bytes out, through the
//! same code as the wasm32 exports), against the emulated host state. Not compiled on wasm32.
//!
//! Inputs are *partial*: the JSON given is merged (objects key by key, recursively) onto
//! [`DEFAULT_INPUT`] or [`DEFAULT_COMPLETION`], so a test states only what matters to it. Unless
//! the input names the request's `caller`, it is named as the host names it (from `tenant`,
//! `api_key` and `peer`: [`RequestSummary::name_caller`]).
//!
//! The emulated host state (buckets, windows, clock, log) is per thread and survives between calls,
//! like the real host's; call [`reset`] where a test needs a clean slate. [`run_fixture`] resets.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::dispatch;
use crate::host::{emulated, Level};
use crate::policy::Policy;
use crate::types::{Decision, RequestSummary, SettingsValidation};

/// What [`run`] merges its input onto: a POST to `/v1/chat/completions` over TCP with no key and
/// no settings.
pub const DEFAULT_INPUT: &str = r#"{
  "abi": 1,
  "request": {
    "method": "POST", "path": "/v1/chat/completions", "stream": false,
    "prompt_chars": 0, "prompt_tokens_estimate": 0, "headers": {},
    "queue": {"depth": 0, "capacity": 8, "in_flight": 0, "estimated_wait_seconds": 0.0}
  },
  "settings": null,
  "now_unix_ms": 1800000000000
}"#;

/// What [`complete`] merges its input onto: the request of [`DEFAULT_INPUT`], allowed, answered
/// 200 with no usage reported.
pub const DEFAULT_COMPLETION: &str = r#"{
  "abi": 1,
  "request": {
    "method": "POST", "path": "/v1/chat/completions", "stream": false,
    "prompt_chars": 0, "prompt_tokens_estimate": 0, "headers": {},
    "queue": {"depth": 0, "capacity": 8, "in_flight": 0, "estimated_wait_seconds": 0.0}
  },
  "decision": {"verdict": "allow"},
  "settings": null,
  "status": 200, "outcome": "ok",
  "prompt_tokens": 0, "completion_tokens": 0, "queue_wait_ms": 0, "upstream_ms": 0
}"#;

/// Evaluates a partial input (merged onto [`DEFAULT_INPUT`]). Panics if the policy gives no
/// decision, as the host would count a policy error.
pub fn run<P: Policy>(input_json: &str) -> Decision {
    try_run::<P>(input_json).unwrap_or_else(|e| panic!("policy error: {e}"))
}

/// [`run`], returning the policy error (bad input, bad settings) instead of panicking.
pub fn try_run<P: Policy>(input_json: &str) -> Result<Decision, String> {
    let patch = parse(input_json, "input");
    let output = evaluate_raw::<P>(patch)?;
    Ok(serde_json::from_value(output).expect("the SDK always emits a valid decision"))
}

/// Calls `on_complete` with a partial completion (merged onto [`DEFAULT_COMPLETION`]).
pub fn complete<P: Policy>(completion_json: &str) {
    complete_raw::<P>(parse(completion_json, "completion"));
}

/// Validates settings as the host does at load.
pub fn validate<P: Policy>(settings_json: &str) -> SettingsValidation {
    let out = dispatch::validate_settings::<P>(settings_json.as_bytes(), false).0;
    serde_json::from_slice(&out).expect("the SDK always emits a valid SettingsValidation")
}

/// Forgets all emulated host state on this thread: buckets, windows, log; the clock goes to 0.
pub fn reset() {
    emulated::reset();
}

/// Moves the emulated clocks (monotonic and wall) forward, refilling buckets, ageing windows and
/// reaching the next quota windows.
pub fn advance_ms(ms: i64) {
    emulated::advance_ms(ms);
}

/// Sets the emulated wall clock ([`host::wall_ms`](crate::host::wall_ms), the quota windows) to
/// `unix_ms`; [`advance_ms`] moves it on from there. [`reset`] puts it back at the default input's
/// `now_unix_ms`.
pub fn set_wall_ms(unix_ms: i64) {
    emulated::set_wall_ms(unix_ms);
}

/// Sets (or, `None`, removes) an operator's limit for a quota, as the quota admin API does: the
/// quota host functions use it in place of the policy's.
pub fn set_quota_limit(key: &str, period: &str, limit: Option<f64>) {
    emulated::set_quota_limit(key, period, limit);
}

/// The events ([`host::event`](crate::host::event)) counted on this thread since the last call.
pub fn take_events() -> Vec<String> {
    emulated::take_events()
}

/// The messages logged on this thread since the last call (or [`reset`]).
pub fn take_logs() -> Vec<(Level, String)> {
    emulated::take_logs()
}

/// One fixture file: the settings it loads the policy with and its steps. The format is shared
/// with `slotgate policy test`, which runs the same files under the real host.
#[derive(Debug)]
pub struct Fixture {
    /// Settings for every input that gives none.
    pub settings: Option<Value>,
    /// What to do, in order.
    pub steps: Vec<Step>,
}

/// A fixture as written: one case (`input`, `expect`) or `steps`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    #[serde(default)]
    #[allow(dead_code, reason = "a note for readers of the fixture")]
    description: Option<String>,
    #[serde(default)]
    settings: Option<Value>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    expect: Option<Value>,
    #[serde(default)]
    steps: Vec<Step>,
}

/// One step of a fixture: exactly one of its fields (`expect` goes with `input`).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Evaluate this request (partial, merged onto [`DEFAULT_INPUT`]).
    #[serde(default)]
    pub input: Option<Value>,
    /// What the decision must hold ([`matches`]); under the real host, `{"error": KIND}` for an
    /// evaluation that must fail so.
    #[serde(default)]
    pub expect: Option<Value>,
    /// Tell the policy how a request ended (partial, merged onto [`DEFAULT_COMPLETION`]).
    #[serde(default)]
    pub complete: Option<Value>,
    /// Move the clocks on.
    #[serde(default)]
    pub advance_ms: Option<i64>,
    /// Set the wall clock to these Unix milliseconds.
    #[serde(default)]
    pub set_wall_ms: Option<i64>,
    /// An operator's limit for a quota (`limit: null` takes it away).
    #[serde(default)]
    pub set_quota_limit: Option<QuotaLimit>,
    /// What the policy's budgets hold now, as the real host's `/status` shows them: checked by
    /// `slotgate policy test` only (this emulation keeps no such view).
    #[serde(default)]
    pub budgets: Option<Value>,
}

/// An operator's limit for a quota, as `slotgate quota set` gives it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimit {
    /// The quota's key, as the policy names it (`requests:uid:1000`).
    pub key: String,
    /// Its period (`day`, `month@Europe/Berlin`).
    pub period: String,
    /// The limit, or `None` to go back to the policy's own.
    pub limit: Option<f64>,
}

/// What a step of each kind is called, for a step that is none of them.
pub const STEP_KINDS: &str = "`input` (with `expect`), `complete`, `advance_ms`, `set_wall_ms`, \
                              `set_quota_limit` or `budgets`";

impl Fixture {
    /// Reads a fixture file: one case becomes a scenario of one step.
    pub fn read(path: &Path) -> Result<Fixture, String> {
        let text = fs::read_to_string(path).map_err(|e| format!("reading it: {e}"))?;
        let w: Written = serde_json::from_str(&text).map_err(|e| format!("not a fixture: {e}"))?;
        let steps = match (w.input, w.steps.is_empty()) {
            (Some(input), true) => vec![Step {
                input: Some(input),
                expect: w.expect,
                ..Step::default()
            }],
            (None, false) if w.expect.is_none() => w.steps,
            _ => return Err("a fixture has either `input` (and `expect`) or `steps`".into()),
        };
        Ok(Fixture {
            settings: w.settings,
            steps,
        })
    }
}

/// Runs one JSON fixture file from a clean emulated host, and panics on the first mismatch.
///
/// A fixture is either one case, `{"input": {...}, "expect": {...}}`, or a scenario,
/// `{"steps": [...]}` where each step is one of
///
/// - `{"input": {...}, "expect": {...}}`: evaluate; `expect` is optional;
/// - `{"complete": {...}}`: call `on_complete`;
/// - `{"advance_ms": 2000}`: move the emulated clock.
///
/// Inputs are partial, as for [`run`] and [`complete`]. A top-level `"settings"` applies to every
/// input that has none; `"description"` is free text. `expect` is matched partially too: every
/// field it gives must be equal in the decision's JSON (objects recursively), `null` means absent,
/// and fields it leaves out are not checked.
pub fn run_fixture<P: Policy>(path: impl AsRef<Path>) {
    let path = path.as_ref();
    let fixture = Fixture::read(path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    let steps = fixture.steps;
    reset();
    for (i, step) in steps.into_iter().enumerate() {
        let at = format!("{} step {}", path.display(), i + 1);
        run_step::<P>(step, fixture.settings.as_ref(), &at);
    }
}

/// Runs every `*.json` fixture in `dir` (sorted by name), each from a clean emulated host. Panics if
/// there are none, so a wrong path cannot pass silently. Returns how many ran.
pub fn run_fixtures<P: Policy>(dir: impl AsRef<Path>) -> usize {
    let dir = dir.as_ref();
    let mut paths: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading fixture directory {}: {e}", dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no *.json fixtures in {}", dir.display());
    for path in &paths {
        run_fixture::<P>(path);
    }
    paths.len()
}

fn run_step<P: Policy>(step: Step, settings: Option<&Value>, at: &str) {
    let with_settings = |mut v: Value| {
        if let (Some(s), Value::Object(map)) = (settings, &mut v) {
            map.entry("settings").or_insert_with(|| s.clone());
        }
        v
    };
    match step {
        Step {
            input: Some(input),
            expect,
            ..
        } => {
            let output =
                evaluate_raw::<P>(with_settings(input)).unwrap_or_else(|e| panic!("{at}: {e}"));
            if let Some(expect) = expect {
                let mut why = String::new();
                if !matches(&expect, &output, "decision", &mut why) {
                    panic!(
                        "{at}: the decision does not match `expect`:\n{why}  decision: {output}"
                    );
                }
            }
        }
        Step {
            complete: Some(completion),
            ..
        } => complete_raw::<P>(with_settings(completion)),
        Step {
            advance_ms: Some(ms),
            ..
        } => advance_ms(ms),
        Step {
            set_wall_ms: Some(ms),
            ..
        } => set_wall_ms(ms),
        Step {
            set_quota_limit: Some(q),
            ..
        } => set_quota_limit(&q.key, &q.period, q.limit),
        Step {
            budgets: Some(_), ..
        } => panic!("{at}: `budgets` is checked under the real host only: `slotgate policy test`"),
        _ => panic!("{at}: a step is one of {STEP_KINDS}"),
    }
}

fn evaluate_raw<P: Policy>(patch: Value) -> Result<Value, String> {
    let input = merged(DEFAULT_INPUT, patch);
    let out = dispatch::evaluate::<P>(&serde_json::to_vec(&input).expect("JSON"), None)?;
    Ok(serde_json::from_slice(&out).expect("the SDK always emits JSON"))
}

fn complete_raw<P: Policy>(patch: Value) {
    let input = merged(DEFAULT_COMPLETION, patch);
    dispatch::on_complete::<P>(&serde_json::to_vec(&input).expect("JSON"), None)
        .unwrap_or_else(|e| panic!("policy error: {e}"));
}

fn parse(json: &str, what: &str) -> Value {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("the test's {what} is not JSON: {e}"))
}

fn merged(base: &str, patch: Value) -> Value {
    let mut v: Value = serde_json::from_str(base).expect("the defaults are JSON");
    merge(&mut v, patch);
    name_caller(&mut v);
    v
}

/// Names the caller of an input's request as the host does, unless the input names it.
fn name_caller(input: &mut Value) {
    let Some(request) = input.get_mut("request").and_then(Value::as_object_mut) else {
        return;
    };
    if request.contains_key("caller") {
        return;
    }
    // A request of the wrong shape is left for the policy to refuse, as the host's would be.
    if let Ok(r) = serde_json::from_value::<RequestSummary>(Value::Object(request.clone())) {
        request.insert("caller".into(), Value::String(r.name_caller()));
    }
}

/// A partial evaluate input (as [`run`] takes it) merged onto [`DEFAULT_INPUT`]: what `slotgate
/// policy eval` evaluates.
pub fn full_input(partial: Value) -> Value {
    merged(DEFAULT_INPUT, partial)
}

/// A partial completion (as [`complete`] takes it) merged onto [`DEFAULT_COMPLETION`].
pub fn full_completion(partial: Value) -> Value {
    merged(DEFAULT_COMPLETION, partial)
}

/// Object keys merge recursively; anything else replaces.
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (k, v) in patch {
                merge(base.entry(k).or_insert(Value::Null), v);
            }
        }
        (base, patch) => *base = patch,
    }
}

/// Whether `actual` has every field of `expected` (objects recursively; `null` = absent; numbers
/// to 0.001), noting each difference in `why`.
pub fn matches(expected: &Value, actual: &Value, at: &str, why: &mut String) -> bool {
    match expected {
        Value::Object(fields) => {
            let mut ok = true;
            for (k, want) in fields {
                let got = actual.get(k).unwrap_or(&Value::Null);
                ok &= matches(want, got, &format!("{at}.{k}"), why);
            }
            ok
        }
        Value::Number(want) if actual.is_number() => {
            let close = matches!((want.as_f64(), actual.as_f64()),
                (Some(w), Some(g)) if (w - g).abs() <= 1e-3);
            if !close {
                let _ = writeln!(why, "  {at}: expected {want}, got {actual}");
            }
            close
        }
        want if want == actual => true,
        want => {
            let _ = writeln!(why, "  {at}: expected {want}, got {actual}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Completion, EvaluateInput, Verdict};

    /// Denies prompts over `max_chars`, counts completions in a window.
    struct Probe;

    #[derive(Deserialize)]
    struct ProbeSettings {
        #[serde(default = "ten")]
        max_chars: u64,
    }

    fn ten() -> u64 {
        10
    }

    impl Policy for Probe {
        type Settings = ProbeSettings;

        fn validate(s: &ProbeSettings) -> Result<(), String> {
            if s.max_chars == 0 {
                return Err("max_chars must be positive".into());
            }
            Ok(())
        }

        fn evaluate(input: &EvaluateInput, s: &ProbeSettings) -> Decision {
            let done = crate::host::window_add("done", 60_000, 0);
            if input.request.prompt_chars > s.max_chars {
                return Decision::forbidden("too long");
            }
            Decision {
                cost: Some(done as u64),
                ..Decision::allow()
            }
        }

        fn on_complete(_: &Completion, _: &ProbeSettings) {
            crate::host::window_add("done", 60_000, 1);
        }
    }

    #[test]
    fn run_merges_defaults_and_uses_settings() {
        assert!(
            run::<Probe>("{}").is_allowed(),
            "null settings fall back to {{}}"
        );
        let d = run::<Probe>(r#"{"request": {"prompt_chars": 11}}"#);
        assert_eq!((d.verdict, d.status), (Verdict::Deny, Some(403)));
        let d = run::<Probe>(r#"{"request": {"prompt_chars": 11}, "settings": {"max_chars": 20}}"#);
        assert!(d.is_allowed());
        let err = try_run::<Probe>(r#"{"settings": {"max_chars": "x"}}"#).unwrap_err();
        assert!(err.contains("invalid settings"), "{err}");
        let err = try_run::<Probe>(r#"{"abi": 2}"#).unwrap_err();
        assert!(err.contains("ABI 2"), "{err}");
    }

    #[test]
    fn validate_reports_shape_and_semantic_errors() {
        assert!(validate::<Probe>("null").valid);
        assert!(validate::<Probe>(r#"{"max_chars": 5}"#).valid);
        let v = validate::<Probe>(r#"{"max_chars": 0}"#);
        assert_eq!(v.message.as_deref(), Some("max_chars must be positive"));
        assert!(!validate::<Probe>(r#"{"max_chars": -1}"#).valid);
        assert!(!validate::<Probe>("not json").valid);
    }

    #[test]
    fn fixtures_run_scenarios_against_emulated_state() {
        let dir =
            std::env::temp_dir().join(format!("slotgate-sdk-fixtures-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("a.json"),
            r#"{"input": {"request": {"prompt_chars": 11}}, "expect": {"verdict": "deny", "status": 403}}"#,
        )
        .unwrap();
        fs::write(
            dir.join("b.json"),
            r#"{"description": "completions are counted", "settings": {"max_chars": 50},
                "steps": [
                  {"input": {"request": {"prompt_chars": 40}}, "expect": {"verdict": "allow", "cost": 0, "status": null}},
                  {"complete": {}},
                  {"advance_ms": 1000},
                  {"input": {}, "expect": {"cost": 1, "mutations": {"strip_id_slot": false}}}
                ]}"#,
        )
        .unwrap();
        fs::write(dir.join("ignored.txt"), "not a fixture").unwrap();
        assert_eq!(run_fixtures::<Probe>(&dir), 2);

        fs::write(
            dir.join("c.json"),
            r#"{"input": {}, "expect": {"verdict": "deny"}}"#,
        )
        .unwrap();
        let failure = std::panic::catch_unwind(|| run_fixture::<Probe>(dir.join("c.json")))
            .unwrap_err()
            .downcast::<String>()
            .unwrap();
        assert!(
            failure.contains(r#"decision.verdict: expected "deny", got "allow""#),
            "{failure}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
