//! `slotgate wrap -- llama-server ...`: llama-server as slotgate's child, on a private Unix socket
//! slotgate chooses, its output passed through line by line with a prefix, restarted with backoff
//! when it dies (requests meanwhile wait as during a model load) until it has failed
//! `--wrap-start-limit` starts in a row, and stopped only after slotgate has drained.
//!
//! A `--host` or `--port` in the command says where its clients reach it: slotgate listens there
//! instead (unless `--listen` is set) and the child gets its private socket. A `--host` without a
//! `--port` means the child's own default port, read from its `--help` (8080 until llama.cpp
//! moves it to 9931).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{ListenAddr, UpstreamAddr};
use crate::metrics as m;

/// First wait before a restart; doubled after each quick death, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A child that ran this long before dying is restarted after [`FIRST_BACKOFF`] again.
const STABLE_RUN: Duration = Duration::from_secs(60);
/// After SIGTERM, how long the child may take to exit before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum WrapError {
    #[error("wrap needs the llama-server command after `--`, e.g. `slotgate wrap -- llama-server -m model.gguf -np 2`")]
    NoCommand,
    #[error("`{0}` in the wrapped command needs a value")]
    NoValue(String),
    #[error("`--port {0}` in the wrapped command is not a port")]
    BadPort(String),
    #[error("cannot create the private socket directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("cannot start `{0}`: {1}")]
    Spawn(String, std::io::Error),
    #[error("the wrapped llama-server failed {0} starts in a row (--wrap-start-limit); giving up. Its last lines:\n{1}")]
    GaveUp(u32, String),
}

/// Lines of the child's output kept to show when slotgate gives up on it.
const LAST_LINES: usize = 20;

/// The child's latest output lines (both streams), oldest first.
type Tail = std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>;

/// The wrapped command and where it will listen.
#[derive(Debug)]
pub struct Wrap {
    argv: Vec<String>,
    /// Where the command's `--host`/`--port` said its clients reach it.
    clients: Option<Vec<ListenAddr>>,
    dir: PathBuf,
    socket: PathBuf,
    tail: Tail,
}

impl Wrap {
    /// Checks the command and makes the private directory (mode 0700) for its socket, under
    /// `$XDG_RUNTIME_DIR` when set, else the temp dir.
    pub fn prepare(argv: Vec<String>) -> Result<Wrap, WrapError> {
        if argv.is_empty() {
            return Err(WrapError::NoCommand);
        }
        let (argv, host, port) = take_address(argv)?;
        let clients = match (host, port) {
            (None, None) => None,
            (host, port) => {
                let port = match port {
                    Some(p) => p,
                    None => default_port(&argv[0]),
                };
                Some(listen_addrs(host.as_deref().unwrap_or("127.0.0.1"), port))
            }
        };
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "slotgate-wrap-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| WrapError::Dir(dir.clone(), e))?;
        let socket = dir.join("llama.sock");
        Ok(Wrap {
            argv,
            clients,
            dir,
            socket,
            tail: Tail::default(),
        })
    }

    /// Where slotgate forwards to: the child's socket.
    pub fn upstream(&self) -> UpstreamAddr {
        UpstreamAddr::Unix(self.socket.clone())
    }

    /// Where slotgate listens unless `--listen` says otherwise: where the command's own `--host` and
    /// `--port` said its clients reach it.
    pub fn clients(&self) -> Option<&[ListenAddr]> {
        self.clients.as_deref()
    }

    /// The child's command line as llama-server will read it (it inherits slotgate's environment).
    pub fn launch(&self) -> crate::config::launch::Launch {
        crate::config::launch::Launch::parse(&self.argv, |k| std::env::var(k).ok())
    }

    /// Starts the child (failing at once if it cannot be started at all) and supervises it until
    /// `stop` turns true; then stops it (SIGTERM, SIGKILL after [`STOP_GRACE`]) and removes the
    /// private directory. After `start_limit` failed starts in a row (0: never) the task ends with
    /// [`WrapError::GaveUp`].
    pub fn start(
        self,
        stop: watch::Receiver<bool>,
        start_limit: u32,
    ) -> Result<JoinHandle<Result<(), WrapError>>, WrapError> {
        match self.spawn() {
            Ok(child) => Ok(tokio::spawn(self.supervise(child, stop, start_limit))),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&self.dir);
                Err(e)
            }
        }
    }

    /// The program's file name: the prefix of its output lines.
    fn name(&self) -> String {
        Path::new(&self.argv[0]).file_name().map_or_else(
            || self.argv[0].clone(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    fn spawn(&self) -> Result<Child, WrapError> {
        // A socket file left by a child that died would make the next bind fail.
        let _ = std::fs::remove_file(&self.socket);
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .arg("--host")
            .arg(&self.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C at the terminal reaches slotgate only, which drains
            // before it stops the child.
            .process_group(0)
            .kill_on_drop(true);
        die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| WrapError::Spawn(self.argv[0].clone(), e))?;
        let name = self.name();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(pass_through(out, name.clone(), self.tail.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(pass_through(err, name, self.tail.clone()));
        }
        tracing::info!(pid = child.id(), command = %self.argv.join(" "), socket = %self.socket.display(), "started the wrapped llama-server");
        Ok(child)
    }

    async fn supervise(
        self,
        child: Child,
        mut stop: watch::Receiver<bool>,
        start_limit: u32,
    ) -> Result<(), WrapError> {
        let mut backoff = FIRST_BACKOFF;
        // Starts in a row that ended within STABLE_RUN, or never started.
        let mut failed: u32 = 0;
        let mut started = Instant::now();
        // `None`: the last restart could not even start the program; it is tried again after the
        // next backoff.
        let mut child = Some(child);
        loop {
            let status = match child.as_mut() {
                Some(c) => tokio::select! {
                    status = c.wait() => describe(status),
                    _ = stopped(&mut stop) => {
                        stop_child(c).await;
                        break;
                    }
                },
                None => "not started".to_owned(),
            };
            let ran = started.elapsed();
            if ran >= STABLE_RUN {
                backoff = FIRST_BACKOFF;
                failed = 0;
            } else {
                failed += 1;
            }
            if start_limit > 0 && failed >= start_limit {
                // Let the last lines of its output arrive.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let tail = self
                    .tail
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let lines = tail.iter().cloned().collect::<Vec<_>>().join("\n");
                drop(tail);
                let _ = std::fs::remove_dir_all(&self.dir);
                return Err(WrapError::GaveUp(failed, lines));
            }
            metrics::counter!(m::CHILD_RESTARTS_TOTAL).increment(1);
            tracing::warn!(%status, ran = ?ran, restart_in = ?backoff, "the wrapped llama-server exited; requests wait for it as during a model load");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped(&mut stop) => break,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            started = Instant::now();
            child = self.spawn().map_err(|e| tracing::error!("{e}")).ok();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// llama-server's port before it moves to 9931, when its `--help` does not say.
const LLAMA_DEFAULT_PORT: u16 = 8080;

/// `argv` without its `--host` and `--port` (each `--x V` or `--x=V`), and their values.
type Address = (Vec<String>, Option<String>, Option<u16>);

fn take_address(argv: Vec<String>) -> Result<Address, WrapError> {
    let (mut kept, mut host, mut port) = (Vec::with_capacity(argv.len()), None, None);
    let mut args = argv.into_iter();
    kept.extend(args.next());
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        if name != "--host" && name != "--port" {
            kept.push(arg);
            continue;
        }
        let value = inline
            .or_else(|| args.next())
            .ok_or_else(|| WrapError::NoValue(name.clone()))?;
        match name.as_str() {
            "--host" => host = Some(value),
            _ => port = Some(value.parse().map_err(|_| WrapError::BadPort(value))?),
        }
    }
    Ok((kept, host, port))
}

/// The addresses llama-server's `--host` names (comma-separated; a name ending in `.sock` is a Unix
/// socket; `localhost` is 127.0.0.1) on `port`.
fn listen_addrs(host: &str, port: u16) -> Vec<ListenAddr> {
    host.split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| match h {
            h if h.ends_with(".sock") => ListenAddr::Unix(h.into()),
            "localhost" => ListenAddr::Tcp(([127, 0, 0, 1], port).into()),
            h => match h.parse::<std::net::IpAddr>() {
                Ok(ip) => ListenAddr::Tcp((ip, port).into()),
                // Not an address slotgate can bind: `--listen` will say so.
                Err(_) => ListenAddr::Tcp(([127, 0, 0, 1], port).into()),
            },
        })
        .collect()
}

/// The port `program` listens on without `--port`, as its `--help` prints it (`port to listen
/// (default: N)`), else [`LLAMA_DEFAULT_PORT`].
fn default_port(program: &str) -> u16 {
    let help = std::process::Command::new(program)
        .arg("--help")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let text = help.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    text.ok()
        .and_then(|t| help_default_port(&t))
        .unwrap_or(LLAMA_DEFAULT_PORT)
}

fn help_default_port(help: &str) -> Option<u16> {
    let at = help.find("port to listen (default: ")? + "port to listen (default: ".len();
    let rest = &help[at..];
    rest[..rest.find(')')?].trim().parse().ok()
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`].
async fn stop_child(child: &mut Child) {
    let Some(pid) = child.id() else {
        return; // already reaped
    };
    tracing::info!(pid, "stopping the wrapped llama-server");
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(status) => {
            tracing::info!(status = %describe(status), "the wrapped llama-server stopped")
        }
        Err(_) => {
            tracing::warn!(pid, grace = ?STOP_GRACE, "the wrapped llama-server ignored SIGTERM; killing it");
            let _ = child.kill().await;
        }
    }
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("unknown ({e})"),
    }
}

/// Copies `reader`'s lines to slotgate's stderr as `<name>| <line>`, whole lines through slotgate's
/// own log sink so they do not interleave with its log lines.
async fn pass_through(reader: impl AsyncRead + Unpin, name: String, tail: Tail) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        crate::log::line(format!("{name}| {line}\n").as_bytes());
        let mut tail = tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if tail.len() == LAST_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

/// The child gets SIGKILL if slotgate itself dies (even by SIGKILL), so no llama-server is left
/// holding the GPU and the socket.
#[allow(
    unsafe_code,
    reason = "pre_exec runs in the forked child: unsafe by contract"
)]
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only makes one prctl call, which
    // is async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_address_becomes_slotgates() {
        assert!(matches!(Wrap::prepare(vec![]), Err(WrapError::NoCommand)));
        let argv = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let w = Wrap::prepare(argv("llama-server -m m.gguf --port 9931 -np 2")).unwrap();
        assert_eq!(w.argv, argv("llama-server -m m.gguf -np 2"));
        assert_eq!(
            w.clients().unwrap(),
            [ListenAddr::Tcp("127.0.0.1:9931".parse().unwrap())]
        );
        std::fs::remove_dir_all(&w.dir).unwrap();
        let w = Wrap::prepare(argv("llama-server --host=127.0.0.1,::1 --port=8081")).unwrap();
        assert_eq!(w.argv, argv("llama-server"));
        assert_eq!(
            w.clients().unwrap(),
            [
                ListenAddr::Tcp("127.0.0.1:8081".parse().unwrap()),
                ListenAddr::Tcp("[::1]:8081".parse().unwrap())
            ]
        );
        std::fs::remove_dir_all(&w.dir).unwrap();
        let w = Wrap::prepare(argv("llama-server -m m")).unwrap();
        assert!(w.clients().is_none());
        std::fs::remove_dir_all(&w.dir).unwrap();
        assert!(matches!(
            Wrap::prepare(argv("llama-server --port")),
            Err(WrapError::NoValue(_))
        ));
        assert!(matches!(
            Wrap::prepare(argv("llama-server --port x")),
            Err(WrapError::BadPort(_))
        ));
    }

    #[test]
    fn the_default_port_is_read_from_the_help() {
        let help = "--port PORT                             port to listen (default: 9931)\n";
        assert_eq!(help_default_port(help), Some(9931));
        assert_eq!(help_default_port("nothing"), None);
        // A program that prints no help: llama-server's default before the move.
        assert_eq!(
            default_port("/nonexistent/llama-server"),
            LLAMA_DEFAULT_PORT
        );
    }

    #[test]
    fn the_socket_is_in_a_private_directory() {
        use std::os::unix::fs::PermissionsExt;
        let w = Wrap::prepare(vec!["llama-server".into()]).unwrap();
        let UpstreamAddr::Unix(socket) = w.upstream() else {
            panic!("a Unix socket");
        };
        let dir = socket.parent().unwrap();
        let mode = std::fs::metadata(dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
