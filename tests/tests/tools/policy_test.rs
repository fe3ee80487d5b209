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
