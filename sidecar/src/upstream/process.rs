//! The llama-server process behind the upstream address, when it runs on this host and slotgate
//! may see it: the kernel names the process listening on a Unix socket (the peer's credentials of a
//! connection to it) or on a loopback TCP port (`/proc/net/tcp*` and the process's open sockets).
//! Its command line (and environment, where readable) says what `/props` does not: whether the slots
//! share one KV pool. In another container or pid namespace nothing is found, and the operator's
//! `--kv-pool` setting decides. Discovery reads here who a listening socket and its process belong
//! to (`Listening`, `Identity`), as the kernel says.

use std::collections::HashMap;
use std::net::IpAddr;
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
        self.argv
            .first()
            .and_then(|a| Path::new(a).file_name())
            .is_some_and(|n| is_llama_server_name(&n.to_string_lossy()))
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
    let inodes: Vec<u64> = listening(port, None).iter().map(|s| s.inode).collect();
    holder(&inodes)
}

/// A listening TCP socket as the kernel lists it: who made it, and its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub uid: u32,
    pub inode: u64,
}

/// The sockets listening on `port` (from `/proc/net/tcp` and `tcp6`, this network namespace's);
/// with `to`, only those a connection to `to` may reach: bound to it or to the wildcard, in IPv4
/// or (IPv4-mapped) IPv6.
pub fn listening(port: u16, to: Option<IpAddr>) -> Vec<Listening> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(&"0A"), Some(uid), Some(inode)) =
                (cols.get(1), cols.get(3), cols.get(7), cols.get(9))
            else {
                continue;
            };
            let Some((ip, p)) = local.rsplit_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() != Some(port) {
                continue;
            }
            let reached = match (to, kernel_ip(ip)) {
                (None, _) => true,
                (Some(to), Some(bound)) => reaches(to, bound),
                (Some(_), None) => true,
            };
            if let (true, Ok(uid), Ok(inode)) = (reached, uid.parse(), inode.parse()) {
                found.push(Listening { uid, inode });
            }
        }
    }
    found
}

/// An address as `/proc/net/tcp*` prints it: 32-bit words in hex, each in this host's byte order.
fn kernel_ip(hex: &str) -> Option<IpAddr> {
    let words: Option<Vec<[u8; 4]>> = (0..hex.len() / 8)
        .map(|i| {
            let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
            Some(w.to_ne_bytes())
        })
        .collect();
    let bytes: Vec<u8> = words?.concat();
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// Whether a socket bound to `bound` may take a connection to `to`.
fn reaches(to: IpAddr, bound: IpAddr) -> bool {
    let bound = match bound {
        IpAddr::V6(v6) if v6.is_unspecified() => return true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(bound, IpAddr::V4),
        v4 => v4,
    };
    bound == to || (bound.is_unspecified() && bound.is_ipv4() == to.is_ipv4())
}

/// The first process that holds one of the sockets `inodes` open, among those this user may look
/// into.
pub fn holder(inodes: &[u64]) -> Option<u32> {
    if inodes.is_empty() {
        return None;
    }
    let links: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
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
                if links.iter().any(|l| Path::new(l) == link) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// Who a process is, as the kernel says: not what it wrote into its own command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub pid: u32,
    /// Its real and effective uids.
    pub uids: (u32, u32),
    /// The file name of its executable (`/proc/<pid>/exe`).
    pub exe: Option<String>,
    /// Its `comm`, the name it was started as (at most 15 bytes).
    pub comm: String,
}

impl Identity {
    pub fn of(pid: u32) -> Option<Identity> {
        let dir = Path::new("/proc").join(pid.to_string());
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        let mut ids = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))?
            .split_whitespace()
            .map(str::parse::<u32>);
        let uids = (ids.next()?.ok()?, ids.next()?.ok()?);
        // A replaced binary still runs: its link ends " (deleted)".
        let exe = std::fs::read_link(dir.join("exe")).ok().and_then(|p| {
            let name = p.file_name()?.to_string_lossy().into_owned();
            Some(name.trim_end_matches(" (deleted)").to_owned())
        });
        let comm = std::fs::read_to_string(dir.join("comm"))
            .ok()?
            .trim_end()
            .to_owned();
        Some(Identity {
            pid,
            uids,
            exe,
            comm,
        })
    }

    /// Whether its executable, or the name it was started as, is llama-server's.
    pub fn is_llama_server(&self) -> bool {
        self.exe.as_deref().is_some_and(is_llama_server_name) || is_llama_server_name(&self.comm)
    }

    /// `pid 123 (python3)`.
    pub fn describe(&self) -> String {
        let name = self.exe.as_deref().unwrap_or(&self.comm);
        format!("pid {} ({name})", self.pid)
    }
}

/// llama-server's binary, or the `llama` binary that runs it as a subcommand.
fn is_llama_server_name(name: &str) -> bool {
    name.starts_with("llama-server") || name == "llama" || name.starts_with("llama.")
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

    #[test]
    fn a_listening_socket_names_its_owner_and_its_process() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        let loopback = IpAddr::from([127, 0, 0, 1]);
        let found = listening(port, Some(loopback));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].uid, rustix::process::geteuid().as_raw());
        assert!(listening(port, Some(IpAddr::from([127, 0, 0, 2]))).is_empty());
        let pid = holder(&[found[0].inode]).unwrap();
        assert_eq!(pid, std::process::id());
        let me = Identity::of(pid).unwrap();
        assert_eq!(me.uids.1, found[0].uid);
        assert!(!me.is_llama_server(), "{me:?}");

        assert_eq!(kernel_ip(&hex_of(loopback)), Some(loopback));
        let any6: IpAddr = "::".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        for (bound, reached) in [
            (loopback, true),
            (IpAddr::from([0, 0, 0, 0]), true),
            (any6, true),
            (mapped, true),
            (IpAddr::from([127, 0, 0, 2]), false),
            ("::1".parse().unwrap(), false),
        ] {
            assert_eq!(kernel_ip(&hex_of(bound)), Some(bound));
            assert_eq!(reaches(loopback, bound), reached, "{bound}");
        }
    }

    /// `addr` as `/proc/net/tcp*` prints it.
    fn hex_of(addr: IpAddr) -> String {
        let bytes = match addr {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        bytes
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes(w.try_into().unwrap())))
            .collect()
    }
}
