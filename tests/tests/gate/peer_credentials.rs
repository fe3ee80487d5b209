//! Peer credentials and socket permissions: the access log names the caller's uid/pid (SO_PEERCRED),
//! and Unix listen sockets get `--socket-mode` (default 0660).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use slotgate_tests::*;

/// Starts `gate` in front of a fake and sends it one chat request over its Unix socket.
async fn after_one_request(gate: Gate) -> (RunningUpstream, RunningGate) {
    let (up, gate) = gate.start_instant().await;
    let resp = gate.client().post_chat(&Req::chat("who")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    (up, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn access_log_carries_peer_uid_and_pid() {
    let (up, gate) = after_one_request(Gate::new()).await;

    let uid = current_uid();
    let pid = std::process::id();
    let line = eventually(
        Duration::from_secs(2),
        "an access log line with peer_uid",
        || async {
            gate.stderr_text()
                .lines()
                .find(|l| l.contains("peer_uid="))
                .map(str::to_owned)
        },
    )
    .await;
    assert!(
        line.contains(&format!("peer_uid={uid}")),
        "access log line: {line}"
    );
    assert!(
        line.contains(&format!("peer_pid={pid}")),
        "access log line: {line}"
    );
    assert!(line.contains("peer_gid="), "access log line: {line}");
    // With no API key and no policy naming one, the peer's uid is the request's tenant.
    assert!(
        line.contains(&format!("tenant=uid:{uid}")),
        "access log line: {line}"
    );
    assert!(
        line.contains("slotgate::access"),
        "access log target: {line}"
    );
    assert!(line.contains(CHAT), "access log path: {line}");
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_access_log_carries_peer_uid() {
    let (up, gate) = after_one_request(Gate::new().opt("--log-format", "json")).await;

    let uid = current_uid();
    let entry = eventually(Duration::from_secs(2), "a JSON access log line", || async {
        gate.stderr_text().lines().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["target"] == "slotgate::access").then_some(v)
        })
    })
    .await;
    let fields = if entry.get("fields").is_some() {
        &entry["fields"]
    } else {
        &entry
    };
    // The contract names the fields, not their JSON types: accept 0 or "0".
    let number = |key: &str| match &fields[key] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    };
    assert_eq!(number("peer_uid"), Some(uid as u64), "{entry}");
    assert_eq!(
        number("peer_pid"),
        Some(std::process::id() as u64),
        "{entry}"
    );
    assert_eq!(number("status"), Some(200), "{entry}");
    gate.assert_settled(&up, 1).await;
}

fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listen_socket_mode_defaults_to_0660_and_follows_the_flag() {
    let up = FakeUpstream::instant().start().await;
    let default = Gate::new().upstream(&up).start().await;
    assert_eq!(
        mode_of(&default.socket_path()),
        0o660,
        "default --socket-mode"
    );

    let strict = Gate::new().upstream(&up).socket_mode("0600").start().await;
    assert_eq!(mode_of(&strict.socket_path()), 0o600, "--socket-mode 0600");
    let resp = strict.client().post_chat(&Req::chat("owner")).await;
    assert_eq!(resp.status, 200, "the owner can still connect");
    strict.assert_settled(&up, 1).await;
    default.assert_settled(&up, 1).await;
}
