//! systemd deployment: sockets inherited through socket activation are served as they are (never
//! bound again, chmod'ed or unlinked), the one named `admin` serves the admin endpoints;
//! `READY=1` comes once every listener answers, `WATCHDOG=1` every half `WATCHDOG_USEC`,
//! `STOPPING=1` when the drain begins; and the example units pass `systemd-analyze verify` and load
//! the admin token as a credential.

use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use slotgate_tests::gate::free_port;
use slotgate_tests::systemd::{self, field, has_line, NotifySocket, PassedSockets};
use slotgate_tests::*;

const EXIT: Duration = Duration::from_secs(10);

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn assert_socket_file(path: &Path) {
    let meta = std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{} is gone after slotgate exited: {e}", path.display()));
    assert!(
        meta.file_type().is_socket(),
        "{} is not a socket",
        path.display()
    );
}

/// SIGTERM, and a clean exit.
async fn stop(gate: &mut RunningGate) {
    gate.sigterm();
    assert!(
        gate.wait_exit(EXIT).await.success(),
        "{}",
        gate.stderr_text()
    );
}

async fn chat_ok(client: &Client, tag: &str) {
    let resp = client.post_chat(&Req::chat(tag)).await;
    assert_eq!(resp.status, 200, "{tag}: {}", resp.body);
    assert_eq!(resp.tag().as_deref(), Some(tag));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn systemd_socket_activate_hands_over_client_and_admin_sockets() {
    let dir = unique_dir("ssa");
    let path = dir.join("clients.sock");
    let tcp = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let wrapper = systemd::socket_activate(
        &[
            (path.display().to_string(), "clients"),
            (tcp.to_string(), "clients"),
            (admin.to_string(), "admin"),
        ],
        &["SLOTGATE_LOG"],
    );
    let up = FakeUpstream::instant().start().await;
    // The configured addresses are the inherited ones: binding them again would fail (in use), so a
    // start proves they were taken over. --socket-mode would show on a socket slotgate chmod'ed.
    let gate = Gate::one_slot(4)
        .upstream(&up)
        .listen_unix(&path)
        .listen(format!("tcp:{tcp}"))
        .admin_tcp(admin)
        .socket_mode("0600")
        .wrap(wrapper);
    let mut gate = systemd::start_exclusive(gate).await;

    for (i, client) in gate.clients().iter().enumerate() {
        chat_ok(client, &format!("ssa{i}")).await;
    }
    let log = gate.stderr_text();
    assert!(log.contains("replace --listen"), "{log}");
    assert!(log.contains("replaces --admin-listen"), "{log}");
    assert_eq!(
        log.matches("listening socket inherited from systemd")
            .count(),
        3,
        "{log}"
    );
    gate.assert_settled(&up, 1).await;
    assert_ne!(
        mode(&path),
        0o600,
        "slotgate chmod'ed a socket systemd bound"
    );

    stop(&mut gate).await;
    assert_socket_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sockets_passed_by_the_test_are_served_as_they_are() {
    let dir = unique_dir("fds");
    let path = dir.join("clients.sock");
    let mut socks = PassedSockets::new();
    socks.unix(&path, "clients", 0o640);
    let admin = socks.tcp("admin");
    let notify = NotifySocket::bind();
    let up = FakeUpstream::instant().start().await;
    let gate = Gate::one_slot(4)
        .upstream(&up)
        .listen_unix(&path)
        .admin_tcp(admin)
        .socket_mode("0600")
        .env("NOTIFY_SOCKET", notify.path());
    let mut gate = socks.start(gate).await;

    // READY=1 names the inherited sockets.
    let (ready, _) = notify.wait_for("READY=1", Duration::from_secs(5)).await;
    let status = field(&ready, "STATUS").expect("STATUS= with READY=1");
    assert!(
        status.contains(&format!("serving unix:{}", path.display())),
        "{status}"
    );
    assert!(status.contains(&format!("admin tcp:{admin}")), "{status}");

    // fds 3 and 4 are the sockets, now non-blocking and close-on-exec.
    for fd in [3, 4] {
        assert!(systemd::fd_target(gate.pid(), fd).starts_with("socket:"));
        let flags = systemd::fd_flags(gate.pid(), fd);
        assert_eq!(flags & systemd::O_NONBLOCK, systemd::O_NONBLOCK, "fd {fd}");
        assert_eq!(flags & systemd::O_CLOEXEC, systemd::O_CLOEXEC, "fd {fd}");
    }
    chat_ok(&gate.client(), "passed").await;
    let st = gate.status().await;
    assert!(st["slots"].is_object(), "{st}");
    let log = gate.stderr_text();
    assert!(
        log.contains("name=\"admin\"") || log.contains("name=admin"),
        "{log}"
    );
    gate.assert_settled(&up, 1).await;
    assert_eq!(mode(&path), 0o640, "slotgate chmod'ed an inherited socket");

    stop(&mut gate).await;
    // Not unlinked, and still listening: the test's copy, like systemd's, outlives the service.
    assert_socket_file(&path);
    std::os::unix::net::UnixStream::connect(&path).expect("the inherited socket still listens");
    drop(socks);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unnamed_sockets_serve_clients_and_the_admin_listener_is_bound_as_configured() {
    let mut socks = PassedSockets::new();
    let tcp = socks.tcp("unused");
    socks.unnamed();
    let up = FakeUpstream::instant().start().await;
    // The configured admin address (a free port chosen by the harness) is bound by slotgate.
    let gate = Gate::one_slot(2).upstream(&up).listen(format!("tcp:{tcp}"));
    let mut gate = socks.start(gate).await;
    chat_ok(&gate.client(), "unnamed").await;
    assert_eq!(gate.readyz().await, 200);
    let log = gate.stderr_text();
    assert!(
        log.contains("name=\"unknown\"") || log.contains("name=unknown"),
        "{log}"
    );
    assert!(!log.contains("replaces --admin-listen"), "{log}");
    gate.assert_settled(&up, 1).await;
    stop(&mut gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_passed_socket_slotgate_cannot_serve_fails_the_start() {
    let mut socks = PassedSockets::new();
    socks.add(
        std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp"),
        "clients",
    );
    let gate = Gate::new().upstream_url("http://127.0.0.1:9");
    let out = socks.run_to_exit(gate, EXIT).await;
    assert!(
        !out.status.success(),
        "started on a UDP socket: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("is not a stream socket"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notify_ready_after_listeners_answer_then_watchdog_then_stopping() {
    let notify = NotifySocket::bind();
    let dir = unique_dir("notify-gate");
    let path = dir.join("slotgate.sock");
    let up = FakeUpstream::instant().start().await;
    let gate = Gate::one_slot(4)
        .upstream(&up)
        .listen_unix(&path)
        .env("NOTIFY_SOCKET", notify.path())
        .env("WATCHDOG_USEC", "200000");
    let starting = tokio::spawn(systemd::start_exclusive(gate));

    let (ready, _) = notify.wait_for("READY=1", Duration::from_secs(30)).await;
    // At READY=1 every listener answers: the client socket and the admin port named in STATUS=.
    chat_ok(&Client::unix(&path), "at-ready").await;
    let status = field(&ready, "STATUS")
        .expect("STATUS= with READY=1")
        .to_owned();
    let admin: SocketAddr = status
        .split("admin tcp:")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in STATUS={status}"));
    let admin_at_ready = Client::tcp(admin).get("/livez").await;
    assert_eq!(admin_at_ready.status, 200, "{}", admin_at_ready.body);
    let mut gate = starting.await.expect("start task");
    chat_ok(&gate.client(), "ready").await;

    // WATCHDOG=1 every 100 ms (half of 200 ms): about 10 in a second; a loose lower bound.
    let second = notify.collect(Duration::from_secs(1)).await;
    let pings = second.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(pings >= 4, "{pings} watchdog pings in 1 s: {second:?}");
    assert!(!second.iter().any(|m| has_line(m, "READY=1")), "{second:?}");
    gate.assert_settled(&up, 1).await;

    gate.sigterm();
    let (stopping, _) = notify.wait_for("STOPPING=1", Duration::from_secs(5)).await;
    let status = field(&stopping, "STATUS").unwrap_or_default();
    assert!(status.contains("SIGTERM"), "{stopping}");
    assert!(
        gate.wait_exit(EXIT).await.success(),
        "{}",
        gate.stderr_text()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_watchdog_pings_when_the_watchdog_is_meant_for_another_process() {
    let notify = NotifySocket::bind();
    let up = FakeUpstream::instant().start().await;
    let gate = Gate::one_slot(2)
        .upstream(&up)
        .env("NOTIFY_SOCKET", notify.path())
        .env("WATCHDOG_USEC", "100000")
        .env("WATCHDOG_PID", "1");
    let gate = systemd::start_exclusive(gate).await;
    let (_, before) = notify.wait_for("READY=1", Duration::from_secs(5)).await;
    let after = notify.collect(Duration::from_millis(500)).await;
    assert!(
        !before
            .iter()
            .chain(&after)
            .any(|m| has_line(m, "WATCHDOG=1")),
        "pinged a watchdog meant for pid 1: {before:?} {after:?}"
    );
    gate.assert_idle().await;
}

#[test]
fn example_units_pass_systemd_analyze_verify() {
    let dir = unique_dir("units");
    let units = systemd::units_for_verify(&dir);
    let names: Vec<String> = units
        .iter()
        .map(|u| u.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for expected in [
        "llama-server.service",
        "slotgate-admin.socket",
        "slotgate.service",
        "slotgate.socket",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing: {names:?}"
        );
    }
    let out = systemd::verify(&units);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // verify only warns (exit 0) about unknown keys and bad values: any output is a failure.
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify {names:?} ({}):\n{stderr}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The promises the docs make about the units, which verify cannot see.
#[test]
fn example_units_keep_their_promises() {
    let read = |name: &str| {
        std::fs::read_to_string(systemd::examples_dir().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let has = |text: &str, line: &str| text.lines().any(|l| l.trim() == line);
    let service = read("slotgate.service");
    for line in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "Wants=llama-server.service",
    ] {
        assert!(has(&service, line), "slotgate.service lacks `{line}`");
    }
    // wasmtime is a JIT.
    assert!(
        !service
            .lines()
            .any(|l| l.trim_start().starts_with("MemoryDenyWriteExecute")),
        "MemoryDenyWriteExecute breaks wasmtime"
    );
    let seconds = |key: &str| -> u64 {
        let v = service
            .lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("slotgate.service lacks {key}="));
        v.trim_end_matches('s')
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v}: write whole seconds"))
    };
    assert!(seconds("WatchdogSec") > 0);
    // The default --drain-timeout is 30 s: systemd must not kill the drain.
    assert!(seconds("TimeoutStopSec") > 30);

    // The admin port is TCP on 127.0.0.1, open to every local user: the service loads the admin
    // token as a credential and points slotgate at the copy in its credentials directory (%d).
    let values = |key: &str| -> Vec<&str> {
        service
            .lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .collect()
    };
    let credentials: Vec<(&str, &str)> = values("LoadCredential")
        .into_iter()
        .map(|v| {
            v.split_once(':')
                .unwrap_or_else(|| panic!("LoadCredential={v}: write ID:PATH"))
        })
        .collect();
    assert_eq!(
        credentials,
        [("admin-token", "/etc/slotgate/admin-token")],
        "slotgate.service loads the admin token from /etc/slotgate/admin-token"
    );
    let token_file: Vec<&str> = values("Environment")
        .into_iter()
        .filter_map(|v| v.strip_prefix("SLOTGATE_ADMIN_TOKEN_FILE="))
        .collect();
    assert_eq!(
        token_file,
        ["%d/admin-token"],
        "SLOTGATE_ADMIN_TOKEN_FILE points at the loaded credential"
    );
    assert!(
        service.contains("(umask 077; openssl rand -hex 32 > /etc/slotgate/admin-token)"),
        "slotgate.service says how to create the token file"
    );
    assert!(has(
        &read("slotgate-admin.socket"),
        "FileDescriptorName=admin"
    ));
    assert!(has(&read("slotgate.socket"), "FileDescriptorName=clients"));
    let llama = read("llama-server.service");
    assert!(has(&llama, "Before=slotgate.service"));
    assert!(llama.contains("--host /run/llama/llama.sock"));
}
