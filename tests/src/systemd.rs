//! systemd's side of a deployment, for the tests: a notification socket that collects `READY=1`,
//! `WATCHDOG=1` and `STOPPING=1`; listening sockets handed to slotgate as systemd hands them
//! (`LISTEN_FDS`, from fd 3); and the example units made checkable by `systemd-analyze verify`.
//!
//! ```ignore
//! let mut socks = PassedSockets::new();
//! socks.unix(&path, "clients", 0o640);
//! let admin = socks.tcp("admin");
//! let gate = socks.start(Gate::new().upstream(&up).listen_unix(&path).admin_tcp(admin)).await;
//! ```

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use rustix::io::FdFlags;
use tokio::net::UnixDatagram;

use crate::gate::{binary_path, Exited, Gate, RunningGate};
use crate::wait::unique_dir;

/// `O_NONBLOCK` and `O_CLOEXEC` as `/proc/PID/fdinfo/FD` shows them (octal `flags:`).
pub const O_NONBLOCK: u32 = 0o4000;
pub const O_CLOEXEC: u32 = 0o2000000;

/// Handed-over descriptors are numbered from here in the test process, well above what a test
/// opens, so moving them to 3, 4, ... in the child never overwrites one not yet moved.
const HAND_OVER_FROM: i32 = 100;

/// Children inherit every descriptor that is not close-on-exec, and handing sockets over clears that
/// flag for a moment: a hand-over holds this for writing, and every other start of slotgate through
/// [`Gate`] holds it for reading while it spawns, or a child started by another test of the same
/// binary at that moment would keep the sockets open.
pub(crate) static SPAWN: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Held while spawning a process that outlives the call (a socket-activated slotgate, a container)
/// other than through [`Gate`]: no sockets are being handed over meanwhile (see [`SPAWN`]).
pub async fn spawning() -> tokio::sync::RwLockReadGuard<'static, ()> {
    SPAWN.read().await
}

/// Starts `gate` while no sockets are being handed over (see [`SPAWN`]; every [`Gate::start`] does).
pub async fn start_exclusive(gate: Gate) -> RunningGate {
    gate.start().await
}

/// Panics with a clear message if `program` is not installed.
pub fn require(program: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()));
    assert!(
        found,
        "`{program}` is not on PATH: the systemd deployment tests need it (Debian/Ubuntu: the \
         `systemd` package)"
    );
}

/// Listening sockets the test binds and passes to slotgate as fds 3, 4, ... with `LISTEN_PID`,
/// `LISTEN_FDS` and (unless [`PassedSockets::unnamed`]) `LISTEN_FDNAMES`, as systemd does. The test
/// keeps its own copies, as systemd keeps its copies across restarts of the service.
#[derive(Default)]
pub struct PassedSockets {
    socks: Vec<(OwnedFd, String)>,
    unnamed: bool,
}

impl PassedSockets {
    pub fn new() -> Self {
        Self::default()
    }

    /// A Unix listening socket at `path`, with file mode `mode`.
    pub fn unix(&mut self, path: &Path, name: &str, mode: u32) {
        let l = std::os::unix::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        self.add(l, name);
    }

    /// A TCP listening socket on a free port of 127.0.0.1 (bound here: no race for the port).
    pub fn tcp(&mut self, name: &str) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = l.local_addr().expect("local addr");
        self.add(l, name);
        addr
    }

    /// Any descriptor, e.g. one slotgate must refuse.
    pub fn add(&mut self, fd: impl Into<OwnedFd>, name: &str) {
        self.socks.push((fd.into(), name.to_owned()));
    }

    /// Do not set `LISTEN_FDNAMES`.
    pub fn unnamed(&mut self) {
        self.unnamed = true;
    }

    /// Starts `gate` with the sockets handed over.
    pub async fn start(&self, gate: Gate) -> RunningGate {
        let _spawning = SPAWN.write().await;
        // This process's inheritable copies close on return; the child has its own.
        let handed = self.hand_over();
        gate.wrap(self.wrapper(&handed))
            .handing_over()
            .start()
            .await
    }

    /// Runs `gate` with the sockets handed over, expecting it to exit by itself.
    pub async fn run_to_exit(&self, gate: Gate, timeout: Duration) -> Exited {
        let _spawning = SPAWN.write().await;
        let handed = self.hand_over();
        gate.wrap(self.wrapper(&handed))
            .handing_over()
            .run_to_exit(timeout)
            .await
    }

    /// Inheritable duplicates of the sockets, numbered from [`HAND_OVER_FROM`].
    fn hand_over(&self) -> Vec<OwnedFd> {
        self.socks
            .iter()
            .map(|(fd, _)| {
                let dup = rustix::io::fcntl_dupfd_cloexec(fd, HAND_OVER_FROM).expect("dup");
                rustix::io::fcntl_setfd(&dup, FdFlags::empty()).expect("clear close-on-exec");
                dup
            })
            .collect()
    }

    /// `bash -c` moving the duplicates to 3, 4, ... and exec'ing slotgate with the variables set;
    /// `$$` is the shell's pid, which the exec keeps: slotgate's `LISTEN_PID`.
    fn wrapper(&self, handed: &[OwnedFd]) -> Vec<String> {
        require("bash");
        let mut script = String::new();
        for (i, fd) in handed.iter().enumerate() {
            let from = fd.as_raw_fd();
            script += &format!("exec {}<&{from} {from}<&-; ", 3 + i);
        }
        script += &format!("export LISTEN_PID=$$ LISTEN_FDS={}; ", handed.len());
        if !self.unnamed {
            let names: Vec<&str> = self.socks.iter().map(|(_, n)| n.as_str()).collect();
            script += &format!("export LISTEN_FDNAMES='{}'; ", names.join(":"));
        }
        script += "exec \"$@\"";
        vec!["bash".into(), "-c".into(), script, "slotgate-fds".into()]
    }
}

/// `systemd-socket-activate` listening on each `(address, name)` (a path or `HOST:PORT`), as a
/// `Gate::wrap` argv; it passes on only the variables named in `pass_env`. It execs slotgate when
/// the first connection arrives (systemd 252 has no `--now`), which the harness's `/livez` poll of
/// an inherited admin socket provides.
pub fn socket_activate(listen: &[(String, &str)], pass_env: &[&str]) -> Vec<String> {
    require("systemd-socket-activate");
    let mut argv = vec!["systemd-socket-activate".to_owned()];
    for (addr, _) in listen {
        argv.push("-l".into());
        argv.push(addr.clone());
    }
    let names: Vec<&str> = listen.iter().map(|(_, n)| *n).collect();
    argv.push(format!("--fdname={}", names.join(":")));
    for var in pass_env {
        argv.push("-E".into());
        argv.push((*var).to_owned());
    }
    argv
}

/// The `flags:` of descriptor `fd` of process `pid` (octal in `/proc/PID/fdinfo/FD`).
pub fn fd_flags(pid: u32, fd: i32) -> u32 {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
        .unwrap_or_else(|e| panic!("fdinfo of fd {fd} of {pid}: {e}"));
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .unwrap_or_else(|| panic!("no flags in fdinfo: {info}"));
    u32::from_str_radix(flags.trim(), 8).expect("octal flags")
}

/// What descriptor `fd` of process `pid` is (`socket:[inode]` for a socket).
pub fn fd_target(pid: u32, fd: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| panic!("fd {fd} of {pid}: {e}"))
}

/// A Unix datagram socket standing in for systemd's `$NOTIFY_SOCKET`.
pub struct NotifySocket {
    sock: UnixDatagram,
    path: PathBuf,
    dir: PathBuf,
}

impl NotifySocket {
    pub fn bind() -> Self {
        let dir = unique_dir("notify");
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket { sock, path, dir }
    }

    /// The value for `NOTIFY_SOCKET`.
    pub fn path(&self) -> &str {
        self.path.to_str().expect("UTF-8 temp path")
    }

    /// The next message, if one arrives within `timeout`.
    pub async fn recv(&self, timeout: Duration) -> Option<String> {
        let mut buf = vec![0u8; 4096];
        match tokio::time::timeout(timeout, self.sock.recv(&mut buf)).await {
            Ok(Ok(n)) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Ok(Err(e)) => panic!("reading the notify socket: {e}"),
            Err(_) => None,
        }
    }

    /// Reads until a message has the line `line` (`READY=1`); returns it and the messages before it.
    pub async fn wait_for(&self, line: &str, timeout: Duration) -> (String, Vec<String>) {
        let deadline = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left).await {
                Some(m) if has_line(&m, line) => return (m, before),
                Some(m) => before.push(m),
                None => panic!("no `{line}` within {timeout:?}; received: {before:?}"),
            }
        }
    }

    /// Every message that arrives within `period`.
    pub async fn collect(&self, period: Duration) -> Vec<String> {
        let deadline = Instant::now() + period;
        let mut got = Vec::new();
        while let Some(m) = self
            .recv(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            got.push(m);
        }
        got
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the notification `msg` has the line `line`.
pub fn has_line(msg: &str, line: &str) -> bool {
    msg.lines().any(|l| l == line)
}

/// The value of `KEY=` in the notification `msg`.
pub fn field<'a>(msg: &'a str, key: &str) -> Option<&'a str> {
    msg.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// `examples/systemd` of this workspace.
pub fn examples_dir() -> PathBuf {
    crate::workspace().join("examples/systemd")
}

/// The example units (`*.service`, `*.socket`) copied into `dir`, each program of an `Exec*=` line
/// that is not installed here replaced by one that is: `systemd-analyze verify` fails a unit whose
/// program is missing. `/usr/local/bin/slotgate` becomes the built binary; other missing programs
/// (llama-server) become `/bin/true`. Returns the copies.
pub fn units_for_verify(dir: &Path) -> Vec<PathBuf> {
    let mut units = Vec::new();
    let entries = std::fs::read_dir(examples_dir()).expect("examples/systemd");
    for entry in entries {
        let path = entry.expect("dir entry").path();
        let is_unit = path
            .extension()
            .is_some_and(|e| e == "service" || e == "socket");
        if !is_unit {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read unit");
        let rewritten: Vec<String> = text.lines().map(rewrite_exec).collect();
        let copy = dir.join(path.file_name().expect("file name"));
        std::fs::write(&copy, rewritten.join("\n") + "\n").expect("write unit copy");
        units.push(copy);
    }
    units.sort();
    units
}

fn rewrite_exec(line: &str) -> String {
    let Some((key, value)) = line.split_once('=') else {
        return line.to_owned();
    };
    if !key.starts_with("Exec") {
        return line.to_owned();
    }
    // systemd's prefixes (`-`, `@`, `+`, `!`, `:`) stay in front of the program.
    let cmd = value.trim_start_matches(['-', '@', '+', '!', ':']);
    let prefix = &value[..value.len() - cmd.len()];
    let (program, rest) = cmd.split_once(' ').unwrap_or((cmd, ""));
    if Path::new(program).exists() {
        return line.to_owned();
    }
    let stand_in = if program.ends_with("/slotgate") {
        binary_path().display().to_string()
    } else {
        "/bin/true".to_owned()
    };
    format!("{key}={prefix}{stand_in} {rest}")
}

/// `systemd-analyze verify` on `units`.
pub fn verify(units: &[PathBuf]) -> Output {
    require("systemd-analyze");
    std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(units)
        .output()
        .expect("run systemd-analyze verify")
}
