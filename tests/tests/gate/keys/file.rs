//! The keys file (`--keys-file`, docs/keys.md#a-keys-file): keys an operator keeps in git, made
//! with `slotgate key mint`, put in force and taken out of it by editing the file while slotgate
//! runs; a file that does not read changes nothing, and a file that does not read at start stops
//! the start.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::gate::{run, succeeded};
use slotgate_tests::wait::{eventually, unique_dir};

use super::{chat_with, cli, keyed, only_slotgates_key_reached, upstream};

/// `slotgate key mint ARGS --json`: (id, secret, entry).
fn mint(args: &[&str]) -> (String, String, String) {
    let mut all = vec!["key", "mint", "--json"];
    all.extend_from_slice(args);
    let v: Value = serde_json::from_str(succeeded(&run(&all)).trim()).unwrap();
    let s = |k: &str| v[k].as_str().unwrap().to_owned();
    (s("id"), s("secret"), s("entry"))
}

/// Replaces the file at once (a rename, as an editor or `git checkout` does).
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_keys_file_is_read_again_when_it_changes_and_a_broken_one_changes_nothing() {
    let state = unique_dir("keys-file");
    let file = state.join("keys.toml");
    let (alice_id, alice, alice_entry) = mint(&["--tenant", "alice", "--team", "research"]);
    let (_, bob, bob_entry) = mint(&["--tenant", "bob", "--expires", "30d"]);
    assert!(
        !alice_entry.contains(&alice[20..]),
        "the entry holds a digest, not the secret: {alice_entry}"
    );
    write(&file, &format!("# the team's keys\n{alice_entry}"));
    let up = upstream().start().await;
    let gate = keyed(&state, 8)
        .opt("--keys-file", file.display())
        .opt("--policy-watch", "100ms")
        .upstream(&up)
        .start()
        .await;
    let status = |secret: String| {
        let gate = &gate;
        async move { chat_with(gate, &[("x-api-key", &secret)]).await.status }
    };
    assert_eq!(
        status(alice.clone()).await,
        200,
        "a key of the file is served"
    );
    assert_eq!(status(bob.clone()).await, 401, "bob's is not in it yet");

    // Added: in force once the file is read again.
    write(&file, &format!("{alice_entry}\n{bob_entry}"));
    eventually(Duration::from_secs(10), "bob's key in force", || async {
        (status(bob.clone()).await == 200).then_some(())
    })
    .await;
    let (ok, list, err) = cli(&gate, &["key", "list", "--json"]);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(list.trim()).unwrap();
    let alice_row = list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == alice_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(alice_row["source"], "file", "{alice_row}");
    assert_eq!(alice_row["team"], "research", "{alice_row}");

    // Only the file changes the file's keys.
    let (ok, _, err) = cli(&gate, &["key", "revoke", &alice_id]);
    assert!(!ok && err.contains("keys file"), "{err}");

    // Revoked in the file: refused, and told so.
    write(
        &file,
        &format!("{}revoked = true\n\n{bob_entry}", alice_entry),
    );
    eventually(Duration::from_secs(10), "alice's key revoked", || async {
        let r = chat_with(&gate, &[("x-api-key", &alice)]).await;
        (r.status == 401 && r.body.contains("revoked")).then_some(())
    })
    .await;

    // A broken file: rejected whole, logged, counted; the keys read before stay in force.
    write(&file, "[[key]]\nid = \"not-an-id\"\n");
    gate.wait_metric(
        "slotgate_keys_file_reads_total",
        &[("result", "error")],
        1.0,
    )
    .await;
    assert_eq!(
        status(bob.clone()).await,
        200,
        "bob's key is still in force"
    );
    assert_eq!(status(alice.clone()).await, 401, "alice's still revoked");
    let stderr = gate.stderr_text();
    assert!(
        stderr.contains("keys file rejected") && stderr.contains("keys_file"),
        "logged and audited:\n{stderr}"
    );
    only_slotgates_key_reached(&up, &[&alice, &bob]);
    gate.assert_idle().await;
    drop(gate);

    // At start, a file that does not read stops slotgate, naming the file and the problem.
    let exited = keyed(&state, 8)
        .opt("--keys-file", file.display())
        .upstream(&up)
        .run_to_exit(Duration::from_secs(20))
        .await;
    assert!(!exited.status.success());
    assert!(
        exited
            .stderr
            .contains("keys.toml: line 1: missing field `digest`"),
        "{}",
        exited.stderr
    );
}
