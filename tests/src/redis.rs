//! A real Redis or Valkey server for the fleet tests: one per test, on a Unix socket in a temp dir of
//! its own, no persistence, killed when dropped. The test command installs Debian's `redis-server`
//! (Redis 7) when it is missing and fetches `valkey-server` (Valkey 8) with
//! `scripts/setup-valkey.sh`, whose path it passes as `VALKEY_SERVER`.
//!
//! [`on_each_store!`](crate::on_each_store) runs one scenario against both.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::gate::{Gate, RunningGate};
use crate::wait::{eventually, unique_dir};

/// Which server a test runs against: both speak the same protocol and run the same scripts, and
/// slotgate supports both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// `REDIS_SERVER`, else `redis-server` on `PATH`.
    Redis,
    /// `VALKEY_SERVER`, else `valkey-server` on `PATH`.
    Valkey,
}

impl Store {
    fn binary(self) -> String {
        let (var, default) = match self {
            Store::Redis => ("REDIS_SERVER", "redis-server"),
            Store::Valkey => ("VALKEY_SERVER", "valkey-server"),
        };
        std::env::var(var).unwrap_or_else(|_| default.into())
    }

    fn installer(self) -> &'static str {
        match self {
            Store::Redis => "scripts/test.sh installs Debian's redis-server",
            Store::Valkey => {
                "scripts/test.sh fetches it: `eval \"$(bash scripts/setup-valkey.sh)\"; export VALKEY_SERVER`"
            }
        }
    }
}

/// Runs the scenario `async fn $name(store: Store)` twice, as `$name::redis` and `$name::valkey`,
/// each on a multi-threaded runtime (several sidecars and their clients at once).
#[macro_export]
macro_rules! on_each_store {
    ($(#[$doc:meta])* async fn $name:ident($store:ident: Store) $body:block) => {
        $(#[$doc])*
        mod $name {
            #[allow(unused_imports, reason = "a test body may use nothing of its file")]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn redis() {
                scenario($crate::redis::Store::Redis).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn valkey() {
                scenario($crate::redis::Store::Valkey).await
            }

            async fn scenario($store: $crate::redis::Store) $body
        }
    };
}

pub struct RunningRedis {
    child: Child,
    store: Store,
    dir: PathBuf,
    socket: PathBuf,
    /// Extra server arguments (TLS), kept for a restart.
    extra: Vec<String>,
    tls: Option<Tls>,
}

/// A TLS port beside the Unix socket, with a certificate for `localhost` signed by a CA of the
/// test's own.
struct Tls {
    port: u16,
    ca: PathBuf,
}

fn spawn(store: Store, dir: &std::path::Path, socket: &std::path::Path, extra: &[String]) -> Child {
    let bin = store.binary();
    Command::new(&bin)
        .args(extra)
        .args(["--port", "0", "--unixsocket"])
        .arg(socket)
        .args([
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin} ({e}): {}", store.installer()))
}

impl RunningRedis {
    /// Starts redis-server (`REDIS_SERVER` or the one on `PATH`) and waits until it answers on its
    /// socket.
    pub fn start() -> RunningRedis {
        RunningRedis::start_on(Store::Redis)
    }

    /// Starts `store`'s server and waits until it answers on its socket.
    pub fn start_on(store: Store) -> RunningRedis {
        let dir = unique_dir("redis");
        let socket = dir.join("redis.sock");
        let child = spawn(store, &dir, &socket, &[]);
        let redis = RunningRedis {
            child,
            store,
            dir,
            socket,
            extra: Vec::new(),
            tls: None,
        };
        redis.wait_answers();
        redis
    }

    /// A Redis that also serves TLS on a local port ([`RunningRedis::tls_url`]), with a certificate
    /// for `localhost` signed by a fresh CA ([`RunningRedis::ca_file`]). Certificates are made with
    /// the `openssl` command.
    pub fn start_tls() -> RunningRedis {
        let dir = unique_dir("redis");
        let socket = dir.join("redis.sock");
        let ca = make_certificates(&dir);
        let port = crate::gate::free_port();
        let path = |name: &str| dir.join(name).display().to_string();
        let extra: Vec<String> = vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path("server.pem"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.pem"),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        let child = spawn(Store::Redis, &dir, &socket, &extra);
        let redis = RunningRedis {
            child,
            store: Store::Redis,
            dir,
            socket,
            extra,
            tls: Some(Tls { port, ca }),
        };
        redis.wait_answers();
        redis
    }

    /// `rediss://localhost:PORT/` of a [`RunningRedis::start_tls`] server.
    pub fn tls_url(&self) -> String {
        let tls = self.tls.as_ref().expect("started with start_tls");
        format!("rediss://localhost:{}/", tls.port)
    }

    /// The PEM file of the CA that signed the server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.tls
            .as_ref()
            .expect("started with start_tls")
            .ca
            .clone()
    }

    /// Which server this is.
    pub fn store(&self) -> Store {
        self.store
    }

    fn wait_answers(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "{:?} never answered on {}",
                self.store,
                self.socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: gone at once, with everything it held.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }

    /// A fresh redis-server on the same socket (after [`RunningRedis::kill9`]): empty.
    pub fn restart(&mut self) {
        self.child = spawn(self.store, &self.dir, &self.socket, &self.extra);
        self.wait_answers();
    }

    /// SIGSTOP: connections stay open and nothing answers.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Commands the server has run so far (`INFO commandstats`, `INFO` itself not counted).
    pub fn commands(&self) -> u64 {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket).expect("connect");
        s.write_all(b"INFO commandstats\r\n").expect("write");
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut text = String::new();
        let mut buf = [0u8; 8192];
        // A bulk string: `$<len>\r\n<body>\r\n`; read until the body is whole.
        loop {
            let n = s.read(&mut buf).expect("read");
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            if let Some((head, body)) = text.split_once("\r\n") {
                let len: usize = head.trim_start_matches('$').parse().unwrap_or(0);
                if body.len() >= len || n == 0 {
                    break;
                }
            }
        }
        text.lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// `gate` with its policy budgets on this store (`--state-backend redis`).
    pub fn backend_for(&self, gate: Gate) -> Gate {
        gate.opt("--state-backend", "redis")
            .opt("--state-redis-url", self.url())
    }

    /// The URL slotgate and the `redis` crate take.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(&self.socket) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
    }
}

impl Drop for RunningRedis {
    fn drop(&mut self) {
        self.signal_quietly();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RunningRedis {
    /// A paused server must be resumed before it can be killed and reaped.
    fn signal_quietly(&self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status();
    }
}

/// A CA and a server certificate for `localhost` and 127.0.0.1 in `dir`: `ca.pem`, `server.pem`,
/// `server.key`. Returns the CA's path.
pub fn make_certificates(dir: &std::path::Path) -> PathBuf {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run openssl ({e}): the TLS tests make certificates with it")
            });
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=slotgate test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("write san.ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    dir.join("ca.pem")
}

/// Whether `gate` reaches its state store now (`/status`).
pub async fn connected(gate: &RunningGate) -> bool {
    gate.status().await["state"]["connected"] == true
}

/// Waits until `gate` reaches its state store.
pub async fn wait_connected(gate: &RunningGate) {
    eventually(
        Duration::from_secs(10),
        "the sidecar reached the store",
        || async { connected(gate).await.then_some(()) },
    )
    .await;
}
