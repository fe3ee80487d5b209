//! Where llama-server is when `--upstream` is not set: on this host at 127.0.0.1:9931 (its default
//! port from the release that moves it) or 127.0.0.1:8080 (its default until then, which it warns
//! will change), whichever answers its `/health` as llama-server does, 9931 first. A port any local
//! user may take is trusted only once proven: the kernel says its listening socket and the process
//! holding it are slotgate's own user's, and the process is llama-server. slotgate's key and its
//! clients' prompts go to no port found otherwise; a port not proven is not even asked `/health`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::process::{self, Identity};
use crate::owner_only::user;

/// The ports llama-server listens on by default, newest first.
pub const DEFAULT_PORTS: [u16; 2] = [9931, 8080];

/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Between rounds while neither port answers.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// A port that was passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub addr: SocketAddr,
    pub why: String,
}

/// The llama-server found, and the ports passed over before it.
#[derive(Debug)]
pub struct Found {
    pub addr: SocketAddr,
    pub process: Identity,
    pub skipped: Vec<Skipped>,
}

/// No proven llama-server answered: why, for each port where something listened.
#[derive(Debug)]
pub struct NotFound {
    pub candidates: Vec<SocketAddr>,
    pub window: Duration,
    pub skipped: Vec<Skipped>,
}

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<String> = self.candidates.iter().map(ToString::to_string).collect();
        write!(
            f,
            "no --upstream, and no llama-server of slotgate's user ({}) answered on {} within {:?} \
             (--connect-timeout)",
            user(me()),
            ports.join(" or "),
            self.window
        )?;
        for s in &self.skipped {
            write!(f, "; {} was passed over: {}", s.addr, s.why)?;
        }
        write!(
            f,
            ". Set --upstream (SLOTGATE_UPSTREAM, `upstream` in the file) to the llama-server to \
             use: slotgate sends its key and its clients' prompts only to one it was told of, or \
             one it proved its own user runs"
        )
    }
}

impl std::error::Error for NotFound {}

fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The first of `candidates` that is proven slotgate's user's llama-server and answers as one
/// within `window` (probed in rounds until one does).
pub fn find(candidates: &[SocketAddr], window: Duration) -> Result<Found, NotFound> {
    let until = Instant::now() + window;
    let mut skipped: Vec<Skipped> = Vec::new();
    loop {
        for addr in candidates {
            match proven(*addr) {
                Ok(None) => {}
                Ok(Some(process)) if is_llama_server(addr) => {
                    return Ok(Found {
                        addr: *addr,
                        process,
                        skipped,
                    })
                }
                Ok(Some(_)) => {}
                Err(why) => {
                    skipped.retain(|s| s.addr != *addr);
                    skipped.push(Skipped { addr: *addr, why });
                }
            }
        }
        if Instant::now() + ROUND_PAUSE >= until {
            return Err(NotFound {
                candidates: candidates.to_vec(),
                window,
                skipped,
            });
        }
        std::thread::sleep(ROUND_PAUSE);
    }
}

/// The default candidates on 127.0.0.1.
pub fn default_candidates() -> Vec<SocketAddr> {
    DEFAULT_PORTS
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect()
}

/// The llama-server process of slotgate's user that listens at `addr`, as the kernel says;
/// `Ok(None)` when nothing listens there, why not when something else does. Every socket a
/// connection to `addr` may reach must be proven, so no other user's socket can take it.
fn proven(addr: SocketAddr) -> Result<Option<Identity>, String> {
    let sockets = process::listening(addr.port(), Some(addr.ip()));
    if sockets.is_empty() {
        // Nothing in this namespace's tables: nothing there, unless the tables hide it.
        return match TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) {
            Ok(_) => Err(
                "something accepts connections there, but the kernel's socket tables \
                          (/proc/net/tcp) do not show whose it is"
                    .into(),
            ),
            Err(_) => Ok(None),
        };
    }
    let mut found = None;
    for socket in sockets {
        if socket.uid != me() {
            return Err(format!(
                "its socket belongs to {}, not to slotgate's user ({})",
                user(socket.uid),
                user(me())
            ));
        }
        let process = process::holder(&[socket.inode])
            .and_then(Identity::of)
            .ok_or("no process slotgate can see holds its socket (another pid namespace?)")?;
        if process.uids != (me(), me()) {
            return Err(format!(
                "{} runs as {}, not as slotgate's user ({})",
                process.describe(),
                user(process.uids.1),
                user(me())
            ));
        }
        if !process.is_llama_server() {
            return Err(format!(
                "it is held by {}, which is not llama-server",
                process.describe()
            ));
        }
        found = Some(process);
    }
    Ok(found)
}

/// Whether `addr` answers `GET /health` as llama-server: 200 `{"status":"ok"}`, or 503 while it
/// loads its model (`"Loading model"`, `unavailable_error`).
fn is_llama_server(addr: &SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(addr, PROBE_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = s.set_write_timeout(Some(PROBE_TIMEOUT));
    let ask = format!(
        "GET /health HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: slotgate\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(ask.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.take(16 * 1024).read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).unwrap_or("");
    match status {
        "200" => text.contains("\"status\""),
        "503" => text.contains("unavailable_error") || text.contains("Loading model"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server answering every connection with `answer`, on an ephemeral port.
    fn serving(answer: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf);
                let _ = c.write_all(answer.as_bytes());
            }
        });
        addr
    }

    #[test]
    fn what_answers_as_llama_server() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}";
        let loading = "HTTP/1.1 503 Service Unavailable\r\n\r\n{\"error\":{\"code\":503,\"message\":\"Loading model\",\"type\":\"unavailable_error\"}}";
        let other = "HTTP/1.1 404 Not Found\r\n\r\nnope";
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        assert!(is_llama_server(&serving(ok)));
        assert!(is_llama_server(&serving(loading)));
        assert!(!is_llama_server(&serving(other)));
        assert!(!is_llama_server(&closed));
        assert_eq!(default_candidates()[0].port(), 9931);
    }

    /// This test process answers as llama-server but is not one: passed over, saying so.
    #[test]
    fn a_server_that_is_not_llama_server_is_passed_over() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}";
        let impostor = serving(ok);
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let err = find(&[impostor, closed], Duration::from_millis(100)).unwrap_err();
        assert_eq!(err.skipped.len(), 1, "{err}");
        assert_eq!(err.skipped[0].addr, impostor);
        assert!(err.skipped[0].why.contains("not llama-server"), "{err}");
        let text = err.to_string();
        assert!(text.contains("Set --upstream"), "{text}");
    }
}
