//! Hostile policies in guest languages (v2 components with a Python or JavaScript runtime inside):
//! reaching for a file, a socket or the environment finds the empty WASI context (each fixture
//! catches the failure and denies, saying what happened), an endless loop and a memory bomb end
//! with their kind, and beside them in a chain the other policies and the requests go on.
//!
//! The fixtures are policies-py/hostile and policies-ts/hostile, built by
//! `scripts/build-policies-py.sh` and `scripts/build-policies-ts.sh`.

use std::path::Path;

use serde_json::Value;
use slotgate_tests::gate::Gate;
use slotgate_tests::request::Req;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

fn cache_dir() -> String {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    format!("{home}/.cache/slotgate/policy-cache")
}

/// `slotgate policy eval` of `component` on a chat request, with a secret in slotgate's own
/// environment: the decision, or the error.
fn eval(component: &Path) -> Result<Value, String> {
    eval_with(component, &[])
}

/// [`eval`] with more arguments for `slotgate policy eval`.
fn eval_with(component: &Path, more: &[&str]) -> Result<Value, String> {
    let dir = unique_dir("hostile-guest");
    let input = dir.join("input.json");
    // The model that turns `spin` and `memory_bomb` hostile (the others ignore it).
    std::fs::write(
        &input,
        r#"{"path":"/v1/chat/completions","model":"HOSTILE"}"#,
    )
    .unwrap();
    let out = slotgate_tests::gate::command()
        .args([
            "policy",
            "eval",
            "--policy",
            &component.display().to_string(),
            "--input",
            &input.display().to_string(),
            "--cache-dir",
            &cache_dir(),
        ])
        .args(more)
        .env("SLOTGATE_TEST_SECRET", "do-not-leak")
        .output()
        .unwrap();
    if out.status.success() {
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        Ok(report["decision"].clone())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn denial(d: &Value) -> String {
    assert_eq!(d["verdict"], "deny", "{d}");
    d["message"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn a_python_policy_finds_no_file_socket_or_environment_and_is_bounded() {
    let open = eval(&wat::built("hostile-py-open-file")).unwrap();
    let msg = denial(&open);
    assert!(msg.starts_with("open failed:"), "{msg}");

    let socket = eval(&wat::built("hostile-py-socket")).unwrap();
    let msg = denial(&socket);
    assert!(msg.starts_with("connect failed:"), "{msg}");

    let env = eval(&wat::built("hostile-py-environ")).unwrap();
    let msg = denial(&env);
    assert!(msg.contains("saw 0 environment variables"), "{msg}");
    assert!(!msg.contains("do-not-leak"), "{msg}");

    let spin = eval(&wat::built("hostile-py-spin")).unwrap_err();
    assert!(
        spin.contains("(fuel)") || spin.contains("(timeout)"),
        "{spin}"
    );
    let bomb = eval(&wat::built("hostile-py-memory-bomb")).unwrap_err();
    assert!(bomb.contains("(memory)"), "{bomb}");

    // `sys.exit` tears the interpreter down first, which spends the default fuel (docs/policies.md);
    // given ten times the fuel it reaches `wasi:cli/exit`, a trap.
    let exit = wat::built("hostile-py-exit");
    let spent = eval(&exit).unwrap_err();
    assert!(spent.contains("(fuel)"), "{spent}");
    let exited = eval_with(&exit, &["--fuel", "100000000", "--deadline", "5s"]).unwrap_err();
    assert!(
        exited.contains("(trap)") && exited.contains("Exited with i32 exit status"),
        "{exited}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn beside_a_spinning_python_policy_the_chain_and_requests_go_on() {
    let dir = unique_dir("hostile-guest-chain");
    let toml = format!(
        r#"[[policy]]
path = "{spin}"
on-error = "allow"

[[policy]]
path = "{budget}"
settings = {{ capacity = 100000, refill_per_second = 0 }}
"#,
        spin = wat::built("hostile-py-spin").display(),
        budget = wat::built("token-budget-v2").display(),
    );
    let config = dir.join("slotgate.toml");
    std::fs::write(&config, toml).unwrap();
    let (up, gate) = Gate::new()
        .slots(2)
        .config_file(&config)
        .env("SLOTGATE_POLICY_CACHE_DIR", &cache_dir())
        .start_instant()
        .await;
    // Hostile requests fail the spinning policy, which fails open; the budget still decides.
    for i in 0..4 {
        let resp = gate
            .client()
            .post_chat(&Req::chat(&format!("beside-{i}")).set("model", "HOSTILE"))
            .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    let metrics = gate.metrics().await;
    let mut failed = 0.0;
    for kind in ["fuel", "timeout"] {
        failed += metrics
            .value(
                "slotgate_policy_errors_total",
                &[("policy", "hostile-py-spin"), ("kind", kind)],
            )
            .unwrap_or(0.0);
    }
    assert_eq!(failed, 4.0, "{}", metrics.text);
    metrics.assert_present(
        "slotgate_policy_decisions_total",
        &[("policy", "token-budget-v2"), ("decision", "allow")],
        4.0,
    );
    gate.assert_settled(&up, 2).await;
}

#[test]
fn a_typescript_policy_finds_no_environment_file_or_network_and_is_bounded() {
    let probe = eval(&wat::built("hostile-ts-fetch")).unwrap();
    let msg = denial(&probe);
    assert!(msg.contains("process.env: blocked"), "{msg}");
    assert!(msg.contains("require('fs'): blocked"), "{msg}");
    assert!(
        !msg.contains("ALLOWED") && !msg.contains("do-not-leak"),
        "{msg}"
    );

    let spin = eval(&wat::built("hostile-ts-spin")).unwrap_err();
    assert!(
        spin.contains("(fuel)") || spin.contains("(timeout)"),
        "{spin}"
    );
    let bomb = eval(&wat::built("hostile-ts-memory-bomb")).unwrap_err();
    assert!(bomb.contains("(memory)"), "{bomb}");
    // 50 MiB of message cannot even be built inside the sandbox.
    let huge = eval(&wat::built("hostile-ts-huge-message")).unwrap_err();
    assert!(
        huge.contains("(memory)") || huge.contains("(fuel)") || huge.contains("(invalid_output)"),
        "{huge}"
    );
}
