//! Where llama-server is when `--upstream` is not set: on this host at 127.0.0.1:9931 (its default
//! port from the release that moves it) or 127.0.0.1:8080 (its default until then, which it warns
//! will change), whichever answers its `/health` as llama-server does, 9931 first.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The ports llama-server listens on by default, newest first.
pub const DEFAULT_PORTS: [u16; 2] = [9931, 8080];

/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Between rounds while neither port answers.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// The first of `candidates` that answers as llama-server within `window` (probed in rounds until
/// one does), else `None`.
pub fn find(candidates: &[SocketAddr], window: Duration) -> Option<SocketAddr> {
    let until = Instant::now() + window;
    loop {
        if let Some(found) = candidates.iter().find(|a| is_llama_server(a)) {
            return Some(*found);
        }
        if Instant::now() + ROUND_PAUSE >= until {
            return None;
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
    fn the_first_that_answers_as_llama_server_wins() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}";
        let loading = "HTTP/1.1 503 Service Unavailable\r\n\r\n{\"error\":{\"code\":503,\"message\":\"Loading model\",\"type\":\"unavailable_error\"}}";
        let other = "HTTP/1.1 404 Not Found\r\n\r\nnope";
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (new, old, web) = (serving(ok), serving(loading), serving(other));
        let short = Duration::from_millis(100);
        assert_eq!(find(&[new, old], short), Some(new));
        assert_eq!(find(&[closed, old], short), Some(old));
        assert_eq!(find(&[web, closed], short), None);
        assert_eq!(default_candidates()[0].port(), 9931);
    }
}
