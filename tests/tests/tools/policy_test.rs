//! `slotgate policy test`: an example's fixtures run under the real host, in every language it is
//! written in, and a fixture that does not hold fails naming its step and field.

use std::path::{Path, PathBuf};
use std::process::Output;

use slotgate_tests::gate::command;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `slotgate policy test <policy> <fixtures>`.
fn policy_test(policy: &Path, fixtures: &Path) -> Output {
    command()
        .args(["policy", "test"])
        .arg(policy)
        .arg(fixtures)
        .output()
        .expect("run slotgate")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_examples_fixtures_pass_in_every_language_it_is_written_in() {
    // The Rust originals' fixtures, and every port held to them: v1 and v2 builds of the same
    // Rust, the Python, TypeScript and AssemblyScript ports. The same decisions, in both contracts.
    let examples: &[(&str, &[PathBuf])] = &[
        (
            "request-guard",
            &[
                wat::built("request-guard"),
                wat::built("request-guard-v2"),
                wat::built("request-guard-py"),
                wat::built_as("request-guard"),
            ],
        ),
        (
            "tenant-priority",
            &[
                wat::built("tenant-priority"),
                wat::built("tenant-priority-v2"),
                wat::built("tenant-priority-ts"),
            ],
        ),
        (
            "token-budget",
            &[
                wat::built("token-budget"),
                wat::built("token-budget-v2"),
                wat::built_as("token-budget"),
            ],
        ),
        ("quota", &[wat::built("quota"), wat::built("quota-v2")]),
    ];
    for (example, builds) in examples {
        let fixtures = repo().join("policies").join(example).join("fixtures");
        let count = std::fs::read_dir(&fixtures)
            .unwrap_or_else(|e| panic!("{}: {e}", fixtures.display()))
            .count();
        assert!(count > 0, "{example} has fixtures");
        for build in *builds {
            let out = policy_test(build, &fixtures);
            let said = text(&out);
            assert!(out.status.success(), "{}:\n{said}", build.display());
            let fixtures = if count == 1 { "fixture" } else { "fixtures" };
            assert!(
                said.contains(&format!("{count} {fixtures}: {count} passed, 0 failed")),
                "{said}"
            );
        }
    }
}

#[test]
fn a_fixture_that_does_not_hold_fails_naming_its_step_and_field() {
    let dir = unique_dir("policy-test");
    // The token budget's own scenario with one expectation wrong: the second request is a 429.
    let good = repo().join("policies/token-budget/fixtures/refill-and-refund.json");
    let bad =
        std::fs::read_to_string(&good)
            .unwrap()
            .replacen("\"status\": 429", "\"status\": 403", 1);
    std::fs::write(dir.join("wrong.json"), bad).unwrap();
    std::fs::copy(&good, dir.join("right.json")).unwrap();
    let out = policy_test(&wat::built("token-budget-v2"), &dir);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("ok   ") && said.contains("right.json"),
        "{said}"
    );
    assert!(
        said.contains("FAIL ") && said.contains("wrong.json: step 2"),
        "{said}"
    );
    assert!(
        said.contains("decision.status: expected 403, got 429"),
        "{said}"
    );
    assert!(said.contains("2 fixtures: 1 passed, 1 failed"), "{said}");

    // One set of settings per fixture, as the host loads a policy with one.
    std::fs::write(
        dir.join("wrong.json"),
        r#"{"settings": {"capacity": 10, "refill_per_second": 1},
            "steps": [{"input": {"settings": {"capacity": 20, "refill_per_second": 1}}}]}"#,
    )
    .unwrap();
    let said = text(&policy_test(
        &wat::built("token-budget"),
        &dir.join("wrong.json"),
    ));
    assert!(
        said.contains("step 1: its input's settings differ"),
        "{said}"
    );

    // A step that is none of the kinds is refused, naming the kinds.
    std::fs::write(dir.join("wrong.json"), r#"{"steps": [{"sleep_ms": 5}]}"#).unwrap();
    let said = text(&policy_test(
        &wat::built("request-guard"),
        &dir.join("wrong.json"),
    ));
    assert!(said.contains("unknown field `sleep_ms`"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The folders directly under `dir` of the repository, but `hostile/` and `node_modules/`.
fn folders(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !matches!(n.as_str(), "hostile" | "node_modules"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_example_and_port_is_held_to_fixtures_and_the_docs_name_every_sdk() {
    // What CONTRIBUTING asks of a new example: listed above, so its fixtures run in CI.
    let listed = std::fs::read_to_string(repo().join("tests/tests/tools/policy_test.rs")).unwrap();
    for name in folders("policies") {
        if repo()
            .join("policies")
            .join(&name)
            .join("fixtures")
            .is_dir()
        {
            assert!(
                listed.contains(&format!("\"{name}\"")),
                "policies/{name} has fixtures: list it in every_examples_fixtures_pass_…"
            );
        }
    }
    for (dir, form) in [
        ("policies-py", "wat::built(\"{}-py\")"),
        ("policies-ts", "wat::built(\"{}-ts\")"),
        ("policies-as", "wat::built_as(\"{}\")"),
    ] {
        for name in folders(dir) {
            let call = form.replace("{}", &name);
            assert!(
                listed.contains(&call),
                "{dir}/{name}: hold it to its original's fixtures ({call})"
            );
        }
    }
    // The docs that describe the workspace name every SDK and every examples folder.
    let contributing = std::fs::read_to_string(repo().join("CONTRIBUTING.md")).unwrap();
    let architecture = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    for entry in std::fs::read_dir(repo()).unwrap().filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() && (name.starts_with("sdk") || name.starts_with("policies")) {
            for (doc, text) in [
                ("CONTRIBUTING.md", &contributing),
                ("docs/architecture.md", &architecture),
            ] {
                assert!(
                    text.contains(&format!("`{name}/")),
                    "{doc} does not name `{name}/`"
                );
            }
        }
    }
    // And every script CONTRIBUTING names is there.
    for script in contributing
        .split('`')
        .filter(|s| s.starts_with("scripts/") && s.ends_with(".sh"))
    {
        assert!(
            repo().join(script).exists(),
            "CONTRIBUTING.md names {script}, which is not there"
        );
    }
}
