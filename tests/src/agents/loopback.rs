//! The agents' network, all on loopback: a relay that lets them reach llama-server direct (they speak
//! TCP; the harness starts llama-server on a Unix socket), a sentinel standing as their HTTP proxy
//! that records every request meant for another host, and slotgate's access log read back.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, UnixStream};
use tokio::task::JoinHandle;

/// Forwards every TCP connection on `127.0.0.1:PORT` to a Unix socket, byte for byte: llama-server
/// direct, as far as an agent can tell. Stops accepting on drop.
pub struct Relay {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Relay {
    pub async fn to_unix(socket: &Path) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a relay");
        let addr = listener.local_addr().expect("the relay's address");
        let socket = socket.to_owned();
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let socket = socket.clone();
                tokio::spawn(async move {
                    if let Ok(mut unix) = UnixStream::connect(&socket).await {
                        let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                    }
                });
            }
        });
        Relay { addr, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The agents' `HTTP(S)_PROXY` and `ALL_PROXY` (with loopback exempt; Claude Code gets none, see
/// [`super::Agent::run`]): anything an agent sends elsewhere (telemetry, an update check, a package
/// install) comes here instead, is recorded by its first line (`CONNECT host:443 HTTP/1.1`) and
/// refused. An agent that ignores proxies and resolves a host itself is not seen here; each was also
/// checked once under `strace` (docs/agents.md).
pub struct Sentinel {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Sentinel {
    pub async fn start() -> Sentinel {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the sentinel");
        let addr = listener.local_addr().expect("the sentinel's address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 512];
                    let n = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf))
                        .await
                        .map_or(0, |r| r.unwrap_or(0));
                    let head = String::from_utf8_lossy(&buf[..n]);
                    let first = head
                        .lines()
                        .next()
                        .unwrap_or("(a connection, nothing sent)");
                    record.lock().unwrap().push(first.to_owned());
                });
            }
        });
        Sentinel { addr, seen, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// No agent tried to reach a host beyond loopback.
    pub fn assert_quiet(&self) {
        let seen = self.seen.lock().unwrap();
        assert!(
            seen.is_empty(),
            "the agents tried to leave loopback (through the proxy they were given): {seen:#?}"
        );
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One line of slotgate's access log (`--log-format json`).
#[derive(Debug, Clone)]
pub struct Access {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub outcome: String,
    pub tenant: Option<String>,
    pub queue_wait_ms: Option<u64>,
}

/// The access lines in a gate's stderr, in order; the gate must run with `--log-format json`.
pub fn access_log(stderr: &str) -> Vec<Access> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "slotgate::access")
        .map(|v| {
            let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            Access {
                method: text("method"),
                path: text("path"),
                status: v["status"].as_u64().unwrap_or(0) as u16,
                outcome: text("outcome"),
                tenant: v["tenant"].as_str().map(str::to_owned),
                queue_wait_ms: v["queue_wait_ms"].as_u64(),
            }
        })
        .collect()
}
