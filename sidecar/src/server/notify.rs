//! systemd's notification protocol (`sd_notify`), by hand: `READY=1`, `STOPPING=1`, `STATUS=` and
//! watchdog pings sent as datagrams to `$NOTIFY_SOCKET`. Without that variable every call is a no-op.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

/// How long one notification may block when systemd's receive queue is full. libsystemd blocks
/// without limit; a stuck manager must not stall a runtime worker for longer than this.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET={0:?} is neither an absolute path nor an abstract socket (`@name`)")]
    BadAddress(String),
    #[error("cannot use NOTIFY_SOCKET={addr:?}: {source}")]
    Io { addr: String, source: io::Error },
}

/// Where notifications go; cheap to clone. `Notifier::default()` sends nothing.
#[derive(Clone, Default)]
pub struct Notifier {
    target: Option<Arc<Target>>,
}

struct Target {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// For logs.
    name: String,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`; a malformed value is logged and notifications are off (a start must
    /// not fail because the manager's socket is odd: systemd then times the start out, and says so).
    pub fn from_env() -> Notifier {
        match std::env::var_os("NOTIFY_SOCKET") {
            None => Notifier::default(),
            Some(v) => Notifier::to(&v).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "systemd notifications off");
                Notifier::default()
            }),
        }
    }

    /// Sends to `addr`: an absolute path, or `@name` for a socket in the abstract namespace.
    pub fn to(addr: &OsStr) -> Result<Notifier, NotifyError> {
        let name = addr.to_string_lossy().into_owned();
        let bytes = addr.as_bytes();
        let io_err = |source| NotifyError::Io {
            addr: name.clone(),
            source,
        };
        let sockaddr = match bytes.first() {
            Some(b'@') => abstract_addr(&bytes[1..]).map_err(io_err)?,
            Some(b'/') => SocketAddr::from_pathname(addr).map_err(io_err)?,
            _ => return Err(NotifyError::BadAddress(name)),
        };
        let socket = UnixDatagram::unbound().map_err(io_err)?;
        socket
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(io_err)?;
        Ok(Notifier {
            target: Some(Arc::new(Target {
                socket,
                addr: sockaddr,
                name,
            })),
        })
    }

    /// Whether a manager listens for notifications.
    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Every listener is bound and served: systemd may start units ordered after this one.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// The drain has begun.
    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    /// Sends one datagram of `KEY=value` lines. Failures are logged, never returned: a lost
    /// notification is systemd's to time out, not a reason to stop serving.
    pub fn send(&self, message: &str) {
        let Some(t) = &self.target else { return };
        if let Err(e) = t.socket.send_to_addr(message.as_bytes(), &t.addr) {
            tracing::warn!(notify_socket = %t.name, error = %e, message, "systemd notification not sent");
        }
    }
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &[u8]) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract sockets exist only on Linux",
    ))
}

/// A newline would start a new `KEY=` assignment.
fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// How often to ping: half of `WATCHDOG_USEC` (as `sd_watchdog_enabled` advises), if it is set,
/// positive, and `WATCHDOG_PID` is unset or names `our_pid` (the watchdog may be meant for a parent
/// that exec'd a wrapper).
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, our_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(our_pid) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// [`watchdog_interval`] from this process's environment.
pub fn watchdog_interval_from_env() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// Pings every `every` until aborted. It runs as a task on the runtime that serves requests, so a
/// runtime whose workers are all wedged stops pinging and systemd restarts the service.
pub async fn watchdog_loop(notifier: Notifier, every: Duration) {
    let mut tick = tokio::time::interval(every);
    // A ping that came late must not be followed by a burst: one ping per period proves as much.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        notifier.watchdog();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 1024];
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8(buf[..n].to_vec()).expect("UTF-8")
    }

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-notify-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn sends_ready_stopping_and_watchdog_to_a_path() {
        let dir = temp_dir("path");
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind");
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = Notifier::to(path.as_os_str()).expect("notifier");
        assert!(n.is_enabled());
        n.ready("serving on unix:/x\nand more");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=serving on unix:/x and more");
        n.watchdog();
        assert_eq!(recv(&sock), "WATCHDOG=1");
        n.stopping("draining");
        assert_eq!(recv(&sock), "STOPPING=1\nSTATUS=draining");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!(
            "slotgate-notify-test-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        );
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = Notifier::to(OsStr::new(&format!("@{name}"))).expect("notifier");
        n.ready("up");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=up");
    }

    #[test]
    fn relative_or_empty_addresses_are_refused() {
        for bad in ["", "relative/notify.sock", "notify"] {
            assert!(
                matches!(
                    Notifier::to(OsStr::new(bad)),
                    Err(NotifyError::BadAddress(_))
                ),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn a_missing_manager_is_not_an_error() {
        let dir = temp_dir("gone");
        let n = Notifier::to(dir.join("nobody.sock").as_os_str()).expect("notifier");
        n.ready("up");
        n.watchdog();
        Notifier::default().ready("nothing to send to");
        assert!(!Notifier::default().is_enabled());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn watchdog_pings_at_half_the_timeout_when_meant_for_us() {
        let half = Some(Duration::from_millis(100));
        assert_eq!(watchdog_interval(Some("200000"), None, 42), half);
        assert_eq!(watchdog_interval(Some("200000"), Some("42"), 42), half);
        assert_eq!(watchdog_interval(Some("200000"), Some("41"), 42), None);
        assert_eq!(watchdog_interval(Some("200000"), Some("x"), 42), None);
        assert_eq!(watchdog_interval(Some("0"), None, 42), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 42), None);
        assert_eq!(watchdog_interval(None, Some("42"), 42), None);
        assert_eq!(
            watchdog_interval(Some("1"), None, 42),
            Some(Duration::from_millis(1))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_loop_pings_every_period() {
        let dir = temp_dir("loop");
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind");
        sock.set_nonblocking(true).unwrap();
        let n = Notifier::to(path.as_os_str()).expect("notifier");
        let task = tokio::spawn(watchdog_loop(n, Duration::from_millis(100)));
        // First tick at once, then one per 100 ms: 0, 100, 200, 300 ms.
        tokio::time::sleep(Duration::from_millis(350)).await;
        task.abort();
        let mut buf = [0u8; 64];
        let mut pings = 0;
        while let Ok(len) = sock.recv(&mut buf) {
            assert_eq!(&buf[..len], b"WATCHDOG=1");
            pings += 1;
        }
        assert_eq!(pings, 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
