//! The README's quick start runs as written: its `<!-- quickstart:* -->` shell blocks, in order, in
//! one shell at the root of the checkout, without root, against a real llama-server and model from
//! `scripts/setup-llama.sh`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use slotgate_tests::wait::unique_dir;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The shell blocks between `<!-- quickstart:NAME -->` and `<!-- /quickstart -->`, with their names.
fn quickstart_blocks(readme: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut rest = readme;
    while let Some(at) = rest.find("<!-- quickstart:") {
        let after = &rest[at + "<!-- quickstart:".len()..];
        let name = after[..after.find(" -->").unwrap()].to_owned();
        let end = after
            .find("<!-- /quickstart -->")
            .expect("an unclosed quickstart block");
        let body = &after[..end];
        let code = body
            .split_once("```sh\n")
            .and_then(|(_, c)| c.split_once("```"))
            .map(|(c, _)| c.to_owned())
            .expect("a quickstart block holds one ```sh block");
        blocks.push((name, code));
        rest = &after[end..];
    }
    blocks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_quick_start_runs_as_written() {
    let _serial = slotgate_tests::llama::serial().await;
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = quickstart_blocks(&readme);
    let names: Vec<&str> = blocks.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["wrap", "beside"], "the README's quick-start blocks");
    let mut script = String::from("set -euo pipefail\n");
    for (name, code) in &blocks {
        script.push_str(&format!("echo '=== quickstart:{name}'\n{code}\n"));
    }
    let dir = unique_dir("readme-quickstart");
    let path = dir.join("quickstart.sh");
    std::fs::write(&path, &script).unwrap();

    // The commands build into ./target. A run whose build lives elsewhere (CI's cached
    // CARGO_TARGET_DIR, outside the clone) gets ./target pointing there, so `cargo build` finds the
    // binary built already; nothing in the commands changes.
    let mut cmd = tokio::process::Command::new("bash");
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        let local = root.join("target");
        if !local.exists() {
            std::os::unix::fs::symlink(&target, &local).unwrap();
        }
        cmd.env_remove("CARGO_TARGET_DIR");
    }
    let child = cmd
        .arg(&path)
        .current_dir(&root)
        .env("XDG_RUNTIME_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(600), child.wait_with_output())
        .await
        .expect("the quick start did not finish within 10 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .lines()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        out.status.success(),
        "quick start failed: {}\nstdout:\n{stdout}\nstderr (end):\n{tail}",
        out.status
    );
    // Each block's chat request was answered by llama-server through slotgate, and /status read.
    for name in ["wrap", "beside"] {
        let section = stdout
            .split(&format!("=== quickstart:{name}"))
            .nth(1)
            .unwrap_or_default();
        let section = section.split("=== quickstart:").next().unwrap_or_default();
        assert!(
            section.contains("\"choices\"") && section.contains("chat.completion"),
            "block {name}: no chat completion in its output:\n{stdout}\nstderr (end):\n{tail}"
        );
    }
    assert!(
        stdout.contains("\"upstream\""),
        "no /status in the output:\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quickstart_blocks_are_found_in_order() {
    let text = "a\n<!-- quickstart:one -->\n```sh\necho 1\n```\n<!-- /quickstart -->\nb\n<!-- quickstart:two -->\nx\n```sh\necho 2\n```\n<!-- /quickstart -->\n";
    assert_eq!(
        quickstart_blocks(text),
        [
            ("one".to_owned(), "echo 1\n".to_owned()),
            ("two".to_owned(), "echo 2\n".to_owned())
        ]
    );
}
