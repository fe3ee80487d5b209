//! The admin plane on the fake llama-server (docs/security.md): slotgate's upstream key goes only with
//! its own calls and with callers who brought the admin token; with `--admin-token-file` every admin
//! route but the probes wants it (a read-only token opens only reads); the token is re-read on
//! SIGHUP; a Unix admin socket is owner-only and keeps to its uid allow-list; every change is
//! audited; and no log line carries the key or the token.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use http::Method;
use slotgate_tests::gate::{run, succeeded};
use slotgate_tests::*;

const KEY: &str = "sk-upstream-key-of-slotgate";
const TOKEN: &str = "admin-token-0123456789abcdef";
const READ_TOKEN: &str = "read-token-0123456789abcdef";

/// A gate whose own calls carry `KEY` (`--upstream-api-key-file`).
fn with_key(dir_hint: &str) -> Gate {
    let dir = unique_dir(dir_hint);
    let file = dir.join("llama.key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    Gate::new().opt("--upstream-api-key-file", file.display())
}

/// The credentials the fake saw on `path` (its last request there).
fn seen_on(up: &RunningUpstream, path: &str) -> (Option<String>, Option<String>) {
    up.credentials_seen()
        .into_iter()
        .rev()
        .find(|(p, _, _)| p == path)
        .map(|(_, a, k)| (a, k))
        .unwrap_or_else(|| panic!("nothing reached the fake at {path}"))
}

/// The whole log holds neither the upstream key nor any admin token.
fn assert_no_secret(log: &str) {
    for secret in [KEY, TOKEN, READ_TOKEN] {
        assert!(!log.contains(secret), "a secret in the log: {log}");
    }
}

/// The gate's log once it holds at least `n` audit lines (the log is a file another process writes).
async fn log_with_audit_lines(gate: &RunningGate, n: usize) -> String {
    eventually(Duration::from_secs(5), "the audit lines", || async {
        let log = gate.stderr_text();
        (audit_lines(&log).len() >= n).then_some(log)
    })
    .await
}

/// The audit lines of the log (text format).
fn audit_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("slotgate::audit"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_token_admin_routes_carry_only_the_callers_own_credentials() {
    let (up, gate) = with_key("nokey").start_instant().await;
    let admin = gate.admin();
    // No credentials: none reach llama-server (slotgate's key is not lent).
    let r = admin.get("/slots").await;
    assert_eq!(r.status, 404, "the fake's own answer: {}", r.body);
    assert_eq!(seen_on(&up, "/slots"), (None, None));
    let r = admin
        .send_with(Method::POST, "/slots/0?action=erase", &[], "{}")
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(seen_on(&up, "/slots/0"), (None, None));
    // The caller's own key goes as it came, whichever header it is in.
    admin
        .get_with("/slots", &[("authorization", "Bearer mine")])
        .await;
    assert_eq!(seen_on(&up, "/slots"), (Some("Bearer mine".into()), None));
    admin
        .get_with("/lora-adapters", &[("x-api-key", "mine")])
        .await;
    assert_eq!(seen_on(&up, "/lora-adapters"), (None, Some("mine".into())));
    // slotgate's own calls do carry its key.
    let own: Vec<_> = up
        .credentials_seen()
        .into_iter()
        .filter(|(p, _, _)| p == "/props")
        .collect();
    assert!(!own.is_empty(), "slotgate read /props");
    assert!(
        own.iter()
            .all(|(_, a, _)| a.as_deref() == Some(&format!("Bearer {KEY}"))),
        "{own:?}"
    );
    // Its own endpoints stay open, and the start said what that means on TCP.
    assert_eq!(admin.get("/status").await.status, 200);
    let log = log_with_audit_lines(&gate, 1).await;
    assert!(
        log.contains("the admin listener is on TCP without --admin-token-file")
            && log.contains("never slotgate's key"),
        "{log}"
    );
    // The changing call is audited, with who and which credentials llama-server saw.
    let lines = audit_lines(&log);
    let erase = lines
        .iter()
        .find(|l| l.contains("action=\"slot_erase\""))
        .unwrap_or_else(|| panic!("no audit line for the erase: {log}"));
    assert!(erase.contains("peer_addr=127.0.0.1:"), "{erase}");
    assert!(erase.contains("credentials=\"none\""), "{erase}");
    assert!(erase.contains("result=\"upstream_4xx\""), "{erase}");
    assert!(erase.contains("slot=\"0\""), "{erase}");
    // Reads are not audited.
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        gate.metric(
            "slotgate_admin_actions_total",
            &[("action", "slot_erase"), ("result", "upstream_4xx")]
        )
        .await,
        Some(1.0)
    );
    assert_no_secret(&gate.stderr_text());
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_token_every_admin_route_but_the_probes_wants_it() {
    let (up, gate) = with_key("token").admin_token(TOKEN).start_instant().await;
    let bare = gate.admin().clone().without_bearer();
    assert_eq!(bare.get("/livez").await.status, 200);
    assert_eq!(bare.get("/readyz").await.status, 200);
    for path in ["/status", "/live", "/metrics", "/slots", "/nonexistent"] {
        let r = bare.get(path).await;
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        assert_eq!(r.json()["error"]["type"], "authentication_error", "{path}");
        assert_eq!(r.json()["error"]["code"], 401, "{path}");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Authorization: Bearer"),
            "{}",
            r.body
        );
        assert_eq!(
            r.header("www-authenticate").as_deref(),
            Some("Bearer realm=\"slotgate admin\"")
        );
        assert!(r.header("x-request-id").is_some());
    }
    // Wrong, empty, with the file's newline, another scheme: each refused as invalid.
    for auth in [
        "Bearer wrong-token-0123456789",
        "Bearer ",
        &format!("Bearer {TOKEN}\\n"),
        &format!("Basic {TOKEN}"),
    ] {
        let r = bare.get_with("/status", &[("authorization", auth)]).await;
        assert_eq!(r.status, 401, "{auth}: {}", r.body);
    }
    let r = bare
        .get_with(
            "/status",
            &[("authorization", "Bearer wrong-token-0123456789")],
        )
        .await;
    assert_eq!(r.json()["error"]["message"], "Invalid admin token");
    // The scheme in any case; white space around the token is not part of it.
    let r = bare
        .get_with(
            "/status",
            &[("authorization", &format!("bearer  {TOKEN} "))],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Nothing refused reached llama-server.
    assert!(
        !up.credentials_seen().iter().any(|(p, _, _)| p == "/slots"),
        "{:?}",
        up.credentials_seen()
    );

    // With the token, llama-server's routes go with slotgate's key and never the token.
    let admin = gate.admin();
    assert_eq!(admin.get("/status").await.status, 200);
    admin.get("/slots").await;
    assert_eq!(
        seen_on(&up, "/slots"),
        (Some(format!("Bearer {KEY}")), None)
    );
    admin
        .send_with(
            Method::POST,
            "/slots/1?action=save",
            &[("x-api-key", "callers-own"), ("x-request-id", "save-1")],
            r#"{"filename":"one.bin"}"#,
        )
        .await;
    assert_eq!(
        seen_on(&up, "/slots/1"),
        (Some(format!("Bearer {KEY}")), None)
    );
    let bare_save = bare
        .send_with(Method::POST, "/slots/1?action=save", &[], "{}")
        .await;
    assert_eq!(bare_save.status, 401);

    let log = log_with_audit_lines(&gate, 2).await;
    let lines = audit_lines(&log);
    assert_eq!(lines.len(), 2, "the save and the refused save: {lines:?}");
    assert!(lines[0].contains("action=\"slot_save\""), "{}", lines[0]);
    assert!(lines[0].contains("request_id=\"save-1\""), "{}", lines[0]);
    assert!(lines[0].contains("filename=\"one.bin\""), "{}", lines[0]);
    assert!(
        lines[0].contains("credentials=\"slotgate_key\""),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("result=\"unauthenticated\""),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains("status=401"), "{}", lines[1]);
    assert!(!log.contains("without --admin-token-file"), "{log}");
    assert_no_secret(&log);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_token_reads_and_changes_nothing() {
    let dir = unique_dir("read-token");
    let read_file = dir.join("read.token");
    std::fs::write(&read_file, format!("# for Prometheus\n{READ_TOKEN}\n")).unwrap();
    let (up, gate) = with_key("read")
        .admin_token(TOKEN)
        .opt("--admin-read-token-file", read_file.display())
        .start_instant()
        .await;
    let reader = gate
        .admin()
        .clone()
        .without_bearer()
        .with_bearer(READ_TOKEN);
    for path in ["/status", "/live", "/metrics"] {
        assert_eq!(reader.get(path).await.status, 200, "{path}");
    }
    let status = reader.get("/status").await;
    assert_eq!(
        status.json()["admin"],
        serde_json::json!({"token": "set", "read_token": "set", "open_metrics": false,
            "allow_uids": [], "audit_log": "stderr"})
    );
    assert!(!status.body.contains(TOKEN) && !status.body.contains(READ_TOKEN));
    reader.get("/slots").await;
    assert_eq!(
        seen_on(&up, "/slots"),
        (Some(format!("Bearer {KEY}")), None)
    );
    for (method, path) in [
        (Method::POST, "/slots/0?action=erase"),
        (Method::POST, "/models/unload"),
        (Method::POST, "/props"),
    ] {
        let r = reader.request(method.clone(), path).await;
        assert_eq!(r.status, 403, "{method} {path}: {}", r.body);
        assert_eq!(r.json()["error"]["type"], "permission_error");
    }
    assert!(
        up.passthrough_seen().iter().all(|p| p == "/slots"),
        "no change reached llama-server: {:?}",
        up.passthrough_seen()
    );
    let log = log_with_audit_lines(&gate, 3).await;
    let refused: Vec<_> = audit_lines(&log)
        .into_iter()
        .filter(|l| l.contains("result=\"forbidden\""))
        .collect();
    assert_eq!(refused.len(), 3, "{log}");
    assert_no_secret(&log);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_metrics_serves_the_scrape_and_nothing_else_without_the_token() {
    let (up, gate) = Gate::new()
        .admin_token(TOKEN)
        .arg("--admin-open-metrics")
        .start_instant()
        .await;
    let bare = gate.admin().clone().without_bearer();
    let r = bare.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("slotgate_slots_total"));
    assert_eq!(bare.get("/status").await.status, 401);
    assert_eq!(bare.get("/live").await.status, 401);
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_files_that_cannot_serve_fail_the_start_and_say_why() {
    let dir = unique_dir("bad-token");
    let cases = [
        ("empty", "", "holds no token"),
        ("comments", "# nothing here\n\n", "holds no token"),
        ("short", "tiny\n", "has 4 characters"),
    ];
    for (name, text, says) in cases {
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        let out = run(&[
            "check",
            "--admin-token-file",
            file.to_str().unwrap(),
            "--upstream",
            "http://127.0.0.1:1",
        ]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("admin-token-file") && err.contains(says),
            "{name}: {err}"
        );
        let exited = Gate::new()
            .opt("--admin-token-file", file.display())
            .run_to_exit(Duration::from_secs(10))
            .await;
        assert_eq!(exited.status.code(), Some(2), "{name}: {}", exited.stderr);
        assert!(exited.stderr.contains(says), "{name}: {}", exited.stderr);
    }
    // A read-only token alone would leave every change open: refused too.
    let read = dir.join("read");
    std::fs::write(&read, format!("{READ_TOKEN}\n")).unwrap();
    let out = run(&["check", "--admin-read-token-file", read.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs the admin token"));
    // A good file with its trailing newline: `check` takes it and prints the path, not the token.
    let good = dir.join("good");
    std::fs::write(&good, format!("{TOKEN}\n")).unwrap();
    let out = run(&["check", "--admin-token-file", good.to_str().unwrap()]);
    let text = succeeded(&out);
    assert!(
        text.contains(&format!("admin-token-file = \"{}\"", good.display())),
        "{text}"
    );
    assert!(!text.contains(TOKEN), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_token_takes_over_on_sighup_and_a_broken_file_keeps_the_old() {
    let (up, mut gate) = Gate::new()
        .admin_token(TOKEN)
        .arg("--policy-watch")
        .arg("0s")
        .start_instant()
        .await;
    let file = gate.dir().join("admin.token");
    let next = "next-admin-token-0123456789";
    std::fs::write(&file, format!("{next}\n")).unwrap();
    gate.signal("HUP");
    let bare = gate.admin().clone().without_bearer();
    let new = bare.clone().with_bearer(next);
    eventually(Duration::from_secs(5), "the new token in force", || async {
        (new.get("/status").await.status == 200).then_some(())
    })
    .await;
    assert_eq!(
        gate.admin().get("/status").await.status,
        401,
        "the old one is gone"
    );
    // A file emptied by mistake: the reload is rejected and the token in force stays.
    std::fs::write(&file, "").unwrap();
    gate.signal("HUP");
    eventually(Duration::from_secs(5), "the rejected reload", || async {
        gate.stderr_text().contains("holds no token").then_some(())
    })
    .await;
    assert_eq!(new.get("/status").await.status, 200);
    let log = log_with_audit_lines(&gate, 2).await;
    let reloads: Vec<_> = audit_lines(&log)
        .into_iter()
        .filter(|l| l.contains("action=\"reload\""))
        .collect();
    assert_eq!(reloads.len(), 2, "{log}");
    assert!(reloads[0].contains("by=\"SIGHUP\"") && reloads[0].contains("result=\"swapped\""));
    assert!(
        reloads[0].contains("admin tokens replaced"),
        "{}",
        reloads[0]
    );
    assert!(reloads[1].contains("result=\"rejected\""), "{}", reloads[1]);
    assert!(!log.contains(next), "{log}");
    assert_no_secret(&log);
    gate.use_admin_token(next);
    gate.assert_settled(&up, 1).await;
}

/// `curl` run as `uid` (a uid with no account: the kernel needs none) on the admin socket.
fn curl_as(uid: u32, socket: &std::path::Path, path: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(socket)
        .arg(format!("http://admin{path}"))
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run curl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unix_admin_socket_is_owner_only_and_keeps_to_its_allowed_uids() {
    assert_eq!(
        current_uid(),
        0,
        "this test runs as root, to be another uid"
    );
    let (up, gate) = Gate::new().admin_unix().start_instant().await;
    let socket = gate.dir().join("admin.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "owner-only by default");
    // The directory must let another uid reach the socket at all.
    std::fs::set_permissions(gate.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, out) = curl_as(4242, &socket, "/status");
    assert_eq!(code, Some(7), "the kernel refuses the connect: {out}");
    gate.assert_settled(&up, 1).await;
    drop(gate);

    // Opened to all by mode, kept to uid 4243 (and slotgate's own) by the allow-list.
    let (up, gate) = Gate::new()
        .admin_unix()
        .opt("--admin-socket-mode", "0666")
        .opt("--admin-allow-uids", "4243")
        .start_instant()
        .await;
    std::fs::set_permissions(gate.dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = gate.dir().join("admin.sock");
    let (_, out) = curl_as(4242, &socket, "/status");
    assert!(out.ends_with("\n403"), "{out}");
    assert!(
        out.contains("uid=4242") && out.contains("admin-allow-uids"),
        "{out}"
    );
    let (_, out) = curl_as(4242, &socket, "/slots/0?action=erase");
    assert!(
        out.ends_with("\n403"),
        "GET, but refused all the same: {out}"
    );
    // The console's files need no token, but the socket's own list still holds.
    let (_, out) = curl_as(4242, &socket, "/console/");
    assert!(out.ends_with("\n403"), "{out}");
    let (_, out) = curl_as(4243, &socket, "/status");
    assert!(out.ends_with("\n200"), "{out}");
    assert_eq!(
        gate.admin().get("/status").await.status,
        200,
        "slotgate's own uid"
    );
    assert!(
        up.passthrough_seen().is_empty(),
        "{:?}",
        up.passthrough_seen()
    );
    // A change refused for its uid is audited with the uid.
    let r = std::process::Command::new("curl")
        .args(["-s", "-X", "POST", "--unix-socket"])
        .arg(&socket)
        .arg("http://admin/slots/0?action=erase")
        .uid(4242)
        .gid(4242)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&r.stdout).contains("permission_error"));
    let log = log_with_audit_lines(&gate, 1).await;
    let line = audit_lines(&log)
        .into_iter()
        .find(|l| l.contains("slot_erase"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("peer_uid=4242") && line.contains("result=\"forbidden\""),
        "{line}"
    );
    gate.assert_settled(&up, 1).await;

    // A TCP admin listener cannot keep to uids: refused at start.
    let out = run(&[
        "check",
        "--admin-listen",
        "tcp:127.0.0.1:9999",
        "--admin-allow-uids",
        "1000",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a TCP peer has no uid"));
}

/// The audit file: JSON lines of their own, and nothing of them on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_lines_can_go_to_a_file_of_their_own() {
    let dir = unique_dir("audit");
    let file = dir.join("audit.jsonl");
    let (up, gate) = Gate::new()
        .admin_token(TOKEN)
        .opt("--audit-log", file.display())
        .start_instant()
        .await;
    gate.admin()
        .send_with(
            Method::POST,
            "/models/load",
            &[("x-request-id", "load-7")],
            r#"{"model":"alpha"}"#,
        )
        .await;
    let bare = gate.admin().clone().without_bearer();
    bare.send_with(Method::DELETE, "/models?model=beta", &[], "")
        .await;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["action"], "model_load");
    assert_eq!(lines[0]["model"], "alpha");
    assert_eq!(lines[0]["request_id"], "load-7");
    assert_eq!(lines[0]["result"], "upstream_4xx", "the fake has no router");
    assert!(lines[0]["peer_addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert!(lines[0]["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(lines[1]["action"], "model_delete");
    assert_eq!(lines[1]["model"], "beta");
    assert_eq!(lines[1]["result"], "unauthenticated");
    assert_eq!(lines[1]["status"], 401);
    let log = gate.stderr_text();
    assert!(audit_lines(&log).is_empty(), "{log}");
    assert!(!text.contains(TOKEN));
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_whose_caller_leaves_before_the_answer_is_audited_all_the_same() {
    let (up, gate) = Gate::new()
        .start_with(FakeUpstream::instant().passthrough_delay(Duration::from_secs(2)))
        .await;
    let gone = tokio::time::timeout(
        Duration::from_millis(300),
        gate.admin().send_with(
            Method::POST,
            "/slots/0?action=erase",
            &[("x-request-id", "gone-1")],
            "",
        ),
    )
    .await;
    assert!(
        gone.is_err(),
        "the caller left before llama-server answered"
    );
    let log = log_with_audit_lines(&gate, 1).await;
    let line = audit_lines(&log)[0];
    for part in [
        "action=\"slot_erase\"",
        "result=\"client_gone\"",
        "request_id=\"gone-1\"",
        "status=0",
    ] {
        assert!(line.contains(part), "no {part} in {line}");
    }
    assert!(
        up.credentials_seen()
            .iter()
            .any(|(p, _, _)| p == "/slots/0"),
        "it did reach llama-server"
    );
    gate.assert_settled(&up, 1).await;
}
