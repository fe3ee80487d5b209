//! What slotgate keeps on disk is its user's alone: the state directory, `state.redb`, the audit
//! log and the policy cache are made 0700/0600; a link, or a directory another user owns or may
//! write, is refused at the start (exit 2, the path and the reason), and nothing is written
//! through it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use slotgate_tests::*;

const NOBODY: u32 = 65534;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Only root may give a file away; elsewhere the test says so and passes.
fn root() -> bool {
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    if me != 0 {
        eprintln!("skipped: giving a directory to another user needs root");
    }
    me == 0
}

/// Starts slotgate on a fake upstream with `opts`: it must refuse to start (exit 2), naming `path`
/// and saying `why`. Returns its stderr.
async fn refused(opts: &[(&str, &Path)], path: &Path, why: &str) -> String {
    let up = FakeUpstream::instant().start().await;
    let mut gate = Gate::new().upstream(&up);
    for (name, value) in opts {
        gate = gate.opt(name, value.display());
    }
    let out = gate.run_to_exit(Duration::from_secs(20)).await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "slotgate must refuse {} ({why}) as an invalid setting; stderr:\n{}",
        path.display(),
        out.stderr
    );
    for said in [path.to_str().unwrap(), why] {
        assert!(
            out.stderr.contains(said),
            "stderr must say `{said}`:\n{}",
            out.stderr
        );
    }
    out.stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_symlinked_state_file_is_refused_and_its_target_left_alone() {
    let dir = unique_dir("files-link");
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    let target = dir.join("elsewhere.bin");
    std::fs::write(&target, b"not slotgate's").unwrap();
    std::os::unix::fs::symlink(&target, state.join("state.redb")).unwrap();

    refused(
        &[("--state-dir", &state)],
        &state.join("state.redb"),
        "symbolic link",
    )
    .await;
    assert_eq!(std::fs::read(&target).unwrap(), b"not slotgate's");
    assert_eq!(mode(&target), 0o644, "the link's target keeps its mode");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_dir_of_another_user_is_refused() {
    if !root() {
        return;
    }
    let dir = unique_dir("files-foreign");
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    chmod(&state, 0o700);
    std::os::unix::fs::chown(&state, Some(NOBODY), Some(NOBODY)).unwrap();
    refused(&[("--state-dir", &state)], &state, "owned by uid 65534").await;
    assert!(
        !state.join("state.redb").exists(),
        "nothing is written into another user's directory"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_dir_others_may_write_is_refused() {
    let dir = unique_dir("files-open");
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    for open in [0o777, 0o770, 0o1777] {
        chmod(&state, open);
        refused(
            &[("--state-dir", &state)],
            &state,
            "writable by its group or others",
        )
        .await;
        assert!(!state.join("state.redb").exists());
    }
    // A directory above it that others may write (and is not sticky, as /tmp is): it could be
    // swapped.
    let inner = state.join("inner");
    chmod(&state, 0o777);
    refused(&[("--state-dir", &inner)], &inner, "the directory above it").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_slotgate_keeps_is_made_owner_only() {
    let dir = unique_dir("files-modes");
    let state = dir.join("deep/state");
    let cache = dir.join("cache");
    let audit = dir.join("audit.jsonl");
    std::fs::write(&audit, "{\"earlier\":1}\n").unwrap();
    chmod(&audit, 0o644);
    let policy = wat::policy(&dir, "allow", 1, r#"{"decision":"allow"}"#, "", "");
    let (_up, mut gate) = Gate::new()
        .admin_token("t0ken-for-the-audit")
        .opt("--state-dir", state.display())
        .opt("--policy-cache-dir", cache.display())
        .opt("--audit-log", audit.display())
        .opt("--policy", policy.display())
        .start_instant()
        .await;
    assert_eq!(mode(&state), 0o700, "state.dir");
    assert_eq!(mode(&state.join("state.redb")), 0o600, "state.redb");
    assert_eq!(mode(&cache), 0o700, "policy-cache-dir");
    assert_eq!(
        mode(&audit),
        0o600,
        "an existing audit log is made owner-only"
    );
    assert!(
        gate.stderr_text().contains("made owner-only"),
        "{}",
        gate.stderr_text()
    );
    gate.signal("TERM");
    gate.wait_exit(Duration::from_secs(10)).await;
    // An existing state.redb readable by others is made owner-only at the next start too.
    chmod(&state.join("state.redb"), 0o644);
    let (_up, gate) = Gate::new()
        .opt("--state-dir", state.display())
        .start_instant()
        .await;
    assert_eq!(mode(&state.join("state.redb")), 0o600);
    drop(gate);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_audit_log_that_is_a_link_or_another_users_is_refused() {
    let dir = unique_dir("files-audit");
    let target = dir.join("target.log");
    std::fs::write(&target, "").unwrap();
    chmod(&target, 0o644);
    let link = dir.join("audit.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    refused(&[("--audit-log", &link)], &link, "symbolic link").await;
    assert_eq!(mode(&target), 0o644);
    assert_eq!(std::fs::read(&target).unwrap(), b"");
    if root() {
        let foreign = dir.join("foreign.jsonl");
        std::fs::write(&foreign, "").unwrap();
        std::os::unix::fs::chown(&foreign, Some(NOBODY), Some(NOBODY)).unwrap();
        refused(&[("--audit-log", &foreign)], &foreign, "owned by uid 65534").await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_cache_others_may_write_or_own_is_refused() {
    let dir = unique_dir("files-cache");
    let cache = dir.join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o777);
    refused(
        &[("--policy-cache-dir", &cache)],
        &cache,
        "writable by its group or others",
    )
    .await;
    let link = dir.join("cache-link");
    chmod(&cache, 0o700);
    std::os::unix::fs::symlink(&cache, &link).unwrap();
    refused(&[("--policy-cache-dir", &link)], &link, "symbolic link").await;
    if root() {
        std::os::unix::fs::chown(&cache, Some(NOBODY), Some(NOBODY)).unwrap();
        refused(
            &[("--policy-cache-dir", &cache)],
            &cache,
            "owned by uid 65534",
        )
        .await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
