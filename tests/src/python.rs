//! The Python clients the SDK tests drive (the pinned `openai` and `anthropic` SDKs of
//! `tests/python/requirements.txt`, in the venv `scripts/setup-python-clients.sh` makes): run a
//! driver in `tests/python/` under `$SLOTGATE_PYTHON` and read the JSON it prints. Without
//! `$SLOTGATE_PYTHON` a test fails, naming the script: it never skips.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const SETUP: &str = "eval \"$(bash scripts/setup-python-clients.sh)\" && export SLOTGATE_PYTHON";
/// A driver runs one SDK scenario; a burst is the longest, about 10 s.
const DRIVER_TIMEOUT: Duration = Duration::from_secs(90);

/// `$SLOTGATE_PYTHON`; unset or not a file fails the test with the command that provides it.
pub fn python() -> PathBuf {
    let Some(path) = std::env::var_os("SLOTGATE_PYTHON") else {
        panic!(
            "SLOTGATE_PYTHON is not set: the OpenAI SDK tests run the pinned Python clients; \
             run `{SETUP}` first (scripts/setup-python-clients.sh)"
        )
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "SLOTGATE_PYTHON={} is not a file; run `{SETUP}` (scripts/setup-python-clients.sh)",
        path.display()
    );
    path
}

fn command(script: &str, args: &[String]) -> tokio::process::Command {
    let path = crate::workspace().join("tests/python").join(script);
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(path)
        .args(args)
        // No __pycache__ left in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// The `litellm` command: `$LITELLM`, else the one beside the interpreter
/// `scripts/setup-python-clients.sh` prints (it installs `tests/python/requirements.txt`, which pins
/// `litellm[proxy]`, the first time). Fails the test with the script's stderr when neither works:
/// an end to end test that skipped would claim what it did not check.
pub fn litellm() -> &'static Path {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let resolved = PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("LITELLM") {
            return Ok(PathBuf::from(p));
        }
        let script = "setup-python-clients.sh";
        let stdout = crate::setup_script(script)?;
        let python = crate::setup_value(script, &stdout, "SLOTGATE_PYTHON")?;
        Ok(python.with_file_name("litellm"))
    });
    match resolved {
        Ok(p) if p.is_file() => p,
        Ok(p) => panic!(
            "LiteLLM is not at {}: is litellm[proxy] in tests/python/requirements.txt?",
            p.display()
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `tests/python/<script>` with `args` under `$SLOTGATE_PYTHON` and parses the JSON it prints.
pub async fn driver<T: DeserializeOwned>(script: &str, args: &[String]) -> T {
    let out = tokio::time::timeout(DRIVER_TIMEOUT, command(script, args).output())
        .await
        .unwrap_or_else(|_| panic!("{script} {args:?} did not finish within {DRIVER_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    result(script, args, &out)
}

/// Like [`driver`], with `--on-cue`: once the driver is ready to call, runs `cue` (which sets the
/// scene), then lets the call go; returns the driver's result and the cue's.
pub async fn driver_on_cue<T: DeserializeOwned, C>(
    script: &str,
    args: &[String],
    cue: impl std::future::Future<Output = C>,
) -> (T, C) {
    let args: Vec<String> = std::iter::once(arg("--on-cue"))
        .chain(args.iter().cloned())
        .collect();
    let what = format!("{script} {args:?}");
    let (out, scene) = run_on_cue(command(script, &args), &what, DRIVER_TIMEOUT, cue).await;
    (result(script, &args, &out), scene)
}

/// Runs `cmd`, a program that prints `ready` once it is set to go and then waits for a line on its
/// stdin: once it said so, runs `cue` (which sets the scene), then sends `go`; returns its output and
/// the cue's result. A program that never says ready, or does not finish within `timeout`, fails the
/// test (`what` names it). Python starting slowly on a busy machine thus never shifts the scene.
pub async fn run_on_cue<C>(
    mut cmd: tokio::process::Command,
    what: &str,
    timeout: Duration,
    cue: impl std::future::Future<Output = C>,
) -> (std::process::Output, C) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    let ready = tokio::time::timeout(timeout, stdout.read_line(&mut line)).await;
    if !matches!(ready, Ok(Ok(_))) || line.trim() != "ready" {
        let _ = child.start_kill();
        let out = child.wait_with_output().await.expect("reap the program");
        panic!(
            "{what} never said ready (got {line:?}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let scene = cue.await;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"go\n").await.expect("cue the program");
    drop(stdin);
    let mut rest = Vec::new();
    let finished = async {
        stdout.read_to_end(&mut rest).await.expect("read stdout");
        child
            .wait_with_output()
            .await
            .expect("wait for the program")
    };
    let mut out = tokio::time::timeout(timeout, finished)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {timeout:?}"));
    out.stdout = rest;
    (out, scene)
}

/// The JSON a driver that exited 0 printed; else a failure with its output.
pub fn result<T: DeserializeOwned>(script: &str, args: &[String], out: &std::process::Output) -> T {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}); stderr:\n{stderr}\nstdout:\n{stdout}",
        out.status
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("{script} printed no JSON result ({e}):\n{stdout}\nstderr:\n{stderr}")
    })
}

/// One command-line argument.
pub fn arg(s: impl ToString) -> String {
    s.to_string()
}

/// One HTTP attempt the SDK made, as the drivers' event hooks saw it (times in ms on one clock).
#[derive(Debug, Deserialize)]
pub struct Attempt {
    pub sent_ms: f64,
    pub received_ms: Option<f64>,
    pub status: Option<u16>,
    pub retry_after_ms: Option<f64>,
    pub retry_after: Option<f64>,
    /// The SDK's own `x-stainless-retry-count`: 0 on the first attempt of a call.
    pub retry_count: i64,
    pub path: String,
    pub error: Option<Value>,
}

/// Asserts that a Messages API answer the Anthropic SDK parsed (`stop_reason`, `usage`) was
/// generated whole: `max_tokens` tokens, or fewer only where the model itself ended its turn.
/// llama-server's Messages route drops `ignore_eos` (its `server_chat_convert_anthropic_to_oai`
/// passes only a few sampling fields on), so even the tiny random model may emit its end of
/// sequence before the limit: rarely, but a test that demanded the limit failed on it.
pub fn assert_anthropic_whole(answer: &Value, max_tokens: u64) {
    let output = answer["usage"]["output_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.output_tokens: {answer}"));
    match answer["stop_reason"].as_str() {
        Some("max_tokens") => assert_eq!(output, max_tokens, "{answer}"),
        Some("end_turn") => assert!(
            output < max_tokens,
            "ended its turn at {output} of {max_tokens} tokens: {answer}"
        ),
        other => panic!("stop_reason {other:?}, not max_tokens or end_turn: {answer}"),
    }
}

/// The LD_PRELOAD library of libfaketime, from its wheel in the venv of `python` (the Python
/// clients' or the console's; both pin it): a slotgate run under it, with `FAKETIME`, sees the wall
/// clock the test sets.
pub fn libfaketime(python: &Path) -> PathBuf {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import libfaketime, os; print(os.path.join(os.path.dirname(libfaketime.__file__), \
             'vendor', 'libfaketime', 'src', 'libfaketime.so.1'))",
        ])
        .output()
        .expect("run the venv's python");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.is_file(),
        "no libfaketime at {} ({}): is it in the venv's requirements?",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    path
}
