//! Running out of file descriptors: when `accept` fails with EMFILE, slotgate backs off instead of spinning
//! or dying, and serves normally once descriptors are free again.

use std::time::Duration;

use slotgate_tests::*;

/// Open files slotgate may hold: about 15 go to its own plumbing (std streams, epoll, listeners, the
/// upstream pool), which leaves room for a couple of dozen clients.
const OPEN_FILES: u32 = 40;
/// More connections than that room, opened at once: the rest wait in the listen backlog and every
/// `accept` of them fails with EMFILE.
const CONNECTIONS: usize = 60;

/// The warning slotgate logs each time `accept` fails for lack of resources.
const BACKOFF_WARNING: &str = "accept failed; backing off";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accept_backs_off_when_file_descriptors_run_out() {
    let (up, mut gate) = Gate::new()
        .slots(1)
        .open_files_limit(OPEN_FILES)
        .start_instant()
        .await;
    let client = gate.client();

    let mut flood = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        flood.push(client.raw_unix().await);
    }
    let first = eventually(
        Duration::from_secs(3),
        "the accept back-off warning",
        || async {
            gate.stderr_text()
                .lines()
                .find(|l| l.contains(BACKOFF_WARNING))
                .map(str::to_owned)
        },
    )
    .await;
    eprintln!("{first}");
    // Keep the descriptors exhausted a while: a loop that retried at once would log thousands of lines.
    tokio::time::sleep(ms(1000)).await;
    assert!(
        gate.try_exited().is_none(),
        "slotgate exited while out of file descriptors; stderr:\n{}",
        gate.stderr_text()
    );
    let warnings = gate
        .stderr_text()
        .lines()
        .filter(|l| l.contains(BACKOFF_WARNING))
        .count();
    assert!(
        warnings < 100,
        "{warnings} back-off warnings in about a second: accept is retried without backing off"
    );

    drop(flood);
    let resp = client.post_chat(&Req::chat("after")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.tag().as_deref(), Some("after"));
    assert_eq!(gate.livez().await, 200);
    assert!(gate.try_exited().is_none());
    assert_eq!(up.tags(), ["after"]);
    gate.assert_settled(&up, 1).await;
}
