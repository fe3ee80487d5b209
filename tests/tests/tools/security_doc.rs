//! docs/security.md's table of attacks tried names, for each, the test that holds it
//! (`binary::module::test`, a file of `tests/tests/`): every one named must exist, so the table
//! cannot point at a test renamed or removed.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The test names in backticks in the last column of the "Attacks tried" tables.
fn named_tests(doc: &str) -> Vec<String> {
    let section = doc
        .split("\n## Attacks tried")
        .nth(1)
        .expect("docs/security.md has a section `## Attacks tried`");
    let section = section.split("\n## ").next().unwrap();
    let mut names = Vec::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let last = cells.last().unwrap();
        for part in last.split('`').skip(1).step_by(2) {
            if part.matches("::").count() >= 2 {
                names.push(part.trim().to_owned());
            }
        }
    }
    names
}

/// Whether `binary::module[::sub]::test` is a test function in `tests/tests/`.
fn exists(name: &str) -> bool {
    let parts: Vec<&str> = name.split("::").collect();
    let (func, path) = parts.split_last().unwrap();
    let mut file = repo().join("tests/tests");
    for p in path {
        file.push(p);
    }
    let candidates = [
        file.with_extension("rs"),
        file.join("mod.rs"),
        file.join("main.rs"),
    ];
    candidates.iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|text| {
            text.contains(&format!("fn {func}("))
                && (text.contains("#[tokio::test") || text.contains("#[test]"))
        })
    })
}

#[test]
fn every_test_the_attack_table_names_exists() {
    let doc = std::fs::read_to_string(repo().join("docs/security.md")).unwrap();
    let names = named_tests(&doc);
    assert!(names.len() >= 20, "the tables name {} tests", names.len());
    let missing: Vec<&String> = names.iter().filter(|n| !exists(n)).collect();
    assert!(
        missing.is_empty(),
        "docs/security.md names tests that do not exist: {missing:?}"
    );
}

#[test]
fn a_name_that_is_no_test_is_caught() {
    assert!(exists(
        "gate::callers::credentials_read_two_ways_are_refused_before_anything_is_charged"
    ));
    assert!(!exists("gate::callers::no_such_test"));
    assert!(!exists("gate::no_such_module::a_test"));
}
