//! The admin plane against the real llama-server (docs/security.md), run as an operator runs it:
//! `--api-key` and `--slot-save-path`, slotgate holding the key (`--upstream-api-key-file`). Without
//! an admin token, llama-server's admin routes through slotgate answer as llama-server does without a
//! key, and only the caller's own key opens them; with `--admin-token-file`, the token does, the slot
//! file is written and the audit line names the caller. In front of the router, an unload without
//! credentials unloads nothing. `slotgate top` reads with the token and says what is wrong without
//! it. No log line of any of it holds the key or the token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};
use slotgate_tests::gate::{run, succeeded};
use slotgate_tests::llama::{chat, chat_usage, serial, server_argv, LlamaServer, RunningLlama};
use slotgate_tests::*;

const KEY: &str = "sk-llama-admin-plane-key";
const TOKEN: &str = "operator-admin-token-4f9c2a7e";

fn key_file() -> PathBuf {
    let file = unique_dir("key").join("llama.key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    file
}

/// llama-server with its key and a slot directory.
async fn llama_with_key(slot_dir: &Path) -> RunningLlama {
    let mut argv = server_argv(2);
    argv.extend([
        "--api-key".to_owned(),
        KEY.to_owned(),
        "--slot-save-path".to_owned(),
        slot_dir.display().to_string(),
    ]);
    LlamaServer::start_argv(argv).await
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

async fn audit_lines(gate: &RunningGate, n: usize) -> Vec<String> {
    eventually(Duration::from_secs(5), "the audit lines", || async {
        let lines: Vec<String> = gate
            .stderr_text()
            .lines()
            .filter(|l| l.contains("slotgate::audit"))
            .map(str::to_owned)
            .collect();
        (lines.len() >= n).then_some(lines)
    })
    .await
}

/// Neither the key nor the token in an answer, its body or its headers.
fn no_secret_in(r: &Response) {
    let headers = format!("{:?}", r.headers);
    for secret in [KEY, TOKEN] {
        assert!(
            !r.body.contains(secret) && !headers.contains(secret),
            "a secret in an answer: {r:?}"
        );
    }
}

fn assert_no_secret(log: &str) {
    assert!(!log.contains(KEY), "the upstream key in a log: {log}");
    assert!(!log.contains(TOKEN), "the admin token in a log: {log}");
}

/// One slot's cache, so a save has something to write.
async fn warm_a_slot(gate: &RunningGate) {
    let r = gate
        .client()
        .post_json_with_headers(
            CHAT,
            &chat("remember this", 4, false),
            &[("authorization", &format!("Bearer {KEY}"))],
        )
        .await;
    no_secret_in(&r);
    chat_usage(&r, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_token_slotgate_lends_llama_server_s_key_to_nobody() {
    let _one = serial().await;
    let slots_dir = unique_dir("slots");
    let llama = llama_with_key(&slots_dir).await;
    let gate = Gate::new()
        .opt("--upstream-api-key-file", key_file().display())
        .start_before(&llama)
        .await;
    gate.wait_status(Duration::from_secs(10), "slots learnt with the key", |s| {
        s["slots"]["total"] == 2
    })
    .await;
    warm_a_slot(&gate).await;
    let admin = gate.admin();

    // As llama-server answers a caller without a key: its own 401, and no file.
    let r = admin.get("/slots").await;
    no_secret_in(&r);
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(
        r.json(),
        json!({"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})
    );
    let save = r#"{"filename": "x.bin"}"#;
    let r = admin
        .send_with(Method::POST, "/slots/0?action=save", &[], save)
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(
        files_in(&slots_dir).is_empty(),
        "{:?}",
        files_in(&slots_dir)
    );
    // A wrong key of the caller's: the same.
    let r = admin
        .send_with(
            Method::POST,
            "/slots/0?action=erase",
            &[("authorization", "Bearer not-the-key")],
            "",
        )
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 401, "{}", r.body);

    // The caller's own valid key opens them, as it would llama-server itself.
    let bearer = format!("Bearer {KEY}");
    let r = admin
        .get_with("/slots", &[("authorization", &bearer)])
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json().as_array().map(Vec::len), Some(2));
    let r = admin
        .send_with(
            Method::POST,
            "/slots/0?action=save",
            &[("x-api-key", KEY)],
            save,
        )
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(files_in(&slots_dir), ["x.bin"]);

    let lines = audit_lines(&gate, 3).await;
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[0].contains("action=\"slot_save\"") && lines[0].contains("status=401"));
    assert!(
        lines[0].contains("result=\"upstream_4xx\"") && lines[0].contains("credentials=\"none\"")
    );
    assert!(
        lines[1].contains("action=\"slot_erase\"") && lines[1].contains("credentials=\"caller\"")
    );
    assert!(lines[2].contains("result=\"ok\"") && lines[2].contains("filename=\"x.bin\""));
    assert!(lines.iter().all(|l| l.contains("peer_addr=127.0.0.1:")));
    assert_no_secret(&gate.stderr_text());
    gate.assert_idle().await;
    llama.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_admin_token_the_operator_saves_a_slot_and_is_audited() {
    let _one = serial().await;
    let slots_dir = unique_dir("slots");
    let llama = llama_with_key(&slots_dir).await;
    // The admin listener on a Unix socket: the audit line names the caller's uid and pid.
    let gate = Gate::new()
        .admin_unix()
        .admin_token(TOKEN)
        .opt("--upstream-api-key-file", key_file().display())
        .start_before(&llama)
        .await;
    warm_a_slot(&gate).await;
    let bare = gate.admin().clone().without_bearer();
    let save = r#"{"filename": "op.bin"}"#;
    // Without the token, with a wrong one, with an empty one: slotgate's 401, nothing forwarded.
    for auth in [
        None,
        Some("Bearer wrong-token-00000000000"),
        Some("Bearer "),
    ] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", *a)).collect();
        let r = bare
            .send_with(Method::POST, "/slots/0?action=save", &headers, save)
            .await;
        no_secret_in(&r);
        assert_eq!(r.status, 401, "{auth:?}: {}", r.body);
        assert_eq!(r.json()["error"]["type"], "authentication_error");
        // llama-server's own key is no admin token either.
        let r = bare
            .get_with("/status", &[("authorization", &format!("Bearer {KEY}"))])
            .await;
        no_secret_in(&r);
        assert_eq!(r.status, 401, "{}", r.body);
    }
    assert!(files_in(&slots_dir).is_empty());

    // With it: forwarded with slotgate's key, the file written.
    let r = gate
        .admin()
        .send_with(
            Method::POST,
            "/slots/0?action=save",
            &[("x-request-id", "op-save-1")],
            save,
        )
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["filename"], "op.bin", "{}", r.body);
    assert_eq!(files_in(&slots_dir), ["op.bin"]);
    assert_eq!(r.header("x-request-id").as_deref(), Some("op-save-1"));
    let slots = gate.admin().get("/slots").await;
    assert_eq!(slots.status, 200, "{}", slots.body);

    let lines = audit_lines(&gate, 4).await;
    assert_eq!(lines.len(), 4, "three refused, one saved: {lines:#?}");
    for refused in &lines[..3] {
        assert!(refused.contains("result=\"unauthenticated\""), "{refused}");
        assert!(refused.contains("peer_uid=0"), "{refused}");
    }
    let saved = &lines[3];
    for part in [
        "action=\"slot_save\"",
        "result=\"ok\"",
        "status=200",
        "peer_uid=0",
        "peer_pid=",
        "slot=\"0\"",
        "filename=\"op.bin\"",
        "request_id=\"op-save-1\"",
        "credentials=\"slotgate_key\"",
    ] {
        assert!(saved.contains(part), "no {part} in {saved}");
    }
    let pid = std::process::id();
    assert!(
        saved.contains(&format!("peer_pid={pid}")),
        "this test's pid: {saved}"
    );
    assert_eq!(
        gate.metric(
            "slotgate_admin_actions_total",
            &[("action", "slot_save"), ("result", "ok")]
        )
        .await,
        Some(1.0)
    );
    assert!(!gate.status().await.to_string().contains(TOKEN));

    // `slotgate top` reads with the token, and says what is wrong without it.
    let admin_at = gate.admin_addr().to_owned();
    let token_file = gate.dir().join("admin.token");
    let once = run(&[
        "top",
        "--once",
        "--width",
        "100",
        "--admin",
        &admin_at,
        "--admin-token-file",
        token_file.to_str().unwrap(),
    ]);
    let text = succeeded(&once);
    assert!(text.contains("Slots 0/2"), "{text}");
    assert!(
        !text.contains("answered 401"),
        "llama-server's slots read too: {text}"
    );
    let without = run(&["top", "--once", "--admin", &admin_at]);
    assert_eq!(without.status.code(), Some(1));
    let err = String::from_utf8_lossy(&without.stderr);
    assert!(
        err.contains("answered 401") && err.contains("--admin-token-file"),
        "{err}"
    );
    assert_no_secret(&gate.stderr_text());
    gate.assert_idle().await;
    llama.assert_idle().await;
}

/// The router's models, by id: their `status.value`.
async fn model_states(llama: &RunningLlama) -> Vec<(String, String)> {
    let v: Value = llama.get("/models").await.json();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["status"]["value"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_front_of_the_router_an_unload_without_credentials_unloads_nothing() {
    let _one = serial().await;
    let llama = LlamaServer::start_router(&["alpha"], 1, &["--api-key", KEY]).await;
    let gate = Gate::new()
        .admin_token(TOKEN)
        .opt("--upstream-api-key-file", key_file().display())
        .queue_timeout("60s")
        .start_before(&llama)
        .await;
    let mut body = chat("hello", 4, false);
    body["model"] = json!("alpha");
    let r = gate
        .client()
        .post_json_with_headers(CHAT, &body, &[("authorization", &format!("Bearer {KEY}"))])
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        model_states(&llama).await,
        [("alpha".into(), "loaded".into())]
    );

    let unload = r#"{"model": "alpha"}"#;
    let bare = gate.admin().clone().without_bearer();
    for headers in [
        vec![],
        vec![("authorization", "Bearer guess-0000000000000000")],
    ] {
        let r = bare
            .send_with(Method::POST, "/models/unload", &headers, unload)
            .await;
        no_secret_in(&r);
        assert_eq!(r.status, 401, "{}", r.body);
    }
    // A client on the client listener: refused there whatever it brings.
    let r = gate
        .client()
        .send_with(
            Method::POST,
            "/models/unload",
            &[("authorization", &format!("Bearer {KEY}"))],
            unload,
        )
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 403, "{}", r.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        model_states(&llama).await,
        [("alpha".into(), "loaded".into())],
        "still loaded"
    );

    // The operator, with the token: unloaded.
    let r = gate
        .admin()
        .send_with(Method::POST, "/models/unload", &[], unload)
        .await;
    no_secret_in(&r);
    assert_eq!(r.status, 200, "{}", r.body);
    eventually(Duration::from_secs(10), "alpha unloaded", || async {
        (model_states(&llama).await == [("alpha".to_owned(), "unloaded".to_owned())]).then_some(())
    })
    .await;
    let lines = audit_lines(&gate, 3).await;
    assert!(
        lines.iter().all(|l| l.contains("action=\"model_unload\"")),
        "{lines:#?}"
    );
    assert!(lines[2].contains("model=\"alpha\"") && lines[2].contains("result=\"ok\""));
    assert_no_secret(&gate.stderr_text());
    gate.assert_idle().await;
}
