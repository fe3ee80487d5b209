//! The AssemblyScript example policies (policies-as/, built by `scripts/build-policies-as.sh` to
//! `<target>/policies/as-*.wasm`) in the real slotgate: `slotgate policy check|eval`, then each one
//! in front of the fake llama-server, checked the way the Rust originals are (policy_complete.rs,
//! usage_accounting.rs, cost.rs): token-budget refuses a dry tenant with 429 and Retry-After and is
//! refunded through `on_complete`; request-guard refuses paths, models, prompts and `max_tokens`
//! over its limits and caps and isolates what it lets through. Both serve from a snapshot taken
//! after they parsed their settings (`keeps_settings`).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use slotgate_tests::budget::send_until_refunded;
use slotgate_tests::errors::{assert_error, assert_error_says, retry_after};
use slotgate_tests::fake_upstream::{FakeUpstream, RunningUpstream};
use slotgate_tests::gate::{hash_key, run as slotgate, succeeded as ok, Gate, RunningGate};
use slotgate_tests::request::{Req, CHAT};
use slotgate_tests::wait::{eventually, unique_dir};

/// `<target>/policies/as-<name>.wasm`, as `scripts/build-policies-as.sh` leaves it.
fn built(name: &str) -> PathBuf {
    slotgate_tests::wat::built_as(name)
}

fn example_settings(name: &str) -> PathBuf {
    slotgate_tests::workspace()
        .join("policies-as")
        .join(name)
        .join("settings.example.json")
}

/// One slot in front of an instant fake, with `name` (AssemblyScript) and its `settings` (TOML).
async fn start(name: &str, settings: &str) -> (RunningUpstream, RunningGate) {
    start_with(name, settings, FakeUpstream::instant()).await
}

async fn start_with(
    name: &str,
    settings: &str,
    fake: FakeUpstream,
) -> (RunningUpstream, RunningGate) {
    let (up, gate) = Gate::new()
        .slots(1)
        .policies(&[(&built(name), Some(settings))])
        .start_with(fake)
        .await;
    let status = gate.status().await;
    assert_eq!(
        status["policies"]["chain"][0]["preinitialised"], true,
        "{name} keeps its parsed settings, so it serves from a snapshot: {status}"
    );
    (up, gate)
}

#[test]
fn both_pass_policy_check_with_their_example_settings_and_decide_in_policy_eval() {
    for (name, on_complete) in [
        ("token-budget", "exported"),
        ("request-guard", "not exported"),
    ] {
        let module = built(name).display().to_string();
        let settings = example_settings(name).display().to_string();
        let out = ok(&slotgate(&[
            "policy",
            "check",
            &module,
            "--settings",
            &settings,
        ]));
        assert!(out.contains("ABI v1"), "{name}: {out}");
        assert!(out.contains("validate_settings: passed"), "{name}: {out}");
        assert!(
            out.contains(&format!("on_complete: {on_complete}")),
            "{name}: {out}"
        );
    }
    // Settings the policy refuses fail the check, with the policy's own message.
    let dir = unique_dir("as-check");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"capacity": 0, "refill_per_second": 1}"#).unwrap();
    let out = slotgate(&[
        "policy",
        "check",
        &built("token-budget").display().to_string(),
        "--settings",
        &bad.display().to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("the default budget: capacity must be positive"),
        "{text}"
    );

    let input = |uid: u32| {
        let path = dir.join(format!("chat-{uid}.json"));
        std::fs::write(
            &path,
            format!(
                r#"{{"method":"POST","path":"/v1/chat/completions","model":"qwen2.5-7b-instruct","prompt_chars":400,"prompt_tokens_estimate":100,"max_tokens":4000,"peer":{{"uid":{uid},"gid":{uid}}}}}"#
            ),
        )
        .unwrap();
        path
    };
    let eval = |name: &str, input: &Path| -> Value {
        let out = slotgate(&[
            "policy",
            "eval",
            "--policy",
            &built(name).display().to_string(),
            "--settings",
            &example_settings(name).display().to_string(),
            "--input",
            &input.display().to_string(),
        ]);
        ok(&out);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["canary"], "passed", "{report}");
        assert!(report["fuel_consumed"].as_u64().unwrap() > 0, "{report}");
        report["decision"].clone()
    };
    let guard = eval("request-guard", &input(1000));
    assert_eq!(guard["verdict"], "allow", "{guard}");
    assert_eq!(guard["mutations"]["cap_max_tokens"], 2048, "{guard}");
    assert_eq!(guard["mutations"]["disable_prompt_cache"], true, "{guard}");
    let budget = eval("token-budget", &input(1000));
    assert_eq!(
        (&budget["verdict"], &budget["cost"]),
        (&json!("allow"), &json!(4100)),
        "the default budget of 20000: {budget}"
    );
    // The example settings give uid:1001 a budget of its own, 4000: too small for 4100.
    let small = eval("token-budget", &input(1001));
    assert_eq!(small["status"], 403, "{small}");
    assert!(
        small["message"]
            .as_str()
            .unwrap()
            .contains("more than the budget of 4000 holds"),
        "{small}"
    );
}

/// A tenant that has spent its bucket is refused with 429 `policy_denied` and a Retry-After of the
/// seconds until the bucket holds the request again; others keep their own buckets; a request that
/// could never fit is 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_budget_refuses_a_dry_tenant_with_retry_after() {
    let key = "sk-as-tenant";
    let settings = format!(
        r#"{{ capacity = 1000, refill_per_second = 100, tenants = {{ "{}" = {{ capacity = 5000, refill_per_second = 1 }} }} }}"#,
        hash_key(key)
    );
    let (up, gate) = start("token-budget", &settings).await;
    let client = gate.client();

    // Charged 901 (1 estimated prompt token + 900); it really used all of it, so nothing comes back.
    let first = Req::chat("first")
        .set("max_tokens", 900)
        .prompt_tokens(1)
        .completion_tokens(900);
    let resp = client.post_json(CHAT, &first.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);

    // About 100 left (99 plus what refilled since): 901 more need 8 to 9 seconds of refill.
    let second = Req::chat("second").set("max_tokens", 900).json();
    let resp = client.post_json(CHAT, &second).await;
    assert_error_says(&resp, 429, "policy_denied", "token budget exhausted");
    let wait = retry_after(&resp);
    assert!((7..=9).contains(&wait), "Retry-After {wait}: {}", resp.body);

    // The API key's tenant has a budget of its own.
    let keyed = Req::chat("keyed").set("max_tokens", 4000).api_key(key);
    let keyed = client
        .post_json_with_headers(CHAT, &keyed.json(), keyed.headers())
        .await;
    assert_eq!(keyed.status, 200, "{}", keyed.body);

    // More than the bucket could ever hold: refused for good.
    let huge = client
        .post_chat(&Req::chat("huge").set("max_tokens", 5000))
        .await;
    assert_error_says(&huge, 403, "policy_denied", "lower max_tokens");
    assert_eq!(
        up.tags(),
        ["first", "keyed"],
        "refused requests are never forwarded"
    );
    gate.assert_settled(&up, 1).await;
}

/// With no refill the bucket comes back only through `on_complete`: the unused part of each
/// estimate is refunded from the usage the upstream reported. Without it a second 600-token request
/// could never be admitted; a request needing the whole bucket still cannot, and gets no Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_budget_is_refunded_from_actual_usage() {
    let (up, gate) = start("token-budget", "{ capacity = 1000, refill_per_second = 0 }").await;
    let client = gate.client();
    // Charged 601 up front; the answer used 15 (10 prompt + 5 completion).
    let big = Req::chat("first")
        .set("max_tokens", 600)
        .prompt_tokens(10)
        .completion_tokens(5);
    let resp = client.post_json(CHAT, &big.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);

    let second = Req::chat("second")
        .set("max_tokens", 600)
        .prompt_tokens(10)
        .completion_tokens(5)
        .json();
    let resp = send_until_refunded(&client, &second, "never refunded").await;
    assert_eq!(resp.status, 200, "{}", resp.body);

    // 1000 - 15 - 601 now, 970 once the second is settled: never the 1000 this one needs.
    let whole = client
        .post_chat(&Req::chat("whole").set("max_tokens", 999))
        .await;
    assert_error(&whole, 429, "policy_denied");
    assert_eq!(
        whole.header("retry-after"),
        None,
        "a spent fixed quota: retrying will not help"
    );
    assert_eq!(up.tags(), ["first", "second"]);
    gate.assert_settled(&up, 1).await;
}

/// What request-guard refuses, each with a 403 that says which rule, never forwarded; what it lets
/// through is capped and isolated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_guard_refuses_what_its_settings_exclude_and_shapes_the_rest() {
    let settings = r#"{ max_tokens = 100, max_prompt_chars = 200, allowed_paths = ["/v1/*"], denied_paths = ["/v1/embeddings"], allowed_models = ["fake", "qwen-*"], cache_isolation = true }"#;
    let (up, gate) = start("request-guard", settings).await;
    let client = gate.client();

    let refused = |resp: &slotgate_tests::Response, why: &str| {
        assert_error(resp, 403, "policy_denied");
        assert!(resp.body.contains(why), "{why}: {}", resp.body);
    };
    let embed = client
        .post_json(
            "/v1/embeddings",
            &json!({"model": "fake", "input": "hello", "fake_tag": "embed"}),
        )
        .await;
    refused(&embed, "/v1/embeddings is not served here");
    let completion = client
        .post_json(
            "/completion",
            &json!({"prompt": "hi", "n_predict": 4, "fake_tag": "completion"}),
        )
        .await;
    refused(&completion, "/completion is not served here");
    let model = client
        .post_chat(&Req::chat("model").set("model", "gpt-4o"))
        .await;
    refused(&model, "model `gpt-4o` is not served here");
    let long = Req::chat("long").set(
        "messages",
        json!([{"role": "user", "content": "x".repeat(201)}]),
    );
    refused(
        &client.post_json(CHAT, &long.json()).await,
        "the prompt has 201 characters; the limit is 200",
    );
    assert_eq!(up.count(), 0, "refused requests never reach the upstream");

    // Let through: max_tokens lowered to the cap, the prompt cache off, the slot choice dropped.
    let shaped = Req::chat("shaped")
        .set("model", "qwen-7b")
        .set("max_tokens", 5000)
        .set("id_slot", 0);
    let resp = client.post_json(CHAT, &shaped.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let body = up.request_with_tag("shaped").expect("forwarded").body;
    assert_eq!(body["max_tokens"], 100, "{body}");
    assert_eq!(body["cache_prompt"], false, "{body}");
    assert!(body.get("id_slot").is_none(), "{body}");
    // A request that names no bound is bounded too.
    let open = client.post_chat(&Req::chat("open")).await;
    assert_eq!(open.status, 200, "{}", open.body);
    let body = up.request_with_tag("open").expect("forwarded").body;
    assert_eq!(body["max_tokens"], 100, "{body}");
    assert_eq!(up.tags(), ["shaped", "open"]);
    gate.assert_settled(&up, 1).await;
}

/// `over_max_tokens = "deny"` refuses what would be capped, on the `max_tokens` llama-server obeys
/// (`n_predict` wins over `max_tokens`), and lowers every key present on what it lets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_guard_denies_over_max_tokens_when_told_to() {
    let (up, gate) = start(
        "request-guard",
        r#"{ max_tokens = 100, over_max_tokens = "deny" }"#,
    )
    .await;
    let client = gate.client();
    let sneaky = Req::chat("sneaky")
        .set("max_tokens", 1)
        .set("n_predict", 500);
    let resp = client.post_json(CHAT, &sneaky.json()).await;
    assert_error_says(
        &resp,
        403,
        "policy_denied",
        "max_tokens 500 is over the limit of 100",
    );
    let modest = Req::chat("modest")
        .set("max_tokens", 500)
        .set("n_predict", 1);
    let resp = client.post_json(CHAT, &modest.json()).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let seen = up.request_with_tag("modest").expect("forwarded");
    assert_eq!(
        (&seen.body["max_tokens"], &seen.body["n_predict"]),
        (&json!(100), &json!(1)),
        "{}",
        seen.body
    );
    assert_eq!(up.tags(), ["modest"]);
    gate.assert_settled(&up, 1).await;
}

/// A `max_prompt_tokens` limit asks slotgate for the exact count (`needs_prompt_tokens`): even with
/// a free slot every request is counted before the chain, and the refusal names the exact count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_guard_asks_for_the_exact_prompt_count() {
    let (up, gate) = start_with(
        "request-guard",
        "{ max_prompt_tokens = 20 }",
        FakeUpstream::instant().n_ctx(1000),
    )
    .await;
    let tokenized = || {
        up.internal_seen()
            .iter()
            .filter(|p| *p == slotgate_tests::fake_upstream::CHAT_COUNT)
            .count()
    };
    let chat = |content: &str| json!({"messages": [{"role": "user", "content": content}], "max_tokens": 8});
    // 40 characters: 11 tokens by the fake's tokenizer, counted although the slot is free.
    let resp = gate.client().post_json(CHAT, &chat(&"y".repeat(40))).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    eventually(
        std::time::Duration::from_secs(5),
        "the prompt was counted",
        || async { (tokenized() >= 1).then_some(()) },
    )
    .await;
    // 80 characters: 20 tokens by the estimate, within the limit; 21 exactly, over it.
    let over = gate.client().post_json(CHAT, &chat(&"w".repeat(80))).await;
    assert_error(&over, 403, "policy_denied");
    assert!(
        over.body
            .contains("the prompt has 21 tokens; the limit is 20"),
        "decided on the exact count: {}",
        over.body
    );
    assert_eq!(
        up.count(),
        1,
        "the refused request never reached the upstream"
    );
    gate.assert_settled(&up, 1).await;
}
