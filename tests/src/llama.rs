//! The real llama-server for end-to-end tests: built and cached by `scripts/setup-llama.sh`, started on a
//! Unix socket in a temp dir with a tiny random-weight model, killed on Drop.
//!
//! The setup script runs once per test process. If it fails the test fails with the script's stderr:
//! an end-to-end test that silently skips would claim coverage it does not have.
//!
//! Also what every test against it asks and checks: chat requests that generate an exact number of
//! tokens, the `usage` of their answers, calibration of answer length to time, and "idle again".

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::client::{get_request, Client, Response, SseRead};
use crate::metrics::Metrics;
use crate::request::CHAT;
use crate::wait::{eventually, unique_dir};

/// Context tokens per slot: the tiny model's training context, enough for a prompt plus `max_tokens`.
pub const CTX_PER_SLOT: usize = 2048;

/// A short prompt for requests whose text does not matter.
pub const PROMPT: &str = "Tell me a long story about a lighthouse keeper.";

const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The llama-server binary, the models it serves and the source it was built from.
#[derive(Debug, Clone)]
pub struct LlamaPaths {
    pub server: PathBuf,
    /// 2048 tokens of training context.
    pub model: PathBuf,
    /// 16384 tokens of training context and fill-in-the-middle tokens (`/infill`).
    pub model_long: PathBuf,
    /// The sdist's llama.cpp tree (`tools/server/server.cpp`).
    pub source: PathBuf,
}

impl LlamaPaths {
    /// `LLAMA_SERVER`, `LLAMA_MODEL`, `LLAMA_MODEL_LONG` and `LLAMA_SOURCE` if all are set, else
    /// what `scripts/setup-llama.sh` prints.
    /// Panics with the reason (for the script: its exit status and stderr) when neither works.
    pub fn get() -> &'static LlamaPaths {
        static PATHS: OnceLock<Result<LlamaPaths, String>> = OnceLock::new();
        match PATHS.get_or_init(resolve_paths) {
            Ok(paths) => paths,
            Err(e) => panic!("{e}"),
        }
    }
}

fn resolve_paths() -> Result<LlamaPaths, String> {
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    if let (Some(server), Some(model), Some(model_long), Some(source)) = (
        var("LLAMA_SERVER"),
        var("LLAMA_MODEL"),
        var("LLAMA_MODEL_LONG"),
        var("LLAMA_SOURCE"),
    ) {
        return checked(
            LlamaPaths {
                server,
                model,
                model_long,
                source,
            },
            "LLAMA_SERVER / LLAMA_MODEL / LLAMA_MODEL_LONG / LLAMA_SOURCE",
        );
    }
    let script = "setup-llama.sh";
    let stdout = crate::setup_script(script)?;
    let field = |key: &str| crate::setup_value(script, &stdout, key);
    checked(
        LlamaPaths {
            server: field("LLAMA_SERVER")?,
            model: field("LLAMA_MODEL")?,
            model_long: field("LLAMA_MODEL_LONG")?,
            source: field("LLAMA_SOURCE")?,
        },
        &format!("scripts/{script}"),
    )
}

fn checked(paths: LlamaPaths, from: &str) -> Result<LlamaPaths, String> {
    for p in [&paths.server, &paths.model, &paths.model_long] {
        if !p.is_file() {
            return Err(format!("{from} names {}, which is not a file", p.display()));
        }
    }
    let server_cpp = paths.source.join("tools/server/server.cpp");
    if !server_cpp.is_file() {
        return Err(format!(
            "{from} names the source {}, which has no {}",
            paths.source.display(),
            server_cpp.display()
        ));
    }
    Ok(paths)
}

/// One real llama-server scenario at a time in a test binary, across its modules.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Holds the machine for one test against the real llama-server: every such test takes this first,
/// since two CPU-bound servers on this machine's two cores would skew each other's timings.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}

/// Starts llama-server.
#[derive(Debug)]
pub struct LlamaServer;

impl LlamaServer {
    /// Starts llama-server with `np` slots on a fresh Unix socket and waits until `/health` answers 200
    /// (it answers 503 while the model loads). Panics with the server's log if it exits or never gets ready.
    pub async fn start(np: usize) -> RunningLlama {
        Self::start_argv(server_argv(np)).await
    }

    /// Starts llama-server on the long model (the tiny model with a 16k-token context and FIM
    /// tokens, for `/infill`) with `np` slots of `ctx_per_slot` tokens each: room for answers of
    /// several seconds.
    pub async fn start_long(np: usize, ctx_per_slot: usize) -> RunningLlama {
        let mut argv = server_argv(np);
        let at = argv.iter().position(|a| a == "-c").expect("-c");
        argv[at + 1] = (ctx_per_slot * np).to_string();
        let at = argv.iter().position(|a| a == "-m").expect("-m");
        argv[at + 1] = LlamaPaths::get().model_long.display().to_string();
        Self::start_argv(argv).await
    }

    /// Starts llama-server as `argv` says (the binary first, no address: a fresh Unix socket is
    /// added) and waits until `/health` answers 200.
    pub async fn start_argv(argv: Vec<String>) -> RunningLlama {
        let dir = unique_dir("llama");
        let socket = dir.join("llama.sock");
        let log = dir.join("llama-server.log");
        let child = spawn_server(&socket, &log, &argv);
        let client = Client::unix(&socket);
        // Its own `--api-key`: the test's direct calls (`/metrics`, `/slots`) carry it.
        let api_key = argv
            .iter()
            .position(|a| a == "--api-key")
            .and_then(|i| argv.get(i + 1))
            .map(|k| k.split(',').next().unwrap_or(k).to_owned());
        let mut llama = RunningLlama {
            child,
            dir,
            socket,
            log,
            client,
            argv,
            api_key,
            starts: 1,
        };
        llama.wait_healthy().await;
        llama
    }

    /// llama-server in router mode (no `-m`): a `--models-dir` holding the tiny model under each of
    /// `models` (`NAME.gguf`), `--models-max max`, each child `-np 2 -c 4096` and `-t 1` (two models
    /// decoding at once on this machine's two cores: see docs/performance.md), `extra` after.
    pub async fn start_router(models: &[&str], max: usize, extra: &[&str]) -> RunningLlama {
        Self::start_router_with(models, &[], max, extra).await
    }

    /// [`LlamaServer::start_router`] with `broken` models too: files in `--models-dir` that are no
    /// GGUF, so their child llama-server exits while loading.
    pub async fn start_router_with(
        models: &[&str],
        broken: &[&str],
        max: usize,
        extra: &[&str],
    ) -> RunningLlama {
        let dir = models_dir(&LlamaPaths::get().model, models, broken);
        let mut argv = router_argv(&dir, max, true);
        argv.extend(["-np", "2", "-c", "4096"].map(str::to_owned));
        argv.extend(extra.iter().map(|a| (*a).to_owned()));
        Self::start_argv(argv).await
    }

    /// [`LlamaServer::start_router`] with llama-server's default threads: each child a thread per
    /// core, so two loaded models oversubscribe the CPUs.
    pub async fn start_router_all_cores(models: &[&str], max: usize) -> RunningLlama {
        let dir = models_dir(&LlamaPaths::get().model, models, &[]);
        let mut argv = router_argv(&dir, max, false);
        argv.extend(["-np", "2", "-c", "4096"].map(str::to_owned));
        Self::start_argv(argv).await
    }

    /// A router as people run it: no `-np`, so each child has llama-server's default 4 slots over
    /// one shared KV pool of `-c ctx` tokens, on the long-context model; `extra` after.
    pub async fn start_router_defaults(
        models: &[&str],
        max: usize,
        ctx: usize,
        extra: &[&str],
    ) -> RunningLlama {
        let dir = models_dir(&LlamaPaths::get().model_long, models, &[]);
        let mut argv = router_argv(&dir, max, true);
        argv.extend(["-c".to_owned(), ctx.to_string()]);
        argv.extend(extra.iter().map(|a| (*a).to_owned()));
        Self::start_argv(argv).await
    }

    /// llama-server as people run it with its own defaults: no `-np` (4 slots sharing one KV pool),
    /// on the long-context model, the pool `-c ctx` tokens; `extra` arguments after.
    pub async fn start_default(ctx: usize, extra: &[&str]) -> RunningLlama {
        Self::start_argv(default_argv(ctx, extra)).await
    }
}

/// A `--models-dir` holding `models` (links to `model`) and `broken` ones (files that are no GGUF).
fn models_dir(model: &Path, models: &[&str], broken: &[&str]) -> PathBuf {
    let dir = unique_dir("models");
    for m in models {
        let to = dir.join(format!("{m}.gguf"));
        if std::fs::hard_link(model, &to).is_err() {
            std::fs::copy(model, &to).expect("copy the tiny model");
        }
    }
    for m in broken {
        std::fs::write(dir.join(format!("{m}.gguf")), b"not a gguf file").expect("write");
    }
    dir
}

/// A router over `dir`: `--models-max max`, with `one_thread` one thread per child (two models
/// decoding at once with a thread per core each run many times slower on a small machine:
/// docs/router.md).
fn router_argv(dir: &Path, max: usize, one_thread: bool) -> Vec<String> {
    let paths = LlamaPaths::get();
    let mut argv = vec![
        paths.server.display().to_string(),
        "--models-dir".into(),
        dir.display().to_string(),
        "--models-max".into(),
        max.to_string(),
        "--metrics".into(),
        "--slots".into(),
        "--no-webui".into(),
    ];
    if one_thread {
        argv.extend(["-t".to_owned(), "1".to_owned()]);
    }
    argv
}

/// The command line of [`LlamaServer::start_default`].
pub fn default_argv(ctx: usize, extra: &[&str]) -> Vec<String> {
    let paths = LlamaPaths::get();
    let mut argv = vec![
        paths.server.display().to_string(),
        "-m".into(),
        paths.model_long.display().to_string(),
        "-c".into(),
        ctx.to_string(),
        "--metrics".into(),
        "--slots".into(),
        "--no-webui".into(),
    ];
    argv.extend(extra.iter().map(|a| (*a).to_owned()));
    argv
}

/// The llama-server command line every test runs, without an address: the binary, the model, `np`
/// slots of [`CTX_PER_SLOT`] each, metrics and `/slots` on (what `slotgate wrap` is given).
pub fn server_argv(np: usize) -> Vec<String> {
    let paths = LlamaPaths::get();
    vec![
        paths.server.display().to_string(),
        "-m".into(),
        paths.model.display().to_string(),
        "-np".into(),
        np.to_string(),
        "-c".into(),
        (CTX_PER_SLOT * np).to_string(),
        "--metrics".into(),
        "--slots".into(),
        "--no-webui".into(),
    ]
}

/// `LD_LIBRARY_PATH` for llama-server: its own directory (the ggml libraries) first.
pub fn library_path() -> std::ffi::OsString {
    let bin_dir = LlamaPaths::get()
        .server
        .parent()
        .expect("llama-server has a parent dir");
    match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut p = bin_dir.as_os_str().to_owned();
            p.push(":");
            p.push(old);
            p
        }
        _ => bin_dir.as_os_str().to_owned(),
    }
}

/// Spawns llama-server as `argv` says, listening on `socket`, its stdout and stderr in `log`.
fn spawn_server(socket: &Path, log: &Path, argv: &[String]) -> Child {
    let log_file = File::create(log).expect("create llama-server log");
    Command::new(&argv[0])
        .args(&argv[1..])
        // A --host ending in `.sock` makes llama-server listen on that Unix socket.
        .arg("--host")
        .arg(socket)
        .env("LD_LIBRARY_PATH", library_path())
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("clone log fd"))
        .stderr(log_file)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", argv[0]))
}

/// A running llama-server; killed and its temp dir removed on Drop.
pub struct RunningLlama {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    client: Client,
    /// Its command line, kept for [`RunningLlama::restart`].
    argv: Vec<String>,
    /// The key it wants, if it was started with `--api-key`.
    api_key: Option<String>,
    /// Processes started so far; each one logs to a file of its own.
    starts: usize,
}

impl RunningLlama {
    /// The Unix socket llama-server listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The last `lines` lines of llama-server's combined stdout and stderr.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::logged::tail(&self.log, lines)
    }

    /// GET `path` straight from llama-server (not through slotgate).
    pub async fn get(&self, path: &str) -> Response {
        let mut req = get_request(path);
        if let Some(key) = &self.api_key {
            req.headers_mut().insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::try_from(format!("Bearer {key}")).expect("a header value"),
            );
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, self.client.try_send(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => panic!("llama-server GET {path}: {e:#}\n{}", self.log_tail(40)),
            Err(_) => panic!(
                "llama-server GET {path}: no answer in {REQUEST_TIMEOUT:?}\n{}",
                self.log_tail(40)
            ),
        }
    }

    /// `GET /slots`: one object per slot; `is_processing` says whether it is generating.
    pub async fn slots(&self) -> Vec<Value> {
        let r = self.get("/slots").await;
        assert_eq!(r.status, 200, "llama-server /slots: {}", r.body);
        match r.json() {
            Value::Array(slots) => slots,
            other => panic!("llama-server /slots is not a JSON array: {other}"),
        }
    }

    /// How many slots `/slots` reports as processing.
    pub async fn busy_slots(&self) -> usize {
        self.slots()
            .await
            .iter()
            .filter(|s| {
                s.get("is_processing")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            })
            .count()
    }

    /// `GET /metrics` (Prometheus text; needs `--metrics`, which [`LlamaServer::start`] passes).
    pub async fn metrics(&self) -> Metrics {
        let r = self.get("/metrics").await;
        assert_eq!(r.status, 200, "llama-server /metrics: {}", r.body);
        Metrics::parse(&r.body)
    }

    /// The two gauges that show whether llama-server queues work internally.
    pub async fn load(&self) -> LlamaLoad {
        let m = self.metrics().await;
        let gauge = |name: &str| {
            m.value(name, &[])
                .unwrap_or_else(|| panic!("llama-server /metrics lacks {name}:\n{}", m.text))
        };
        LlamaLoad {
            requests_processing: gauge("llamacpp:requests_processing"),
            requests_deferred: gauge("llamacpp:requests_deferred"),
        }
    }

    /// Both views of "llama-server queued nothing and is idle now".
    pub async fn assert_idle(&self) {
        let load = eventually(Duration::from_secs(5), "llama-server idle", || async {
            let load = self.load().await;
            (load.requests_processing == 0.0).then_some(load)
        })
        .await;
        assert_eq!(
            load.requests_deferred, 0.0,
            "llama-server deferred requests: {load:?}"
        );
        assert_eq!(self.busy_slots().await, 0, "{:?}", self.slots().await);
    }

    /// `max_tokens` for which one answer takes about `target` on this machine, from the faster of two
    /// timed requests straight to llama-server (which also warm it up; other load only ever slows a
    /// probe down), within `range`.
    pub async fn tokens_for(&self, target: Duration, range: (u64, u64)) -> u64 {
        const PROBE: u64 = 100;
        let direct = Client::unix(self.socket());
        let mut per_token = Duration::MAX;
        // Its key, for a server run with `--api-key`.
        let auth: Vec<(&str, String)> = self
            .api_key
            .iter()
            .map(|k| ("authorization", format!("Bearer {k}")))
            .collect();
        for _ in 0..2 {
            let t0 = Instant::now();
            let body = chat(PROMPT, PROBE, false);
            chat_usage(
                &direct.post_json_with_headers(CHAT, &body, &auth).await,
                PROBE,
            );
            per_token = per_token.min(t0.elapsed() / PROBE as u32);
        }
        let n = (target.as_nanos() / per_token.as_nanos().max(1)) as u64;
        let n = n.clamp(range.0, range.1);
        eprintln!("{per_token:?} per token: max_tokens {n} for about {target:?} per answer");
        n
    }

    async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + HEALTH_TIMEOUT;
        let mut last = String::from("socket not there yet");
        loop {
            if let Some(status) = self.child.try_wait().expect("poll llama-server") {
                panic!(
                    "llama-server exited ({status}) before it was healthy; log:\n{}",
                    self.log_tail(60)
                );
            }
            if self.socket.exists() {
                match tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    self.client.try_send(get_request("/health")),
                )
                .await
                {
                    Ok(Ok(r)) if r.status == 200 => return,
                    Ok(Ok(r)) => last = format!("/health answered {}", r.status),
                    Ok(Err(e)) => last = format!("/health failed: {e:#}"),
                    Err(_) => last = "/health timed out".into(),
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "llama-server not healthy after {HEALTH_TIMEOUT:?} ({last}); log:\n{}",
                    self.log_tail(60)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for RunningLlama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- llama-server log (last 40 lines) ---\n{}",
                self.log_tail(40)
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// llama-server's own view of its load, from `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaLoad {
    /// `llamacpp:requests_processing`: requests in a slot right now.
    pub requests_processing: f64,
    /// `llamacpp:requests_deferred`: requests llama-server holds because every slot is busy. Behind
    /// slotgate with `--slots` equal to `-np`, this must stay 0.
    pub requests_deferred: f64,
}

/// A chat request with one user message that always generates exactly `max_tokens` tokens; a stream
/// ends with a chunk carrying `usage`.
pub fn chat(prompt: &str, max_tokens: u64, stream: bool) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        // Random weights can sample end-of-text at any step; without this, "length" and usage would
        // be luck.
        "ignore_eos": true,
    });
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// Token usage llama-server reported for one answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt + self.completion
    }
}

/// A whole chat answer: 200, `chat.completion`, stopped for "length" after `max_tokens` generated,
/// and a consistent `usage`.
pub fn chat_usage(resp: &Response, max_tokens: u64) -> Usage {
    assert_eq!(resp.status, 200, "expected an answer, got {}", resp.body);
    let v = resp.json();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let u = Usage {
        prompt: u64_at(&v, "/usage/prompt_tokens"),
        completion: u64_at(&v, "/usage/completion_tokens"),
    };
    assert_eq!(u.completion, max_tokens, "usage.completion_tokens in {v}");
    assert!(u.prompt > 0, "usage.prompt_tokens in {v}");
    assert_eq!(u64_at(&v, "/usage/total_tokens"), u.total(), "{v}");
    u
}

/// A streamed chat answer: ends with `[DONE]`, and its final `usage` counts `max_tokens` generated.
pub fn stream_usage(sse: &SseRead, max_tokens: u64) -> Usage {
    assert!(
        sse.complete(),
        "stream did not end cleanly with [DONE] (error {:?}):\n{}",
        sse.error,
        sse.raw
    );
    let usage = sse
        .data
        .iter()
        .rev()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|c| c["usage"].is_object())
        .unwrap_or_else(|| panic!("no chunk carries usage:\n{}", sse.raw))["usage"]
        .clone();
    let u = Usage {
        prompt: u64_at(&usage, "/prompt_tokens"),
        completion: u64_at(&usage, "/completion_tokens"),
    };
    assert_eq!(u.completion, max_tokens, "final usage {usage}");
    assert!(u.prompt > 0, "final usage {usage}");
    u
}

/// The integer at JSON pointer `path` in `v`.
pub fn u64_at(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} is missing or not an integer in {v}"))
}

/// Faults done to llama-server itself: a crash (`kill -9`) and a restart on the same socket path, and a
/// hang (`kill -STOP`) undone by a guard. Signals go through `kill(1)`: the workspace forbids `unsafe`.
impl RunningLlama {
    /// The llama-server process id (of the current process, after a restart).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills llama-server with SIGKILL, the way an OOM kill or a crash ends it, and reaps it. Nothing is
    /// cleaned up: its socket file stays behind, stale. The temp dir and logs are kept for `restart`.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let status = self.child.wait().expect("reap llama-server");
        eprintln!("llama-server {} killed: {status}", self.child.id());
    }

    /// Starts a new llama-server (same command line) on the same socket path, as a supervisor would
    /// after a crash, and waits until it is healthy. A process still running is killed first; a stale
    /// socket file is removed, since llama-server binds the path without unlinking it.
    pub async fn restart(&mut self) {
        if self.child.try_wait().expect("poll llama-server").is_none() {
            self.kill();
        }
        match std::fs::remove_file(&self.socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove stale socket {}: {e}", self.socket.display()),
        }
        self.starts += 1;
        self.log = self.dir.join(format!("llama-server.{}.log", self.starts));
        self.child = spawn_server(&self.socket, &self.log, &self.argv);
        self.wait_healthy().await;
    }

    /// Stops llama-server with SIGSTOP: it hangs with every connection open and answers nothing, while
    /// the kernel still accepts connections into its listen backlog. It runs again when the returned
    /// guard is dropped or [`Frozen::thaw`]ed, so a failing test never leaves a stopped process behind.
    pub fn freeze(&self) -> Frozen {
        signal(self.pid(), "STOP");
        Frozen {
            pid: Some(self.pid()),
        }
    }
}

/// One look at llama-server's load: `llamacpp:requests_processing`, `llamacpp:requests_deferred`, and
/// the slots `/slots` shows processing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaSample {
    pub load: LlamaLoad,
    pub busy_slots: usize,
}

/// Samples the llama-server listening at `socket`, or `None` if it does not answer both `/metrics` and
/// `/slots` within `timeout` (stopped, dead or restarting). Takes a path, not a [`RunningLlama`], so a
/// sampler task can run through a test's kills and restarts; [`RunningLlama::load`] would panic there.
pub async fn try_sample(socket: &Path, timeout: Duration) -> Option<LlamaSample> {
    let client = Client::unix(socket);
    let ask = |path: &'static str| {
        let client = client.clone();
        async move {
            let r = tokio::time::timeout(timeout, client.try_send(get_request(path)))
                .await
                .ok()?
                .ok()?;
            (r.status == 200).then_some(r)
        }
    };
    let (metrics, slots) = tokio::join!(ask("/metrics"), ask("/slots"));
    let m = Metrics::parse(&metrics?.body);
    let load = LlamaLoad {
        requests_processing: m.value("llamacpp:requests_processing", &[])?,
        requests_deferred: m.value("llamacpp:requests_deferred", &[])?,
    };
    let busy_slots = match slots?.json() {
        Value::Array(slots) => slots
            .iter()
            .filter(|s| s["is_processing"].as_bool().unwrap_or(false))
            .count(),
        _ => return None,
    };
    Some(LlamaSample { load, busy_slots })
}

/// A llama-server stopped by [`RunningLlama::freeze`]; continued (SIGCONT) on drop.
#[must_use = "dropping the guard resumes llama-server at once"]
pub struct Frozen {
    pid: Option<u32>,
}

impl Frozen {
    /// Resumes llama-server now.
    pub fn thaw(mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, "CONT");
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            // Also when the test panics: whatever runs after (llama-server's own Drop, the log
            // tail, other tests' servers on these cores) finds it running, not stopped.
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
    }
}

/// Sends signal `name` (`STOP`, `CONT`) to `pid` through `kill(1)`.
fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -{name} {pid} failed");
}
