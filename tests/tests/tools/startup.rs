//! Start-up failures say what failed, once, and which setting it was.

use std::time::Duration;

use slotgate_tests::gate::command;
use slotgate_tests::*;

#[test]
fn a_taken_admin_port_names_the_flag_and_the_error_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = unique_dir("startup-bind");
    let child = command()
        .args(["--upstream", "unix:/nonexistent/llama.sock"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("gate.sock").display()))
        .args(["--admin-listen", &format!("tcp:127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(child, Duration::from_secs(10));
    let status = out.status;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!("--admin-listen: cannot bind tcp:127.0.0.1:{port}")),
        "{err}"
    );
    assert_eq!(err.matches("Address already in use").count(), 1, "{err}");
    drop(taken);
}

/// `slotgate wrap` on a llama-server that can never start gives up after `--wrap-start-limit`
/// failed starts in a row, shows its last lines and exits non-zero, so systemd or Kubernetes see a
/// failed service rather than one that restarts it forever.
#[test]
fn wrap_gives_up_on_a_child_that_never_starts() {
    let dir = unique_dir("startup-wrap");
    let out = command()
        .arg("wrap")
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("gate.sock").display()))
        .args(["--admin-listen", "off", "--wrap-start-limit", "2"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args([
            "--",
            "sh",
            "-c",
            "echo 'error: failed to load model: no such file'; exit 3",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(out, Duration::from_secs(15));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("failed 2 starts in a row"), "{err}");
    assert!(err.contains("--wrap-start-limit"), "{err}");
    // The child's own last words, in the reason.
    let reason = err
        .lines()
        .skip_while(|l| !l.contains("giving up"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(reason.contains("failed to load model"), "{err}");
}

fn wait_within(mut child: std::process::Child, limit: Duration) -> std::process::Output {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}
