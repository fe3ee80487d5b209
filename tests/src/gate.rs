//! Launches the real `slotgate` binary as a child process on fresh sockets and talks to its admin listener.
//!
//! ```ignore
//! let up = FakeUpstream::instant().start().await;
//! let gate = Gate::new().upstream(&up).slots(1).queue_depth(8).start().await;
//! let resp = gate.client().post_json("/v1/chat/completions", &json!({})).await;
//! gate.assert_idle().await;
//!
//! // The same opening in one step, with a one-slot preset:
//! let (up, gate) = Gate::one_slot(8).start_instant().await;
//! ```

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::client::{get_request as get, Client, Response};
use crate::fake_upstream::{FakeUpstream, RunningUpstream};
use crate::metrics::Metrics;
use crate::request::{spawn_post, Req, CHAT};
use crate::wait::unique_dir;

/// How long `start` waits for `/livez`.
const LIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `start` waits for `/readyz` when the upstream is expected to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// The `slotgate` binary: `$SLOTGATE_BIN`, else `debug/slotgate` in `$CARGO_TARGET_DIR` or the
/// workspace's `target/`.
pub fn binary_path() -> PathBuf {
    let path = match std::env::var_os("SLOTGATE_BIN") {
        Some(p) => PathBuf::from(p),
        None => crate::target_dir().join("debug/slotgate"),
    };
    assert!(
        path.exists(),
        "slotgate binary not found at {}: run `cargo build -p slotgate` first (or set SLOTGATE_BIN)",
        path.display()
    );
    path
}

/// A `std::process::Command` for the binary with a clean `SLOTGATE_*` environment (for `check` tests).
pub fn command() -> std::process::Command {
    let mut cmd = std::process::Command::new(binary_path());
    for k in inherited_settings() {
        cmd.env_remove(k);
    }
    cmd
}

/// Runs the binary with `args` (as [`command`]) to its end: `slotgate check ...`, `slotgate policy ...`.
pub fn run(args: &[&str]) -> std::process::Output {
    command().args(args).output().expect("run slotgate")
}

/// Its stdout and stderr together, asserting that it succeeded.
pub fn succeeded(o: &std::process::Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    text
}

/// Variables of this process that would configure the child behind the test's back.
fn inherited_settings() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("SLOTGATE_") || k == "RUST_LOG")
        .collect()
}

/// Whether `program` is on `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// `sha256:<hex>` of an API key, as `slotgate hash-key` prints it: the tenant of a request that sends
/// this key and names no other through a policy.
pub fn hash_key(key: &str) -> String {
    let out = command()
        .args(["hash-key", key])
        .output()
        .expect("run slotgate hash-key");
    assert!(
        out.status.success(),
        "slotgate hash-key failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("hash-key prints UTF-8")
        .trim()
        .to_owned()
}

/// A free TCP port on 127.0.0.1 (bound then released; a small race is accepted).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

#[derive(Clone, Debug)]
enum Admin {
    Tcp,
    Unix,
    /// A fixed address (e.g. a socket the test binds and hands over itself).
    TcpAt(SocketAddr),
}

/// Builder for a slotgate child process.
#[derive(Clone, Debug)]
pub struct Gate {
    upstream: Option<String>,
    listen: Vec<String>,
    admin: Admin,
    opts: Vec<(String, Option<String>)>,
    env: Vec<(String, String)>,
    wait_ready: bool,
    /// A program (and its arguments) that execs slotgate, e.g. to set resource limits.
    wrapper: Vec<String>,
    /// `slotgate wrap -- <this>` instead of `slotgate run`.
    wrapped: Vec<String>,
    /// The upstream is the fake, which gives each slot a context of its own.
    fake: bool,
    /// Started by [`crate::systemd::PassedSockets`], which holds [`crate::systemd::SPAWN`] already.
    handing_over: bool,
    /// `--admin-token-file` holding this token; the admin client sends it.
    admin_token: Option<String>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// Defaults: a Unix listen socket in a temp dir, a TCP admin port, `--health-interval 100ms` (so tests
    /// need not wait a whole second for readiness), and `start` waits for `/readyz`.
    pub fn new() -> Self {
        Self {
            upstream: None,
            listen: Vec::new(),
            admin: Admin::Tcp,
            opts: vec![("--health-interval".into(), Some("100ms".into()))],
            env: Vec::new(),
            wait_ready: true,
            wrapper: Vec::new(),
            wrapped: Vec::new(),
            fake: false,
            handing_over: false,
            admin_token: None,
        }
    }

    /// Runs with `--admin-token-file` (a file in the gate's directory holding `token` and a
    /// newline); the gate's admin client sends it as `Authorization: Bearer`.
    pub fn admin_token(mut self, token: &str) -> Self {
        self.admin_token = Some(token.to_owned());
        self
    }

    /// This start hands sockets over and holds [`crate::systemd::SPAWN`] for writing itself.
    pub(crate) fn handing_over(mut self) -> Self {
        self.handing_over = true;
        self
    }

    /// Waits until no sockets are being handed over to another child (see [`crate::systemd::SPAWN`]),
    /// unless this start is the one handing them over.
    async fn spawning(&self) -> Option<tokio::sync::RwLockReadGuard<'static, ()>> {
        match self.handing_over {
            true => None,
            false => Some(crate::systemd::SPAWN.read().await),
        }
    }

    /// One slot and room for `queue_depth` waiters: a one-GPU llama-server, the shape most scenarios need.
    pub fn one_slot(queue_depth: usize) -> Self {
        Self::new().slots(1).queue_depth(queue_depth)
    }

    /// Sets (or replaces) `--name value`.
    pub fn opt(mut self, name: &str, value: impl ToString) -> Self {
        self.opts.retain(|(n, _)| n != name);
        self.opts.push((name.to_owned(), Some(value.to_string())));
        self
    }

    /// Appends a bare argument such as `--trust-client-priority`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.opts.push((arg.to_owned(), None));
        self
    }

    /// Loads `policies` in chain order from a config file (`--config`): each a module and, if any,
    /// its settings as inline TOML.
    pub fn policies(self, policies: &[(&Path, Option<&str>)]) -> Self {
        let config = crate::wat::config(&unique_dir("policies"), policies);
        self.opt("--config", config.display())
    }

    /// Runs with `--config path`.
    pub fn config_file(self, path: impl AsRef<Path>) -> Self {
        self.opt("--config", path.as_ref().display())
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The fake upstream: like llama-server run with `-np N`, each slot has a context of its own,
    /// so slotgate is told `--kv-pool per-slot` (its command line is not llama-server's to read)
    /// unless the test sets `--kv-pool` itself.
    pub fn upstream(mut self, up: &RunningUpstream) -> Self {
        self.upstream = Some(up.url());
        self.fake = true;
        self
    }

    /// Points `--upstream` at a Unix socket path that may not exist yet.
    pub fn upstream_path(mut self, path: impl AsRef<Path>) -> Self {
        self.upstream = Some(format!("unix:{}", path.as_ref().display()));
        self
    }

    pub fn upstream_url(mut self, url: impl Into<String>) -> Self {
        self.upstream = Some(url.into());
        self
    }

    /// Adds a `--listen` address (`unix:PATH` or `tcp:HOST:PORT`); the default Unix socket is then not used.
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen.push(addr.into());
        self
    }

    pub fn listen_unix(self, path: impl AsRef<Path>) -> Self {
        let addr = format!("unix:{}", path.as_ref().display());
        self.listen(addr)
    }

    /// Serve the admin endpoints on a Unix socket instead of a TCP port.
    pub fn admin_unix(mut self) -> Self {
        self.admin = Admin::Unix;
        self
    }

    /// Serve the admin endpoints at `addr` (`--admin-listen tcp:ADDR`) instead of a free port.
    pub fn admin_tcp(mut self, addr: SocketAddr) -> Self {
        self.admin = Admin::TcpAt(addr);
        self
    }

    /// Do not wait for `/readyz` in `start` (upstream absent or loading on purpose).
    pub fn no_wait_ready(mut self) -> Self {
        self.wait_ready = false;
        self
    }

    pub fn slots(self, n: usize) -> Self {
        self.opt("--slots", n)
    }

    pub fn queue_depth(self, n: usize) -> Self {
        self.opt("--queue-depth", n)
    }

    pub fn queue_timeout(self, d: &str) -> Self {
        self.opt("--queue-timeout", d)
    }

    pub fn drain_timeout(self, d: &str) -> Self {
        self.opt("--drain-timeout", d)
    }

    pub fn max_body(self, size: &str) -> Self {
        self.opt("--max-body", size)
    }

    pub fn header_timeout(self, d: &str) -> Self {
        self.opt("--header-timeout", d)
    }

    pub fn body_timeout(self, d: &str) -> Self {
        self.opt("--body-timeout", d)
    }

    pub fn max_connections(self, n: usize) -> Self {
        self.opt("--max-connections", n)
    }

    pub fn socket_mode(self, mode: &str) -> Self {
        self.opt("--socket-mode", mode)
    }

    pub fn health_interval(self, d: &str) -> Self {
        self.opt("--health-interval", d)
    }

    pub fn trust_client_priority(self) -> Self {
        self.arg("--trust-client-priority")
    }

    /// Runs slotgate as the last argument of `argv`. The wrapper must `exec` it, so the pid (for signals)
    /// and the exit status stay slotgate's own.
    pub fn wrap<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.wrapper = argv.into_iter().map(Into::into).collect();
        self
    }

    /// Runs `slotgate wrap [options] -- <argv>`: slotgate starts `argv` (a llama-server command) as
    /// its child on a private socket and forwards to it (no `--upstream`).
    pub fn wrapping<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.wrapped = argv.into_iter().map(Into::into).collect();
        self
    }

    /// Runs slotgate with at most `n` open file descriptors: through `prlimit` where it exists, else
    /// through the shell's `ulimit`.
    pub fn open_files_limit(self, n: u32) -> Self {
        if on_path("prlimit") {
            self.wrap([
                "prlimit".to_owned(),
                format!("--nofile={n}:{n}"),
                "--".into(),
            ])
        } else {
            let script = format!("ulimit -n {n} && exec \"$@\"");
            self.wrap(["sh".to_owned(), "-c".into(), script, "sh".into()])
        }
    }

    fn build(&self, dir: &Path, admin_listen: &str) -> (Command, Vec<String>) {
        let listen = if self.listen.is_empty() {
            vec![format!("unix:{}", dir.join("slotgate.sock").display())]
        } else {
            self.listen.clone()
        };
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(binary_path());
                cmd
            }
            None => Command::new(binary_path()),
        };
        cmd.arg(if self.wrapped.is_empty() {
            "run"
        } else {
            "wrap"
        });
        for l in &listen {
            cmd.arg("--listen").arg(l);
        }
        cmd.arg("--admin-listen").arg(admin_listen);
        // Budgets kept on disk in the gate's own directory, unless the test names one.
        if !self.opts.iter().any(|(n, _)| n == "--state-dir") {
            cmd.arg("--state-dir").arg(dir.join("state"));
        }
        if let Some(token) = &self.admin_token {
            let file = dir.join("admin.token");
            std::fs::write(&file, format!("{token}\n")).expect("write the admin token file");
            cmd.arg("--admin-token-file").arg(file);
        }
        if let Some(up) = &self.upstream {
            cmd.arg("--upstream").arg(up);
        }
        for (name, value) in &self.opts {
            cmd.arg(name);
            if let Some(v) = value {
                cmd.arg(v);
            }
        }
        if self.fake && !self.opts.iter().any(|(n, _)| n == "--kv-pool") {
            cmd.arg("--kv-pool").arg("per-slot");
        }
        if !self.wrapped.is_empty() {
            cmd.arg("--").args(&self.wrapped);
        }
        for k in inherited_settings() {
            cmd.env_remove(k);
        }
        cmd.env("SLOTGATE_LOG", "info");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        (cmd, listen)
    }

    /// Starts `fake`, points this gate at it and starts the gate: the opening of most scenarios.
    pub async fn start_with(self, fake: FakeUpstream) -> (RunningUpstream, RunningGate) {
        let up = fake.start().await;
        let gate = self.upstream(&up).start().await;
        (up, gate)
    }

    /// [`Gate::start_with`] an instant fake upstream, one that answers at once: most scenarios' start.
    pub async fn start_instant(self) -> (RunningUpstream, RunningGate) {
        self.start_with(FakeUpstream::instant()).await
    }

    /// Points this gate at a real llama-server's socket and starts it.
    pub async fn start_before(self, llama: &crate::llama::RunningLlama) -> RunningGate {
        self.upstream_path(llama.socket()).start().await
    }

    /// Starts slotgate and waits until `/livez` answers 200 (and `/readyz` unless `no_wait_ready`).
    pub async fn start(self) -> RunningGate {
        let mut last_err = String::new();
        for _attempt in 0..3 {
            match self.try_start().await {
                Ok(gate) => return gate,
                // A raced admin port is the only failure worth another try.
                Err(e) if e.contains("in use") && matches!(self.admin, Admin::Tcp) => last_err = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last_err}")
    }

    async fn try_start(&self) -> Result<RunningGate, String> {
        let dir = unique_dir("gate");
        let (admin_listen, admin) = match self.admin {
            Admin::Tcp => {
                let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
                (format!("tcp:{addr}"), Client::tcp(addr))
            }
            Admin::Unix => {
                let p = dir.join("admin.sock");
                (format!("unix:{}", p.display()), Client::unix(&p))
            }
            Admin::TcpAt(addr) => (format!("tcp:{addr}"), Client::tcp(addr)),
        };
        let (mut cmd, listen) = self.build(&dir, &admin_listen);
        let admin = match &self.admin_token {
            Some(t) => admin.with_bearer(t),
            None => admin,
        };
        let stderr_path = dir.join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path).expect("create stderr log");
        let stdout = std::fs::File::create(dir.join("stdout.log")).expect("create stdout log");
        cmd.stderr(Stdio::from(stderr)).stdout(Stdio::from(stdout));
        let spawning = self.spawning().await;
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn slotgate: {e}"));
        drop(spawning);
        let mut gate = RunningGate {
            pid: child.id().unwrap_or(0),
            child,
            dir,
            listen,
            admin,
            admin_listen,
            stderr_path,
            fd_baseline: 0,
        };

        let deadline = Instant::now() + LIVE_TIMEOUT;
        loop {
            if let Ok(Some(status)) = gate.child.try_wait() {
                return Err(format!(
                    "slotgate exited during startup with {status}; stderr:\n{}",
                    gate.stderr_text()
                ));
            }
            let live = matches!(gate.admin.try_send(get("/livez")).await, Ok(r) if r.status == 200);
            // Live while its policies compile, but not started until they have (`app::starting`).
            let live = live
                && !matches!(gate.admin.try_send(get("/readyz")).await, Ok(r) if r.body.contains("starting"));
            let sockets = gate.unix_paths().iter().all(|p| p.exists());
            if live && sockets {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "slotgate: /livez did not answer 200 (or listen sockets missing) within {LIVE_TIMEOUT:?}; \
                     stderr:\n{}",
                    gate.stderr_text()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        if self.wait_ready {
            let deadline = Instant::now() + READY_TIMEOUT;
            while gate.readyz().await != 200 {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "slotgate: /readyz not 200 within {READY_TIMEOUT:?} although the upstream is up; \
                         status: {}; stderr:\n{}",
                        gate.status().await,
                        gate.stderr_text()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Once the start-up probes' connections have closed: what an idle gate holds open.
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.fd_baseline = gate.open_fds();
        Ok(gate)
    }

    /// Runs slotgate expecting it to exit by itself (e.g. a refused listen path) within `timeout`.
    pub async fn run_to_exit(self, timeout: Duration) -> Exited {
        let dir = unique_dir("gate");
        let admin_listen = format!("tcp:127.0.0.1:{}", free_port());
        let (mut cmd, _) = self.build(&dir, &admin_listen);
        let _spawning = self.spawning().await;
        let out = tokio::time::timeout(
            timeout,
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).output(),
        )
        .await
        .unwrap_or_else(|_| panic!("slotgate did not exit within {timeout:?}"))
        .expect("run slotgate");
        let _ = std::fs::remove_dir_all(&dir);
        Exited {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The result of a slotgate run that ended by itself.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A running slotgate; killed on drop. Its temp dir (logs, socket) is kept if the test panicked.
pub struct RunningGate {
    child: Child,
    pid: u32,
    dir: PathBuf,
    listen: Vec<String>,
    admin: Client,
    admin_listen: String,
    stderr_path: PathBuf,
    /// Open file descriptors once started (see [`RunningGate::assert_fds_settled`]).
    fd_baseline: usize,
}

impl RunningGate {
    /// The process's open file descriptors, from `/proc`.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map_or(0, |d| d.count())
    }

    /// Waits up to 5 s for the open descriptors to come back to what the idle gate held after start.
    /// One more is allowed: the health probe's pooled upstream connection comes and goes.
    pub async fn assert_fds_settled(&self) {
        let baseline = self.fd_baseline;
        let mut last = 0;
        let settled = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                last = self.open_fds();
                if last <= baseline + 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            settled.is_ok(),
            "slotgate holds {last} file descriptors, {baseline} after start: a connection or file leaked"
        );
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn unix_paths(&self) -> Vec<PathBuf> {
        self.listen
            .iter()
            .filter_map(|l| l.strip_prefix("unix:"))
            .map(PathBuf::from)
            .collect()
    }

    /// The first Unix listen socket.
    pub fn socket_path(&self) -> PathBuf {
        self.unix_paths()
            .into_iter()
            .next()
            .expect("this gate has no Unix listen socket")
    }

    /// Teaches the gate what a request costs, so its wait estimates (Retry-After, doomed waits) have
    /// a service time: three requests of `service` each, one after another, every one answered 200.
    pub async fn learn_service_time(&self, service: Duration) {
        let client = self.client();
        for i in 0..3 {
            let warm = Req::chat(&format!("warm{i}")).delay(service).json();
            let resp = client.post_json(CHAT, &warm).await;
            assert_eq!(resp.status, 200, "{}", resp.body);
        }
    }

    /// A client for the first listen address.
    pub fn client(&self) -> Client {
        client_for(&self.listen[0])
    }

    /// Clients for every listen address, in `--listen` order.
    pub fn clients(&self) -> Vec<Client> {
        self.listen.iter().map(|l| client_for(l)).collect()
    }

    /// The `--admin-listen` value.
    pub fn admin_addr(&self) -> &str {
        &self.admin_listen
    }

    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// From now on the admin client sends this token (after the gate re-read its token file).
    pub fn use_admin_token(&mut self, token: &str) {
        self.admin = self.admin.clone().without_bearer().with_bearer(token);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `slotgate ARGS` against this gate's admin listener, with its admin token when it has one
    /// ([`Gate::admin_token`]), as an operator types it: (exited 0, stdout, stderr).
    pub fn admin_cli(&self, args: &[&str]) -> (bool, String, String) {
        let mut cmd = command();
        cmd.args(args).arg("--admin").arg(&self.admin_listen);
        let token = self.dir.join("admin.token");
        if token.exists() {
            cmd.arg("--admin-token-file").arg(token);
        }
        let out = cmd.output().expect("run slotgate");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub async fn admin_get(&self, path: &str) -> crate::client::Response {
        self.admin
            .try_send(get(path))
            .await
            .unwrap_or_else(|e| panic!("admin GET {path}: {e:#}; stderr:\n{}", self.stderr_text()))
    }

    /// `GET /status` as JSON.
    pub async fn status(&self) -> Value {
        let r = self.admin_get("/status").await;
        assert_eq!(r.status, 200, "/status answered {}: {}", r.status, r.body);
        r.json()
    }

    pub async fn metrics_text(&self) -> String {
        let r = self.admin_get("/metrics").await;
        assert_eq!(r.status, 200, "/metrics answered {}: {}", r.status, r.body);
        r.body
    }

    pub async fn metrics(&self) -> Metrics {
        Metrics::parse(&self.metrics_text().await)
    }

    /// One metric value (`name` plus labels that must match), if present.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.metrics().await.value(name, labels)
    }

    /// Polls `/metrics` for up to 2 s until the sample equals `want` (a missing sample reads as 0).
    pub async fn wait_metric(&self, name: &str, labels: &[(&str, &str)], want: f64) {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let m = self.metrics().await;
            let got = m.value_or_zero(name, labels);
            if got == want {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "metric {name}{labels:?} is {got}, expected {want}; /metrics:\n{}",
                    m.text
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `slotgate_requests_total{outcome}` must reach `want`.
    pub async fn wait_outcome(&self, outcome: &str, want: u64) {
        self.wait_metric(
            "slotgate_requests_total",
            &[("outcome", outcome)],
            want as f64,
        )
        .await;
    }

    /// What is left of the `kind` (`requests`, `tokens`) quota among `/status`'s emptiest quotas.
    pub async fn quota_left(&self, kind: &str) -> f64 {
        let s = self.status().await;
        s["state"]["quotas"]["emptiest"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["key"].as_str().unwrap().starts_with(&format!("{kind}:")))
            .unwrap_or_else(|| panic!("no {kind} quota in {s}"))["left"]
            .as_f64()
            .unwrap()
    }

    /// `slotgate_tokens_total{kind}` (`prompt`, `completion`) must reach `want`.
    pub async fn wait_tokens(&self, kind: &str, want: f64) {
        self.wait_metric("slotgate_tokens_total", &[("kind", kind)], want)
            .await;
    }

    pub async fn readyz(&self) -> u16 {
        self.admin_get("/readyz").await.status.as_u16()
    }

    pub async fn livez(&self) -> u16 {
        self.admin_get("/livez").await.status.as_u16()
    }

    /// Polls `/status` until `pred` holds; panics with the last status after `timeout`.
    pub async fn wait_status(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status().await;
            if pred(&st) {
                return st;
            }
            if Instant::now() >= deadline {
                panic!("timed out after {timeout:?} waiting for {what}; last /status: {st}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `/status` shows `queue.depth == n`.
    pub async fn wait_queue_depth(&self, n: u64) -> Value {
        self.wait_status(
            Duration::from_secs(3),
            &format!("queue.depth == {n}"),
            |s| s["queue"]["depth"].as_u64() == Some(n),
        )
        .await
    }

    /// Waits until `/status` shows `slots.busy == n`.
    pub async fn wait_busy(&self, n: u64) -> Value {
        self.wait_status(Duration::from_secs(3), &format!("slots.busy == {n}"), |s| {
            s["slots"]["busy"].as_u64() == Some(n)
        })
        .await
    }

    /// Sends `req` to the chat path in a task and returns once it holds a slot (`slots.busy == 1`): on an
    /// idle one-slot gate, this is the request everything sent afterwards queues behind.
    pub async fn hold_slot(&self, req: &Req) -> JoinHandle<(Response, Duration)> {
        let handle = spawn_post(&self.client(), CHAT, req);
        self.wait_busy(1).await;
        handle
    }

    /// Sends `req` to the chat path in a task and returns once it waits in the queue (the queue grew by
    /// one). Calling it in turn fixes the arrival order of the waiters.
    pub async fn enqueue(&self, req: &Req) -> JoinHandle<(Response, Duration)> {
        let before = self.status().await["queue"]["depth"]
            .as_u64()
            .expect("/status has queue.depth");
        let handle = spawn_post(&self.client(), CHAT, req);
        self.wait_queue_depth(before + 1).await;
        handle
    }

    /// Polls `/status` for up to 3 s until nothing is queued, busy or in flight.
    pub async fn assert_idle(&self) {
        self.wait_status(
            Duration::from_secs(3),
            "idle gate (queue 0, busy 0, inflight 0)",
            |s| {
                s["queue"]["depth"].as_u64() == Some(0)
                    && s["slots"]["busy"].as_u64() == Some(0)
                    && s["inflight"].as_u64() == Some(0)
            },
        )
        .await;
    }

    /// The checks every scenario ends with: the gate is idle (queue, busy slots and in-flight at 0),
    /// its file descriptors are back to their baseline, nothing was forwarded twice, and the upstream
    /// never saw more than `slots` generation requests at once.
    pub async fn assert_settled(&self, up: &RunningUpstream, slots: usize) {
        self.assert_idle().await;
        self.assert_fds_settled().await;
        up.assert_forwarded_once();
        assert!(
            up.max_concurrency() <= slots,
            "upstream saw {} concurrent generation requests with --slots {slots}",
            up.max_concurrency()
        );
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Sends a signal by name (`TERM`, `INT`) through `kill(1)`: the workspace forbids `unsafe`.
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{name} {} failed", self.pid);
    }

    /// Waits for the process to exit; panics (with stderr) after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.expect("wait for slotgate"),
            Err(_) => panic!(
                "slotgate did not exit within {timeout:?}; stderr:\n{}",
                self.stderr_text()
            ),
        }
    }

    /// `Some(status)` if the process has exited.
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for RunningGate {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("slotgate logs kept in {}", self.dir.display());
        }
    }
}

fn client_for(addr: &str) -> Client {
    if let Some(p) = addr.strip_prefix("unix:") {
        Client::unix(p)
    } else {
        let hostport = addr.strip_prefix("tcp:").unwrap_or(addr);
        Client::tcp(
            hostport
                .parse()
                .unwrap_or_else(|e| panic!("bad tcp listen address {hostport}: {e}")),
        )
    }
}
