//! Socket safety: slotgate never unlinks a live socket or a regular file at its listen path, but does
//! replace a stale socket nobody listens on.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use slotgate_tests::*;

/// Starts slotgate listening on `path`, where it finds `what`: it must refuse and exit non-zero by itself.
async fn start_refused(path: &Path, what: &str) -> Exited {
    let up = FakeUpstream::instant().start().await;
    let out = Gate::new()
        .upstream(&up)
        .listen_unix(path)
        .run_to_exit(Duration::from_secs(5))
        .await;
    assert!(
        !out.status.success(),
        "slotgate must refuse {what}; stderr:\n{}",
        out.stderr
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refuses_a_path_where_a_live_socket_listens() {
    let dir = unique_dir("live");
    let path = dir.join("taken.sock");
    let owner = UnixListener::bind(&path).unwrap();

    let out = start_refused(&path, "a live socket").await;
    assert!(
        out.stderr.contains(path.to_str().unwrap()),
        "the error should name the path; stderr:\n{}",
        out.stderr
    );
    assert!(path.exists(), "slotgate unlinked a live socket");
    UnixStream::connect(&path).expect("the original listener still owns the path");
    owner.accept().expect("the original listener still accepts");
    drop(owner);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaces_a_stale_socket() {
    let dir = unique_dir("stale");
    let path = dir.join("stale.sock");
    drop(UnixListener::bind(&path).unwrap());
    assert!(
        path.exists(),
        "a dropped std listener leaves its socket file behind"
    );
    assert!(
        UnixStream::connect(&path).is_err(),
        "nobody listens on the stale socket"
    );

    let (up, gate) = Gate::new().listen_unix(&path).start_instant().await;
    let resp = gate.client().post_chat(&Req::chat("fresh")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    gate.assert_settled(&up, 1).await;
    drop(gate);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_deletes_a_regular_file_at_the_path() {
    let dir = unique_dir("file");
    let path = dir.join("precious.sock");
    std::fs::write(&path, b"precious data").unwrap();

    let out = start_refused(&path, "a regular file").await;
    assert!(
        !out.stderr.trim().is_empty(),
        "a refused start must say why"
    );
    assert_eq!(
        std::fs::read(&path).expect("file still there"),
        b"precious data"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
