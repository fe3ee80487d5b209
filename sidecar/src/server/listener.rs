//! Listen sockets: a Unix socket bound without ever clobbering a live one (probe-connect first, only a
//! refused connection marks a stale socket), given its file mode, and unlinked when dropped; or TCP.
//! A socket inherited from systemd (see `activation`) is served as it is and never unlinked.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use slotgate_sdk::Peer;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::capacity::PeerKey;
use crate::config::ListenAddr;

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{0} is in use: another process is listening on it")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// The cause is part of the message, not a source: printed with its chain, it would be said twice.
    #[error("cannot bind {addr}: {error}")]
    Io { addr: String, error: io::Error },
}

pub enum Listener {
    Unix(UnixSocket),
    Tcp(TcpListener),
}

/// A bound Unix socket; its path is removed on drop if it is still the file we created.
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
    /// (device, inode) of the file we created; `None` for an inherited socket, whose file belongs to
    /// whoever bound it (systemd removes it when the socket unit stops, not when we do).
    identity: Option<(u64, u64)>,
}

/// A listening socket on its way to another runtime (see [`Listener::share`]).
pub enum SharedListener {
    Unix(std::os::unix::net::UnixListener, PathBuf),
    Tcp(std::net::TcpListener),
}

impl SharedListener {
    /// The listener, registered with the runtime this is called on.
    pub fn into_listener(self) -> io::Result<Listener> {
        Ok(match self {
            SharedListener::Unix(l, path) => Listener::Unix(UnixSocket {
                listener: UnixListener::from_std(l)?,
                path,
                identity: None,
            }),
            SharedListener::Tcp(l) => Listener::Tcp(TcpListener::from_std(l)?),
        })
    }
}

pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// Who the connection is from, for the per-peer cap: the address on TCP, the uid on Unix.
    pub fn peer_key(&self, peer: Option<Peer>) -> PeerKey {
        match self {
            Stream::Unix(_) => peer.map_or(PeerKey::Unknown, |p| PeerKey::Uid(p.uid)),
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or(PeerKey::Unknown, |a| PeerKey::ip(a.ip())),
        }
    }
}

impl Listener {
    pub async fn bind(addr: &ListenAddr, mode: u32) -> Result<Listener, BindError> {
        let io_err = |error| BindError::Io {
            addr: addr.to_string(),
            error,
        };
        match addr {
            ListenAddr::Tcp(a) => TcpListener::bind(a)
                .await
                .map(Listener::Tcp)
                .map_err(io_err),
            ListenAddr::Unix(path) => {
                clear_stale(path).await?;
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io_err)?;
                }
                let listener = UnixListener::bind(path).map_err(io_err)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                    .map_err(io_err)?;
                let meta = std::fs::metadata(path).map_err(io_err)?;
                Ok(Listener::Unix(UnixSocket {
                    listener,
                    path: path.clone(),
                    identity: Some((meta.dev(), meta.ino())),
                }))
            }
        }
    }

    /// A listening Unix socket someone else bound (systemd): its file is left alone, now and on drop.
    pub fn inherited_unix(listener: std::os::unix::net::UnixListener) -> io::Result<Listener> {
        listener.set_nonblocking(true)?;
        let path = unix_name(&listener.local_addr()?);
        Ok(Listener::Unix(UnixSocket {
            listener: UnixListener::from_std(listener)?,
            path,
            identity: None,
        }))
    }

    /// A listening TCP socket someone else bound (systemd).
    pub fn inherited_tcp(listener: std::net::TcpListener) -> io::Result<Listener> {
        listener.set_nonblocking(true)?;
        TcpListener::from_std(listener).map(Listener::Tcp)
    }

    /// The next connection, with the peer's kernel-reported credentials on Unix sockets.
    pub async fn accept(&self) -> io::Result<(Stream, Option<Peer>)> {
        match self {
            Listener::Unix(u) => {
                let (stream, _) = u.listener.accept().await?;
                let peer = stream.peer_cred().ok().map(|c| Peer {
                    uid: c.uid(),
                    gid: c.gid(),
                    pid: c.pid(),
                });
                Ok((Stream::Unix(stream), peer))
            }
            Listener::Tcp(t) => {
                let (stream, _) = t.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok((Stream::Tcp(stream), None))
            }
        }
    }

    /// The same socket, for another runtime to accept on too ([`SharedListener::into_listener`] on
    /// that runtime). Only this one removes the socket's file when dropped.
    pub fn share(&self) -> io::Result<SharedListener> {
        use std::os::fd::AsFd;
        Ok(match self {
            Listener::Unix(u) => SharedListener::Unix(
                u.listener.as_fd().try_clone_to_owned()?.into(),
                u.path.clone(),
            ),
            Listener::Tcp(t) => SharedListener::Tcp(t.as_fd().try_clone_to_owned()?.into()),
        })
    }

    /// The bound address, for logs (TCP shows the real port).
    pub fn describe(&self) -> String {
        match self {
            Listener::Unix(u) => format!("unix:{}", u.path.display()),
            Listener::Tcp(t) => t
                .local_addr()
                .map_or_else(|_| "tcp:?".into(), |a| format!("tcp:{a}")),
        }
    }
}

/// A Unix socket's address for logs: its path, `@name` in the abstract namespace, or `(unnamed)`.
fn unix_name(addr: &std::os::unix::net::SocketAddr) -> PathBuf {
    #[cfg(target_os = "linux")]
    {
        use std::os::linux::net::SocketAddrExt;
        if let Some(name) = addr.as_abstract_name() {
            return PathBuf::from(format!("@{}", String::from_utf8_lossy(name)));
        }
    }
    addr.as_pathname()
        .map_or_else(|| PathBuf::from("(unnamed)"), Path::to_path_buf)
}

/// Removes `path` only if it is a socket that nobody answers on.
async fn clear_stale(path: &Path) -> Result<(), BindError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(BindError::Io {
                addr: path.display().to_string(),
                error,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(BindError::NotASocket(path.to_owned()));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(BindError::InUse(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(|error| BindError::Io {
                addr: path.display().to_string(),
                error,
            })
        }
        Err(error) => Err(BindError::Io {
            addr: path.display().to_string(),
            error,
        }),
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        let Some(identity) = self.identity else {
            return;
        };
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == identity);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove socket");
            }
        }
    }
}
