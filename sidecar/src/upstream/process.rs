//! The llama-server process behind the upstream address, when it runs on this host and slotgate
//! may see it: the kernel names the process listening on a Unix socket (the peer's credentials of a
//! connection to it) or on a loopback TCP port (`/proc/net/tcp*` and the process's open sockets).
//! Its command line (and environment, where readable) says what `/props` does not: whether the slots
//! share one KV pool. In another container or pid namespace nothing is found, and the operator's
//! `--kv-pool` setting decides.

use std::collections::HashMap;
use std::path::Path;

use crate::config::UpstreamAddr;

/// A process's command line and, when this user may read it, its environment.
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: u32,
    pub argv: Vec<String>,
    pub env: Option<HashMap<String, String>>,
}

impl Process {
    /// Whether it looks like llama-server (or the `llama` binary that runs it as a subcommand).
    pub fn is_llama_server(&self) -> bool {
        let name = self
            .argv
            .first()
            .and_then(|a| Path::new(a).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        name.starts_with("llama-server") || name == "llama" || name.starts_with("llama.")
    }
}

/// The process serving `target`, if it runs on this host and can be seen.
pub async fn find(target: &UpstreamAddr) -> Option<Process> {
    let pid = match target {
        UpstreamAddr::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path).await.ok()?;
            let pid = stream.peer_cred().ok()?.pid()?;
            u32::try_from(pid).ok()?
        }
        UpstreamAddr::Tcp(authority) => {
            let (host, port) = authority.rsplit_once(':')?;
            let local = matches!(
                host,
                "localhost" | "127.0.0.1" | "[::1]" | "0.0.0.0" | "[::]"
            ) || host.starts_with("127.");
            if !local {
                return None;
            }
            let port: u16 = port.parse().ok()?;
            tokio::task::spawn_blocking(move || listener_pid(port))
                .await
                .ok()??
        }
    };
    // 0: the peer is in another pid namespace (another container), invisible from here.
    if pid == 0 {
        return None;
    }
    tokio::task::spawn_blocking(move || read(pid)).await.ok()?
}

fn read(pid: u32) -> Option<Process> {
    let dir = Path::new("/proc").join(pid.to_string());
    let argv: Vec<String> = std::fs::read(dir.join("cmdline"))
        .ok()?
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let env = std::fs::read(dir.join("environ")).ok().map(|raw| {
        raw.split(|&b| b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect()
    });
    Some(Process { pid, argv, env })
}

/// The process with a listening TCP socket on `port`: its inode from `/proc/net/tcp{,6}`, then
/// the process that holds that socket open.
fn listener_pid(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(state), Some(inode)) = (cols.get(1), cols.get(3), cols.get(9))
            else {
                continue;
            };
            let listening = *state == "0A";
            let on_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                == Some(port);
            if listening && on_port {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| Path::new(i) == link) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_process_behind_a_unix_socket_or_a_loopback_port_is_found() {
        let dir = std::env::temp_dir().join(format!("slotgate-up-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _unix = tokio::net::UnixListener::bind(&path).unwrap();
        let found = find(&UpstreamAddr::Unix(path)).await.unwrap();
        assert_eq!(found.pid, std::process::id());
        assert!(!found.argv.is_empty());
        assert!(!found.is_llama_server(), "{:?}", found.argv);
        std::fs::remove_dir_all(&dir).unwrap();

        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        let found = find(&UpstreamAddr::Tcp(format!("127.0.0.1:{port}")))
            .await
            .unwrap();
        assert_eq!(found.pid, std::process::id());
        assert!(find(&UpstreamAddr::Tcp("10.1.2.3:80".into()))
            .await
            .is_none());
    }
}
