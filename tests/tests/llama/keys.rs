//! A key's life with the real clients (docs/keys.md): llama-server runs with `--api-key`, slotgate in
//! front on TCP with `--client-auth keys` and llama-server's key for its own calls. The OpenAI and
//! Anthropic SDKs are served with a key `slotgate key create` made; an invented key raises each
//! SDK's `AuthenticationError` from slotgate's own 401 (never llama-server's); a revoked key is
//! refused on its next call; a rotated key's old secret works until its grace ends; after a SIGKILL
//! and a restart, keys and revocations are as they were; no secret is in slotgate's log.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::gate::{free_port, Gate, RunningGate};
use slotgate_tests::llama::{serial, server_argv, LlamaServer};
use slotgate_tests::python::{arg, driver, python};
use slotgate_tests::wait::unique_dir;

const LLAMA_KEY: &str = "sk-llama-keys-upstream-5c2a";
const ADMIN: &str = "admin-token-llama-keys";

#[derive(serde::Deserialize, Debug)]
struct Calls {
    calls: Vec<Value>,
}

fn keyed_gate(state: &Path, port: u16, llama: &Path) -> Gate {
    let key_file = state.join("llama.key");
    std::fs::write(&key_file, format!("{LLAMA_KEY}\n")).unwrap();
    Gate::new()
        .listen(format!("tcp:127.0.0.1:{port}"))
        .upstream_path(llama)
        .opt("--client-auth", "keys")
        .opt("--state-dir", state.join("state").display())
        .opt("--upstream-api-key-file", key_file.display())
        .admin_token(ADMIN)
}

/// `slotgate ARGS --json`, which must succeed: what it printed.
fn cli(gate: &RunningGate, args: &[&str]) -> Value {
    let (ok, out, err) = gate.admin_cli(&[args, &["--json"]].concat());
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap()
}

/// One call of `sdk` (`openai` or `anthropic`) with `key`: its status, and the exception's name and
/// error body when it raised.
async fn call(port: u16, sdk: &str, key: &str) -> Value {
    let base = match sdk {
        "openai" => format!("http://127.0.0.1:{port}/v1"),
        _ => format!("http://127.0.0.1:{port}"),
    };
    let run: Calls = driver(
        "quota_calls.py",
        &[
            arg("--base-url"),
            arg(base),
            arg("--api-key"),
            arg(key),
            arg(sdk),
            arg("--calls"),
            arg(1),
            arg("--max-tokens"),
            arg(4),
        ],
    )
    .await;
    run.calls[0].clone()
}

/// Served by both SDKs.
async fn served(port: u16, key: &str, what: &str) {
    for sdk in ["openai", "anthropic"] {
        let c = call(port, sdk, key).await;
        assert_eq!(c["status"], 200, "{what}, {sdk}: {c}");
    }
}

/// Refused by slotgate, raised by both SDKs as their authentication error.
async fn refused(port: u16, key: &str, what: &str) {
    for sdk in ["openai", "anthropic"] {
        let c = call(port, sdk, key).await;
        assert_eq!(c["status"], 401, "{what}, {sdk}: {c}");
        assert_eq!(c["exception"], "AuthenticationError", "{what}, {sdk}: {c}");
        // slotgate's words, not llama-server's "Invalid API Key": it never got that far.
        assert!(
            !c["body"].to_string().contains("Invalid API Key"),
            "{what}: {c}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keys_life_with_the_openai_and_anthropic_sdks_on_the_real_llama_server() {
    python();
    let _one = serial().await;
    let mut argv = server_argv(2);
    argv.extend(["--api-key".to_owned(), LLAMA_KEY.to_owned()]);
    let llama = LlamaServer::start_argv(argv).await;
    let state = unique_dir("llama-keys");
    std::fs::create_dir_all(&state).unwrap();
    let port = free_port();
    let gate = keyed_gate(&state, port, llama.socket()).start().await;

    let alice = cli(&gate, &["key", "create", "--tenant", "alice"]);
    let (id, secret) = (
        alice["id"].as_str().unwrap().to_owned(),
        alice["secret"].as_str().unwrap().to_owned(),
    );
    let bob = cli(&gate, &["key", "create", "--tenant", "bob"]);
    let (bob_id, bob_secret) = (
        bob["id"].as_str().unwrap().to_owned(),
        bob["secret"].as_str().unwrap().to_owned(),
    );
    served(port, &secret, "a created key").await;
    refused(port, "sk-invented-by-a-stranger", "an invented key").await;
    // llama-server's own key is not a key of slotgate's: it does not get a caller in either.
    refused(port, LLAMA_KEY, "llama-server's key").await;

    // Revoked: its next call is refused.
    cli(&gate, &["key", "revoke", &bob_id]);
    refused(port, &bob_secret, "a revoked key").await;

    // Rotated with a grace of 20 s (a driver takes seconds to start): the old secret works until
    // it ends, then only the new one.
    let rotated_at = std::time::Instant::now();
    let rotated = cli(&gate, &["key", "rotate", &id, "--grace", "20s"]);
    let fresh = rotated["secret"].as_str().unwrap().to_owned();
    let c = call(port, "openai", &secret).await;
    assert!(
        rotated_at.elapsed() < Duration::from_secs(20),
        "too slow to tell"
    );
    assert_eq!(c["status"], 200, "the old secret within its grace: {c}");
    tokio::time::sleep(Duration::from_secs(21).saturating_sub(rotated_at.elapsed())).await;
    refused(port, &secret, "the old secret after its grace").await;
    served(port, &fresh, "the new secret").await;

    // SIGKILL, restart on the same state: as they were.
    gate.signal("KILL");
    drop(gate);
    let gate = keyed_gate(&state, port, llama.socket()).start().await;
    served(port, &fresh, "the rotated key after a SIGKILL").await;
    refused(port, &bob_secret, "the revoked key after a SIGKILL").await;

    let usage = gate.admin_get("/usage?format=csv").await.body;
    assert!(usage.contains(",alice,"), "{usage}");
    assert!(
        !usage.contains("bob") && !usage.contains("sha256:"),
        "{usage}"
    );
    let stderr = gate.stderr_text();
    for s in [&secret, &fresh, &bob_secret] {
        assert!(!stderr.contains(&s[s.len() - 48..]), "a secret in the log");
    }
    gate.assert_idle().await;
    llama.assert_idle().await;
}
