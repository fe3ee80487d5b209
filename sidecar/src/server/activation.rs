//! Socket activation: listening sockets systemd passed in (`LISTEN_FDS` descriptors from fd 3, for
//! the process `LISTEN_PID`), used as they are: never bound again, never chmod'ed, never unlinked.
//!
//! The rule: the socket named `admin` (`FileDescriptorName=admin`, via `LISTEN_FDNAMES`) serves the
//! admin endpoints and replaces `--admin-listen`; every other one serves clients, and if there is
//! any, together they replace `--listen`. Unix or TCP is read from the socket (getsockname).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::FdFlags;
use rustix::net::{sockopt, AddressFamily, SocketType};

use super::Listener;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;
/// The `FileDescriptorName=` of the admin socket.
pub const ADMIN_NAME: &str = "admin";
/// The name of a descriptor when `LISTEN_FDNAMES` is not set (as libsystemd has it).
const UNNAMED: &str = "unknown";

/// Set by the first [`take_from_env`]: the descriptors must get exactly one owner.
static TAKEN: AtomicBool = AtomicBool::new(false);

#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("socket activation: LISTEN_{var}={value:?} is not a number")]
    NotANumber { var: &'static str, value: String },
    #[error("socket activation: LISTEN_FDNAMES names {names} sockets but LISTEN_FDS is {fds}")]
    NameCount { names: usize, fds: usize },
    #[error("socket activation: fds {0} and {1} are both named `admin`; one admin listener only")]
    TwoAdmins(RawFd, RawFd),
    #[error("socket activation: fd {fd} (`{name}`) {reason}")]
    Unusable {
        fd: RawFd,
        name: String,
        reason: String,
    },
}

/// One descriptor systemd says it passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passed {
    pub fd: RawFd,
    pub name: String,
}

/// The listeners systemd passed, by role.
#[derive(Default)]
pub struct Inherited {
    pub clients: Vec<Listener>,
    pub admin: Option<Listener>,
}

/// Which descriptors are ours, from the three variables, as `sd_listen_fds_with_names` reads them.
/// None when `LISTEN_PID` is missing or names another process: the variables were then inherited
/// from an activated parent and the descriptors, if open at all, are not meant for us.
pub fn passed(
    pid: Option<&str>,
    fds: Option<&str>,
    names: Option<&str>,
    our_pid: u32,
) -> Result<Vec<Passed>, ActivationError> {
    let number = |var, value: &str| {
        value
            .trim()
            .parse::<u32>()
            .map_err(|_| ActivationError::NotANumber {
                var,
                value: value.to_owned(),
            })
    };
    let Some(pid) = pid else {
        return Ok(Vec::new());
    };
    if number("PID", pid)? != our_pid {
        return Ok(Vec::new());
    }
    let Some(fds) = fds else {
        return Ok(Vec::new());
    };
    let count = number("FDS", fds)?;
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    let names: Vec<String> = match names {
        Some(n) => n.split(':').map(str::to_owned).collect(),
        None => vec![UNNAMED.to_owned(); count],
    };
    if names.len() != count {
        return Err(ActivationError::NameCount {
            names: names.len(),
            fds: count,
        });
    }
    Ok(names
        .into_iter()
        .zip(LISTEN_FDS_START..)
        .map(|(name, fd)| Passed { fd, name })
        .collect())
}

/// Takes the sockets systemd passed to this process and removes `LISTEN_PID`, `LISTEN_FDS` and
/// `LISTEN_FDNAMES` from the environment, so nothing slotgate starts believes they are its own.
/// Only the first call takes anything.
///
/// Call it before anything else opens descriptors or reads the environment from another thread.
pub fn take_from_env() -> Result<Inherited, ActivationError> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(Inherited::default());
    }
    let var = |k| std::env::var(k).ok();
    let (pid, fds, names) = (var("LISTEN_PID"), var("LISTEN_FDS"), var("LISTEN_FDNAMES"));
    for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    let passed = passed(
        pid.as_deref(),
        fds.as_deref(),
        names.as_deref(),
        std::process::id(),
    )?;
    let mut inherited = Inherited::default();
    let mut admin_fd = None;
    for Passed { fd, name } in passed {
        let owned = own(fd).map_err(|e| ActivationError::Unusable {
            fd,
            name: name.clone(),
            reason: format!("is not open: {e}"),
        })?;
        let listener = adopt(owned, &name)?;
        let admin = name == ADMIN_NAME;
        tracing::info!(fd, name, listen = %listener.describe(), role = if admin { "admin" } else { "clients" }, "listening socket inherited from systemd");
        if admin {
            if let Some(first) = admin_fd.replace(fd) {
                return Err(ActivationError::TwoAdmins(first, fd));
            }
            inherited.admin = Some(listener);
        } else {
            inherited.clients.push(listener);
        }
    }
    Ok(inherited)
}

/// Takes ownership of descriptor `fd`, one systemd passed.
#[allow(
    unsafe_code,
    reason = "adopts a descriptor systemd passed by number: no safe constructor exists"
)]
fn own(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: `fd` >= 3, so not -1; the borrow lives for this one fcntl, which only reports EBADF
    // if the descriptor is not open.
    rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) })?;
    // SAFETY: `fd` is open (above) and was passed to this process by systemd (LISTEN_PID is ours).
    // Nothing else in slotgate knows it, and `take_from_env` runs its body once (`TAKEN`), so the
    // descriptor gets exactly one owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks that `fd` is a listening stream socket of a family slotgate serves and wraps it.
pub fn adopt(fd: OwnedFd, name: &str) -> Result<Listener, ActivationError> {
    let raw = fd.as_raw_fd();
    let unusable = |reason: String| ActivationError::Unusable {
        fd: raw,
        name: name.to_owned(),
        reason,
    };
    // Passed descriptors cannot be close-on-exec (they would not have reached us); nothing slotgate
    // starts should hold them open.
    rustix::io::fcntl_setfd(&fd, FdFlags::CLOEXEC)
        .map_err(|e| unusable(format!("cannot be made close-on-exec: {e}")))?;
    let family = rustix::net::getsockname(&fd)
        .map_err(|e| unusable(format!("is not a socket: {e}")))?
        .address_family();
    let kind = sockopt::socket_type(&fd).map_err(|e| unusable(format!("is not a socket: {e}")))?;
    if kind != SocketType::STREAM {
        return Err(unusable(
            "is not a stream socket: use ListenStream=".to_owned(),
        ));
    }
    if !sockopt::socket_acceptconn(&fd).map_err(|e| unusable(e.to_string()))? {
        return Err(unusable(
            "is not listening: slotgate accepts its own connections, so the socket unit needs \
             Accept=no"
                .to_owned(),
        ));
    }
    let adopted = match family {
        AddressFamily::UNIX => Listener::inherited_unix(std::os::unix::net::UnixListener::from(fd)),
        AddressFamily::INET | AddressFamily::INET6 => {
            Listener::inherited_tcp(std::net::TcpListener::from(fd))
        }
        other => {
            return Err(unusable(format!(
                "has address family {}, neither AF_UNIX nor AF_INET/AF_INET6",
                other.as_raw()
            )))
        }
    };
    adopted.map_err(|e| unusable(format!("cannot be served: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[Passed]) -> Vec<(RawFd, &str)> {
        v.iter().map(|p| (p.fd, p.name.as_str())).collect()
    }

    #[test]
    fn descriptors_are_ours_only_for_our_pid() {
        let p = passed(Some("7"), Some("2"), Some("slotgate.socket:admin"), 7).unwrap();
        assert_eq!(names(&p), [(3, "slotgate.socket"), (4, "admin")]);
        // Another process's variables, or none: nothing is ours.
        assert!(passed(Some("8"), Some("2"), None, 7).unwrap().is_empty());
        assert!(passed(None, Some("2"), None, 7).unwrap().is_empty());
        assert!(passed(Some("7"), None, None, 7).unwrap().is_empty());
        assert!(passed(Some("7"), Some("0"), None, 7).unwrap().is_empty());
    }

    #[test]
    fn unnamed_descriptors_are_unknown() {
        let p = passed(Some("7"), Some("3"), None, 7).unwrap();
        assert_eq!(names(&p), [(3, "unknown"), (4, "unknown"), (5, "unknown")]);
    }

    #[test]
    fn malformed_variables_are_errors() {
        assert!(matches!(
            passed(Some("seven"), Some("1"), None, 7),
            Err(ActivationError::NotANumber { var: "PID", .. })
        ));
        assert!(matches!(
            passed(Some("7"), Some("-1"), None, 7),
            Err(ActivationError::NotANumber { var: "FDS", .. })
        ));
        assert!(matches!(
            passed(Some("7"), Some("2"), Some("admin"), 7),
            Err(ActivationError::NameCount { names: 1, fds: 2 })
        ));
    }

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-activation-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[tokio::test]
    async fn a_unix_listener_is_served_as_it_is_and_never_unlinked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("unix");
        let path = dir.join("inherited.sock");
        let std = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let fd = OwnedFd::from(std);
        rustix::io::fcntl_setfd(&fd, FdFlags::empty()).unwrap();
        let listener = adopt(fd, "client").expect("a listening Unix socket");
        assert_eq!(listener.describe(), format!("unix:{}", path.display()));
        assert!(matches!(listener, Listener::Unix(_)));
        let client = tokio::net::UnixStream::connect(&path)
            .await
            .expect("connect");
        let (_conn, peer) = listener.accept().await.expect("accept");
        assert_eq!(peer.map(|p| p.pid), Some(Some(std::process::id() as i32)));
        drop(client);
        drop(listener);
        let meta = std::fs::metadata(&path).expect("the socket file is still there");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "mode untouched");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_tcp_listener_is_adopted_close_on_exec() {
        let std = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std.local_addr().unwrap();
        let fd = OwnedFd::from(std);
        rustix::io::fcntl_setfd(&fd, FdFlags::empty()).unwrap();
        let raw = fd.as_raw_fd();
        let listener = adopt(fd, "admin").expect("a listening TCP socket");
        assert_eq!(listener.describe(), format!("tcp:{addr}"));
        let Listener::Tcp(t) = &listener else {
            panic!("not TCP")
        };
        assert_eq!(t.as_raw_fd(), raw);
        assert!(rustix::io::fcntl_getfd(t)
            .unwrap()
            .contains(FdFlags::CLOEXEC));
        let _client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        listener.accept().await.expect("accept");
    }

    #[tokio::test]
    async fn sockets_that_cannot_serve_are_refused() {
        let udp = OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let err = adopt(udp, "client").err().expect("UDP refused").to_string();
        assert!(err.contains("not a stream socket"), "{err}");

        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let err = adopt(OwnedFd::from(conn), "client")
            .err()
            .expect("a connection refused")
            .to_string();
        assert!(err.contains("Accept=no"), "{err}");

        let file = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let err = adopt(file, "client")
            .err()
            .expect("a file refused")
            .to_string();
        assert!(err.contains("is not a socket"), "{err}");
    }
}
