//! Discovery without `--upstream` hands nothing to a stranger: a server on llama-server's default
//! ports (127.0.0.1:9931, then :8080) is used only when the kernel says its socket and its process
//! are slotgate's user's and the process is llama-server. An impostor (this user's server that is
//! not llama-server, or another user's named llama-server) is passed over without a single request,
//! the log says why, and with nothing proven slotgate refuses to start, naming `--upstream`.
//!
//! The servers are Python's http.server, run from a copy of the interpreter: named `llama-server`
//! for the real one (and for one impostor), so `/proc/<pid>/exe` says so. The tests hold the two
//! fixed ports, so they take turns (`PORTS`).

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::*;
use tokio::process::{Child, Command};

/// The two ports are the machine's: one test at a time.
static PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const NOBODY: u32 = 65534;
const KEY: &str = "upstream-key-d1sc0very";

/// Answers every request as llama-server would enough for slotgate, and appends each one (method,
/// path, headers, body) to the log file as a JSON line.
const SERVER: &str = r#"
import http.server, json, sys
port, log = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        with open(log, "a") as f:
            f.write(json.dumps({"method": self.command, "path": self.path,
                                "headers": dict(self.headers),
                                "body": body.decode("utf-8", "replace")}) + "\n")
        if self.path.startswith("/health"):
            out = {"status": "ok"}
        elif self.path.startswith("/props"):
            out = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}
        elif self.path.startswith("/slots"):
            out = [{"id": 0, "n_ctx": 4096, "is_processing": False}]
        else:
            out = {"id": "x", "object": "chat.completion", "model": "m",
                   "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "from the real one"}}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_GET = do_POST = do_DELETE = answer
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

/// The system's Python: a file a copy can be made of, readable by every user.
const PYTHON: &str = "/usr/bin/python3";

/// A server of [`SERVER`] on 127.0.0.1:`port`, killed on drop.
struct Server {
    _child: Child,
    log: PathBuf,
}

impl Server {
    /// Runs `interpreter` (a copy of Python, under the name the test wants) on `port`, as `uid` when
    /// given (it needs root).
    async fn start(dir: &Path, interpreter: &Path, port: u16, uid: Option<u32>) -> Server {
        let log = dir.join(format!("requests-{port}.jsonl"));
        std::fs::write(&log, "").unwrap();
        let mut cmd = match uid {
            Some(uid) => {
                std::os::unix::fs::chown(&log, Some(uid), Some(uid)).unwrap();
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg(interpreter);
                c
            }
            None => Command::new(interpreter),
        };
        cmd.arg("-c")
            .arg(SERVER)
            .arg(port.to_string())
            .arg(&log)
            .current_dir(dir)
            .kill_on_drop(true);
        let child = cmd.spawn().expect("start the Python server");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        eventually(
            Duration::from_secs(10),
            "the Python server listens",
            || async move { TcpStream::connect(addr).ok().map(drop) },
        )
        .await;
        Server { _child: child, log }
    }

    /// Every request it was sent.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A copy of Python named `name` in `dir` (0755, so another user may run it).
fn python_named(dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let exe = dir.join(name);
    std::fs::copy(PYTHON, &exe).expect("copy the system's python3");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// The two ports, once free (within a few seconds: a server of the test before, killed, may still
/// be going). They are the machine's, not the test's: a test fails when another program holds them.
async fn take_ports() -> tokio::sync::MutexGuard<'static, ()> {
    let turn = PORTS.lock().await;
    for port in [9931, 8080] {
        let what = format!("port {port} (one of llama-server's defaults) free for this test");
        eventually(Duration::from_secs(5), &what, || async move {
            std::net::TcpListener::bind(("127.0.0.1", port))
                .ok()
                .map(drop)
        })
        .await;
    }
    turn
}

/// A gate without `--upstream`, holding an upstream key.
fn discovering(dir: &Path) -> Gate {
    let key = dir.join("upstream.key");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    Gate::new()
        .no_wait_ready()
        .opt("--upstream-api-key-file", key.display())
}

/// Whether any request carries the key or the prompt.
fn leaked(requests: &[Value], prompt: &str) -> bool {
    requests.iter().any(|r| {
        let text = r.to_string();
        text.contains(KEY) || text.contains(prompt)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn llama_server_of_this_user_is_found_on_9931() {
    let _ports = take_ports().await;
    let dir = unique_dir("discover-ours");
    let real = Server::start(&dir, &python_named(&dir, "llama-server"), 9931, None).await;
    let gate = discovering(&dir).start().await;
    let st = gate
        .wait_status(Duration::from_secs(10), "an upstream", |s| {
            s["upstream"]["target"].is_string()
        })
        .await;
    let target = st["upstream"]["target"].as_str().unwrap();
    assert!(target.contains("127.0.0.1:9931"), "{st}");
    let said = gate.stderr_text();
    assert!(said.contains("llama-server answers here"), "{said}");
    assert!(!said.contains("passed over"), "{said}");
    // Its own user's llama-server gets slotgate's key on its own calls.
    let real = &real;
    eventually(
        Duration::from_secs(10),
        "slotgate asks with its key",
        || async move { leaked(&real.requests(), KEY).then_some(()) },
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// This user's server that is not llama-server on 9931, the real one on 8080: the real one is
/// chosen, and the impostor hears nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_is_not_llama_server_on_9931_is_passed_over() {
    let _ports = take_ports().await;
    let dir = unique_dir("discover-impostor");
    let impostor = Server::start(&dir, &python_named(&dir, "python3"), 9931, None).await;
    let real = Server::start(&dir, &python_named(&dir, "llama-server"), 8080, None).await;
    let gate = discovering(&dir).start().await;
    let st = gate
        .wait_status(Duration::from_secs(10), "an upstream", |s| {
            s["upstream"]["target"].is_string()
        })
        .await;
    assert!(
        st["upstream"]["target"]
            .as_str()
            .unwrap()
            .contains("127.0.0.1:8080"),
        "{st}"
    );
    let prompt = "a prompt for the real llama-server only";
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": prompt}]});
    let resp = gate
        .client()
        .post_chat(&Req::from_json(body).header("authorization", "Bearer client-key-0f-a-caller"))
        .await;
    assert!(resp.body.contains("from the real one"), "{}", resp.body);
    let said = gate.stderr_text();
    assert!(said.contains("passed over 127.0.0.1:9931"), "{said}");
    assert!(said.contains("which is not llama-server"), "{said}");
    assert!(
        leaked(&real.requests(), prompt),
        "the real one was sent the prompt"
    );
    assert_eq!(
        impostor.requests(),
        Vec::<Value>::new(),
        "the impostor was sent nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another user's server, named llama-server, on 9931 and nothing on 8080: slotgate refuses to
/// start, says whose the port is and which setting to use, and sends the impostor nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_users_llama_server_is_refused() {
    if std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(1)
        != 0
    {
        eprintln!("skipped: running a server as another user needs root");
        return;
    }
    let _ports = take_ports().await;
    let dir = unique_dir("discover-stranger");
    let stranger = python_named(&dir, "llama-server");
    let impostor = Server::start(&dir, &stranger, 9931, Some(NOBODY)).await;
    let out = discovering(&dir)
        .opt("--connect-timeout", "1s")
        .run_to_exit(Duration::from_secs(20))
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    for said in [
        "127.0.0.1:9931 was passed over",
        "belongs to uid 65534 (nobody)",
        "Set --upstream",
    ] {
        assert!(
            out.stderr.contains(said),
            "stderr must say `{said}`:\n{}",
            out.stderr
        );
    }
    assert!(!leaked(&impostor.requests(), KEY));
    assert_eq!(
        impostor.requests(),
        Vec::<Value>::new(),
        "the impostor was sent nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
