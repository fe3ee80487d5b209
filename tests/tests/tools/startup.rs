//! Start-up failures say what failed, once, and which setting it was.

use std::time::Duration;

use slotgate_tests::gate::command;
use slotgate_tests::*;

#[test]
fn a_taken_admin_port_names_the_flag_and_the_error_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = unique_dir("startup-bind");
    let mut child = command()
        .args(["--upstream", "unix:/nonexistent/llama.sock"])
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("gate.sock").display()))
        .args(["--admin-listen", &format!("tcp:127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "slotgate kept running on a taken port"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "{err}");
    assert!(
        err.contains(&format!("--admin-listen: cannot bind tcp:127.0.0.1:{port}")),
        "{err}"
    );
    assert_eq!(err.matches("Address already in use").count(), 1, "{err}");
    drop(taken);
}
