//! `slotgate policy check|eval`: a policy is loaded exactly as the sidecar loads it and run offline.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use slotgate_tests::gate::command;
use slotgate_tests::wait::unique_dir;

fn policy(dir: &Path, name: &str, version: i32, decision: &str, evaluate_body: &str) -> PathBuf {
    slotgate_tests::wat::policy(dir, name, version, decision, evaluate_body, "")
}

fn slotgate(args: &[&str]) -> Output {
    command().args(args).output().expect("run slotgate")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `slotgate policy check <policy>`.
fn check(policy: &Path) -> Output {
    slotgate(&["policy", "check", policy.to_str().unwrap()])
}

/// `slotgate policy eval --policy <policy> --input <input> <extra>`.
fn eval(policy: &Path, input: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "policy",
        "eval",
        "--policy",
        policy.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    args.extend(extra);
    slotgate(&args)
}

/// Asserts slotgate said `needle` (on stdout or stderr).
fn assert_says(out: &Output, needle: &str) {
    assert!(text(out).contains(needle), "{}", text(out));
}

/// Asserts slotgate refused with exit status 2, saying `needle`.
fn assert_refused(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", text(out));
    assert_says(out, needle);
}

fn request(dir: &Path) -> PathBuf {
    let path = dir.join("req.json");
    std::fs::write(&path, r#"{"method":"POST","path":"/v1/chat/completions","prompt_chars":40,"prompt_tokens_estimate":10}"#)
        .unwrap();
    path
}

#[test]
fn check_accepts_a_valid_policy_and_names_what_is_wrong_with_others() {
    let dir = unique_dir("policy-check");
    let good = policy(&dir, "good", 1, r#"{"verdict":"allow"}"#, "");
    let out = check(&good);
    assert!(out.status.success(), "{}", text(&out));
    assert_says(&out, "ABI v1");

    let v2 = policy(&dir, "v2", 2, r#"{"verdict":"allow"}"#, "");
    assert_refused(&check(&v2), "ABI 2");

    let junk = dir.join("junk.wasm");
    std::fs::write(&junk, b"\0asm\x01\0\0\0garbage").unwrap();
    assert_refused(&check(&junk), "not a valid wasm module");

    // A file that is not there is not called an invalid module.
    let missing = dir.join("missing.wasm");
    let out = check(&missing);
    assert_refused(&out, "cannot read the module file");
    assert_refused(&out, "No such file or directory");
    assert!(!text(&out).contains("not a valid wasm"), "{}", text(&out));
}

/// The input `slotgate policy eval --help` shows, `{"method":..,"path":..}`, is enough.
#[test]
fn eval_takes_the_input_its_help_shows() {
    let help = command()
        .args(["policy", "eval", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    assert!(help.contains(r#"`{"method":..,"path":..}`"#), "{help}");
    let dir = unique_dir("policy-eval-help");
    let p = policy(&dir, "p", 1, r#"{"verdict":"allow","cost":7}"#, "");
    let req = dir.join("req.json");
    std::fs::write(&req, r#"{"method":"POST","path":"/v1/chat/completions"}"#).unwrap();
    let out = eval(&p, &req, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(report["decision"]["cost"], 7);
}

#[test]
fn eval_prints_the_decision_fuel_and_time() {
    let dir = unique_dir("policy-eval");
    let p = policy(
        &dir,
        "p",
        1,
        r#"{"verdict":"allow","cost":42,"priority":3,"tenant":"t1"}"#,
        "",
    );
    let req = request(&dir);
    let out = eval(&p, &req, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(report["decision"]["cost"], 42);
    assert_eq!(report["decision"]["tenant"], "t1");
    assert!(report["fuel_consumed"].as_u64().unwrap() > 0);
    assert!(report["elapsed_us"].is_u64());
}

#[test]
fn eval_reports_a_runaway_policy_as_bounded_failure() {
    let dir = unique_dir("policy-runaway");
    let spin = policy(
        &dir,
        "spin",
        1,
        r#"{"verdict":"allow"}"#,
        "(loop $l (br $l))",
    );
    let req = request(&dir);
    let started = std::time::Instant::now();
    assert_refused(&eval(&spin, &req, &["--fuel", "100000"]), "(fuel)");
    let out = eval(
        &spin,
        &req,
        &["--fuel", "100000000000", "--deadline", "50ms"],
    );
    assert_says(&out, "(timeout)");
    assert!(
        started.elapsed().as_secs() < 20,
        "runaway policies must end in bounded time"
    );

    let bad_status = policy(&dir, "bad", 1, r#"{"verdict":"deny","status":500}"#, "");
    assert_says(&eval(&bad_status, &req, &[]), "403 or 429");
}

#[test]
fn hash_key_prints_what_policies_see() {
    let out = slotgate(&["hash-key", "abc"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

/// A partial input is enough (the rest is the SDK's defaults), `--api-key` gives the request a
/// key as policies see it, and a field of the wrong type is named by its whole path.
#[test]
fn eval_takes_partial_input_and_a_key_and_names_a_bad_field() {
    let dir = unique_dir("policy-eval-partial");
    let quota = slotgate_tests::wat::built("quota");
    let settings = dir.join("settings.json");
    std::fs::write(&settings, r#"{"period": "day", "requests": 5}"#).unwrap();
    let req = dir.join("partial.json");
    std::fs::write(&req, r#"{"max_tokens": 16}"#).unwrap();
    let out = eval(
        &quota,
        &req,
        &["--settings", settings.to_str().unwrap(), "--api-key", "k1"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(
        report["decision"]["tenant"],
        slotgate_tests::gate::hash_key("k1").as_str(),
        "{report}"
    );
    assert_eq!(
        report["decision"]["rate_limits"]["requests"]["remaining"],
        4
    );

    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"request": {"max_tokens": "lots"}}"#).unwrap();
    let out = eval(&quota, &bad, &["--settings", settings.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_says(&out, "`request.max_tokens`");
}

/// `check` says what a file that is no module is, and warns of a debug build and of a policy far
/// costlier than the examples (both load, and every request pays for them).
#[test]
fn check_names_a_native_build_and_warns_of_debug_builds_and_costly_policies() {
    let dir = unique_dir("policy-check-kinds");
    let native = dir.join("libpolicy.so");
    std::fs::copy("/bin/true", &native).unwrap();
    assert_refused(&check(&native), "an ELF binary, a native build");

    let cheap = policy(&dir, "cheap", 1, r#"{"verdict":"allow"}"#, "");
    let out = check(&cheap);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("warning"), "{}", text(&out));

    let debug = slotgate_tests::wat::policy(
        &dir,
        "debug",
        1,
        r#"{"verdict":"allow"}"#,
        "",
        &format!(r#"(@custom ".debug_info" "{}")"#, "x".repeat(4096)),
    );
    let out = check(&debug);
    assert!(out.status.success(), "{}", text(&out));
    assert_says(&out, "warning: a debug build: 5 KB of DWARF sections");

    let costly = policy(
        &dir,
        "costly",
        1,
        r#"{"verdict":"allow"}"#,
        "(local $i i32) (loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) \
         (br_if $l (i32.lt_u (local.get $i) (i32.const 200000))))",
    );
    let out = check(&costly);
    assert!(out.status.success(), "{}", text(&out));
    assert_says(
        &out,
        "the Rust and AssemblyScript example policies' (policies/, at most 32000)",
    );
    assert_says(
        &out,
        "What helps: keep counts and budgets in the host's state interface",
    );
}

/// The fuel warning compares a policy with the examples of its own language: the Python example
/// (an interpreter inside, ~0.7M fuel a call) and the Rust one (~30k) load without it, while a
/// compiled policy costing what the Python example costs is warned of, as the Rust examples'
/// multiple, with what its author can change. (A heavy Python policy's message: the unit tests of
/// `cmd::policy_cost`.)
#[test]
fn the_fuel_warning_compares_a_policy_with_examples_of_its_language() {
    for name in ["request-guard-py", "request-guard-v2"] {
        let out = check(&slotgate_tests::wat::built(name));
        assert!(out.status.success(), "{name}: {}", text(&out));
        assert!(!text(&out).contains("warning"), "{name}: {}", text(&out));
    }
    // A compiled policy burning about what the Python example burns (a 100,000-round loop).
    let dir = unique_dir("policy-check-language");
    let heavy = policy(
        &dir,
        "heavy",
        1,
        r#"{"verdict":"allow"}"#,
        "(local $i i32) (loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) \
         (br_if $l (i32.lt_u (local.get $i) (i32.const 100000))))",
    );
    let out = check(&heavy);
    assert!(out.status.success(), "{}", text(&out));
    assert_says(&out, "the Rust and AssemblyScript example policies'");
    assert!(!text(&out).contains("isolation"), "{}", text(&out));
    // Near its fuel limit: told to raise it.
    let out = slotgate(&[
        "policy",
        "check",
        "--fuel",
        "1000000",
        heavy.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_says(&out, "of its fuel limit (1000000)");
    assert_says(&out, "raise `fuel` in the policy's [[policy]] entry");
}

/// An author's loop: `check` and `eval` keep what they compile in the user's cache directory
/// unless told otherwise, so a second check of the same file reads it from there instead of
/// compiling again; `--no-cache` keeps nothing. Each says which it was.
#[test]
fn check_and_eval_keep_what_they_compile_in_the_users_cache() {
    let dir = unique_dir("policy-cache");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let p = policy(&dir, "cached", 1, r#"{"verdict":"allow"}"#, "");
    let run = |args: &[&str]| {
        command()
            .args(args)
            .env("HOME", &home)
            .env_remove("XDG_CACHE_HOME")
            .env_remove("SLOTGATE_POLICY_CACHE_DIR")
            .output()
            .expect("run slotgate")
    };
    let kept = home.join(".cache/slotgate/policies");
    let path = p.to_str().unwrap();
    let first = run(&["policy", "check", path]);
    assert!(first.status.success(), "{}", text(&first));
    assert_says(&first, &format!("compiled now, kept in {}", kept.display()));
    let again = run(&["policy", "check", path]);
    assert_says(
        &again,
        &format!("read from the compile cache in {}", kept.display()),
    );
    let req = request(&dir);
    let eval = run(&[
        "policy",
        "eval",
        "--policy",
        path,
        "--input",
        req.to_str().unwrap(),
    ]);
    let report: Value =
        serde_json::from_slice(&eval.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&eval)));
    assert_eq!(
        report["compile"],
        format!("read from the compile cache in {}", kept.display())
    );
    let fresh = run(&["policy", "check", "--no-cache", path]);
    assert_says(&fresh, "compiled now, not kept (--no-cache)");
}
