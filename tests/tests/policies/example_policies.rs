//! The example policies, built to wasm by `scripts/build-policies.sh`, load in the real host: ABI,
//! exports, imports, their example settings, and one evaluation each.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use slotgate_tests::gate::{run as slotgate, succeeded as ok};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::workspace;

/// Runs `slotgate <args>`, adding `--settings` with the example policy `name`'s example settings if
/// it has them.
fn with_example_settings(name: &str, args: &[&str]) -> Output {
    let settings = workspace()
        .join("policies")
        .join(name)
        .join("settings.example.json");
    let settings = settings.display().to_string();
    let mut args = args.to_vec();
    if Path::new(&settings).exists() {
        args.extend(["--settings", &settings]);
    }
    slotgate(&args)
}

const POLICIES: &[&str] = &[
    "token-budget",
    "tenant-priority",
    "request-guard",
    "wat-deny-embeddings",
];

#[test]
fn every_example_policy_passes_check_with_its_example_settings() {
    for name in POLICIES {
        let module = slotgate_tests::wat::built(name).display().to_string();
        let out = ok(&with_example_settings(name, &["policy", "check", &module]));
        assert!(out.contains("ABI v1"), "{name}: {out}");
    }
}

#[test]
fn sdk_policies_decide_in_the_real_host() {
    let dir = unique_dir("example-policies");
    let chat = dir.join("chat.json");
    std::fs::write(
        &chat,
        r#"{"method":"POST","path":"/v1/chat/completions","prompt_chars":400,"prompt_tokens_estimate":100,"max_tokens":4000,"peer":{"uid":1000,"gid":1000}}"#,
    )
    .unwrap();
    let embed = dir.join("embed.json");
    std::fs::write(
        &embed,
        r#"{"method":"POST","path":"/v1/embeddings","prompt_chars":4,"prompt_tokens_estimate":1}"#,
    )
    .unwrap();

    let eval = |name: &str, input: &PathBuf| -> Value {
        let module = slotgate_tests::wat::built(name).display().to_string();
        let input = input.display().to_string();
        let out = with_example_settings(
            name,
            &["policy", "eval", "--policy", &module, "--input", &input],
        );
        ok(&out);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(report["fuel_consumed"].as_u64().unwrap() > 0, "{report}");
        report["decision"].clone()
    };

    let guard = eval("request-guard", &chat);
    assert_eq!(guard["verdict"], "allow", "{guard}");
    assert!(
        guard["mutations"]["cap_max_tokens"].as_u64().is_some(),
        "request-guard caps max_tokens: {guard}"
    );
    let budget = eval("token-budget", &chat);
    assert!(
        budget["cost"].as_u64().unwrap() >= 100,
        "token-budget charges the estimate: {budget}"
    );
    let tenant = eval("tenant-priority", &chat);
    assert!(tenant["priority"].is_i64(), "{tenant}");
    let wat = eval("wat-deny-embeddings", &embed);
    assert_eq!(wat["verdict"], "deny", "{wat}");
    assert_eq!(wat["status"], 403, "{wat}");
    assert_eq!(eval("wat-deny-embeddings", &chat)["verdict"], "allow");
}
