//! `slotgate policy new --lang rust|python|ts`: each project, made in a folder outside the
//! repository, passes its own tests, builds with its language's toolchain from the registries, and
//! passes `slotgate policy check` and `eval` as it is.

use std::path::{Path, PathBuf};
use std::process::Command;

use slotgate_tests::gate::{run as slotgate, succeeded as ok};
use slotgate_tests::wait::unique_dir;

/// Runs `program args` in `dir` with slotgate on PATH; panics with its output unless it succeeds.
fn sh(dir: &Path, program: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let bin = slotgate_tests::gate::binary_path();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(dir).env("PATH", path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} in {}:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cache(name: &str) -> String {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    format!("{home}/.cache/slotgate/{name}")
}

/// `policy new` in a fresh folder; returns the project's path.
fn new_project(lang: &str, name: &str) -> std::path::PathBuf {
    let dir = unique_dir(&format!("policy-new-{lang}"));
    let out = ok(&slotgate(&[
        "policy",
        "new",
        "--lang",
        lang,
        name,
        "--dir",
        &dir.display().to_string(),
    ]));
    assert!(out.contains("created"), "{out}");
    let project = dir.join(name);
    assert!(project.join("wit/policy.wit").exists());
    project
}

/// `policy check` of the built `<name>.wasm`, and `policy test` of the template's fixtures.
fn check_and_eval(project: &Path, wasm: &Path, expect: &str) {
    let out = ok(&slotgate(&["policy", "check", &wasm.display().to_string()]));
    assert!(out.contains(expect), "{out}");
    // The template's own fixtures pass under the real host, as its README says to run them.
    let fixtures = project.join("fixtures");
    let out = ok(&slotgate(&[
        "policy",
        "test",
        &wasm.display().to_string(),
        &fixtures.display().to_string(),
    ]));
    assert!(out.contains("1 fixture: 1 passed, 0 failed"), "{out}");
}

/// `build.sh` in `project` with `env`, which must build `<name>.wasm`, then [`check_and_eval`] of it.
fn build_and_check(project: &Path, name: &str, env: &[(&str, String)], expect: &str) -> PathBuf {
    let built = sh(project, "bash", &["build.sh"], env);
    let wasm = format!("{name}.wasm");
    assert!(built.contains(&wasm), "{built}");
    let wasm = project.join(wasm);
    check_and_eval(project, &wasm, expect);
    wasm
}

/// `slotgate policy new --lang rust <name> --dir <dir>`, as it ended.
fn new_rust_policy(dir: &Path, name: &str) -> std::process::Output {
    slotgate(&[
        "policy",
        "new",
        "--lang",
        "rust",
        name,
        "--dir",
        &dir.display().to_string(),
    ])
}

#[test]
fn a_new_rust_policy_builds_and_checks_outside_the_repository() {
    let project = new_project("rust", "my-rule");
    // Its own target directory, kept warm between runs (the SDK's dependencies compile once).
    let target = [("CARGO_TARGET_DIR", cache("policy-new-target"))];
    sh(&project, "cargo", &["test", "--quiet"], &target);
    let wasm = build_and_check(&project, "my-rule", &target, "is a v2 policy");
    let report = ok(&slotgate(&[
        "policy",
        "eval",
        "--policy",
        &wasm.display().to_string(),
        "--settings",
        &project.join("settings.json").display().to_string(),
        "--input",
        &project.join("request.json").display().to_string(),
    ]));
    assert!(report.contains("max_tokens is capped at 4096"), "{report}");
}

#[test]
fn a_new_python_policy_builds_and_checks_outside_the_repository() {
    let project = new_project("python", "my-py-rule");
    let venv = [("SLOTGATE_PY_VENV", cache("venv-componentize-py"))];
    sh(&project, "bash", &["build.sh", "bindings"], &venv);
    sh(&project, "python3", &["-m", "unittest"], &venv);
    build_and_check(&project, "my-py-rule", &venv, "is a v2 component");
}

#[test]
fn a_new_typescript_policy_builds_and_checks_outside_the_repository() {
    let project = new_project("ts", "my-ts-rule");
    let npm = [("npm_config_cache", cache("npm-ts-policies"))];
    sh(&project, "bash", &["build.sh", "test"], &npm);
    build_and_check(&project, "my-ts-rule", &npm, "is a v2 component");
}

#[test]
fn a_new_name_must_be_usable_and_new() {
    let dir = unique_dir("policy-new-bad");
    let bad = new_rust_policy(&dir, "My Rule");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a usable policy name"));
    let first = new_rust_policy(&dir, "twice");
    assert!(first.status.success());
    let again = new_rust_policy(&dir, "twice");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));
}
