//! `cargo install` from a checkout, as the README says an operator installs slotgate: the binary
//! lands in the root given, runs, and checks the annotated configuration. Built in the workspace's
//! own target directory and debug profile, so the test reuses what the test run built (the README's
//! line builds the release profile; the command is the same).

use std::path::PathBuf;
use std::process::Command;

use slotgate_tests::wait::unique_dir;

#[test]
fn cargo_install_from_a_checkout_gives_a_working_binary() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = unique_dir("install");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo.join("target"));
    let out = Command::new(&cargo)
        .args(["install", "--locked", "--offline", "--debug", "--path"])
        .arg(repo.join("sidecar"))
        .arg("--root")
        .arg(&root)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo install");
    assert!(
        out.status.success(),
        "cargo install failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = root.join("bin/slotgate");
    let version = Command::new(&bin).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.status.success() && text.starts_with("slotgate "),
        "{text}"
    );
    let check = Command::new(&bin)
        .args(["check", "--config"])
        .arg(repo.join("examples/slotgate.toml"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
