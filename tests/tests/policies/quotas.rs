//! Calendar quotas (docs/quotas.md): the `quota` example policy in the real host on the fake
//! upstream. Every answer carries the tenant's allowance as rate-limit headers in the API's own
//! names; a spent quota is a 429 `quota_exceeded` whose `Retry-After` and reset point at the end of
//! the UTC day, marked `x-should-retry: false`; `/status` shows what is left; the soft limit is
//! counted; a SIGKILL keeps what was spent. (The SDKs reading it all, and a day ending on a clock
//! the test sets, are in `llama/quotas.rs`.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use slotgate_tests::errors::assert_error;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{Gate, RunningGate};
use slotgate_tests::request::Req;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

/// Two requests a day per tenant, and plenty of tokens.
const SETTINGS: &str = "{ period = \"day\", requests = 2, tokens = 100000 }";

fn gate(state_dir: &str) -> Gate {
    Gate::new()
        .opt("--state-dir", state_dir)
        .policies(&[(&wat::built("quota"), Some(SETTINGS))])
}

/// Seconds from now to the next UTC midnight, and that midnight in Unix seconds.
fn to_midnight() -> (u64, u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let midnight = (now / 86_400 + 1) * 86_400;
    (midnight - now, midnight)
}

/// OpenAI's reset duration (`20ms`, `12s`, `6m0s`, `1h0m0s`) in seconds.
fn duration_secs(text: &str) -> u64 {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<u64>().unwrap().div_ceil(1000);
    }
    let (mut total, mut n) = (0, String::new());
    for c in text.chars() {
        match c {
            '0'..='9' => n.push(c),
            'h' | 'm' | 's' => {
                let unit = match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                total += n.parse::<u64>().unwrap() * unit;
                n.clear();
            }
            other => panic!("`{other}` in the duration {text:?}"),
        }
    }
    total
}

/// `secs` is within two seconds of `want` (the clock moves between reading and answering).
fn near(secs: u64, want: u64, what: &str) {
    assert!(
        secs.abs_diff(want) <= 2,
        "{what}: {secs} s, expected about {want} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quota_speaks_in_rate_limit_headers_and_refuses_until_midnight_without_retries() {
    let up = FakeUpstream::instant().start().await;
    let dir = unique_dir("quota").join("state");
    let gate = gate(dir.to_str().unwrap()).upstream(&up).start().await;
    let client = gate.client();

    // Allowed: the allowance after this request, in OpenAI's names.
    let resp = client.post_chat(&Req::chat("q1")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let h = |name: &str| {
        resp.header(name)
            .unwrap_or_else(|| panic!("no {name}: {:?}", resp.headers))
    };
    assert_eq!(h("x-ratelimit-limit-requests"), "2");
    assert_eq!(h("x-ratelimit-remaining-requests"), "1");
    assert_eq!(h("x-ratelimit-limit-tokens"), "100000");
    let left: u64 = h("x-ratelimit-remaining-tokens").parse().unwrap();
    assert!(left < 100_000 && left > 90_000, "{left}");
    let (secs, midnight) = to_midnight();
    near(
        duration_secs(&h("x-ratelimit-reset-requests")),
        secs,
        "reset",
    );
    assert_eq!(resp.header("x-should-retry"), None, "only on a refusal");

    let resp = client.post_chat(&Req::chat("q2")).await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );

    // Spent: 429 quota_exceeded until midnight, not to be retried before.
    let resp = client.post_chat(&Req::chat("q3")).await;
    assert_eq!(
        assert_error(&resp, 429, "quota_exceeded"),
        "rate_limit_error"
    );
    assert_eq!(resp.header("x-should-retry").as_deref(), Some("false"));
    let retry: u64 = resp.header("retry-after").unwrap().parse().unwrap();
    near(retry, to_midnight().0, "Retry-After");
    let midnight_text = jiff::Timestamp::from_second(midnight as i64)
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    assert!(
        resp.body.contains(&midnight_text),
        "the message says when: {}",
        resp.body
    );
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );

    // On the Messages API: Anthropic's names, the reset as an RFC 3339 time.
    let msg =
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let resp = client.post_json("/v1/messages", &msg).await;
    assert_eq!(resp.status, 429, "{}", resp.body);
    assert!(resp.body.contains("\"rate_limit_error\""), "{}", resp.body);
    assert_eq!(
        resp.header("anthropic-ratelimit-requests-limit").as_deref(),
        Some("2")
    );
    assert_eq!(
        resp.header("anthropic-ratelimit-requests-remaining")
            .as_deref(),
        Some("0")
    );
    assert_eq!(
        resp.header("anthropic-ratelimit-requests-reset"),
        Some(midnight_text.clone())
    );
    assert_eq!(resp.header("x-ratelimit-limit-requests"), None);

    // /status shows what is left, without taking it.
    let s = gate.status().await;
    let quotas = s["state"]["quotas"]["emptiest"].as_array().unwrap().clone();
    let requests = quotas
        .iter()
        .find(|q| q["key"].as_str().unwrap().starts_with("requests:"))
        .unwrap_or_else(|| panic!("no request quota in {s}"));
    assert_eq!(requests["policy"], "quota");
    assert_eq!(requests["period"], "day");
    assert_eq!(requests["left"], 0.0);
    assert_eq!(requests["limit"], 2.0);
    assert_eq!(requests["window_end"], midnight_text.as_str());
    assert_eq!(
        s["state"]["buckets"]["count"], 0,
        "quota windows are not listed as buckets"
    );
    // The second request took the quota past its soft limit (0.8 of 2).
    assert_eq!(
        gate.metric(
            "slotgate_policy_events_total",
            &[("policy", "quota"), ("event", "soft_limit")]
        )
        .await,
        Some(1.0)
    );
    gate.assert_settled(&up, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_quota_stays_spent_across_a_sigkill() {
    let up = FakeUpstream::instant().start().await;
    let dir = unique_dir("quota-kill").join("state");
    let dir = dir.to_str().unwrap();
    let mut first = gate(dir).upstream(&up).start().await;
    let client = first.client();
    for tag in ["k1", "k2"] {
        assert_eq!(client.post_chat(&Req::chat(tag)).await.status, 200);
    }
    assert_eq!(first.quota_left("requests").await, 0.0);
    // Past a flush interval (100 ms), SIGKILL: nothing runs on the way out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;

    let gate = gate(dir).upstream(&up).start().await;
    assert_eq!(
        gate.quota_left("requests").await,
        0.0,
        "the same after the kill"
    );
    let resp = gate.client().post_chat(&Req::chat("k3")).await;
    assert_error(&resp, 429, "quota_exceeded");
    gate.assert_settled(&up, 1).await;
}

const TOKEN: &str = "quota-admin-token-0123456789";
const READ_TOKEN: &str = "quota-read-token-0123456789ab";

/// `slotgate ARGS` against `gate`'s admin listener with the token in `token_file`.
fn cli(gate: &RunningGate, token_file: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(slotgate_tests::gate::binary_path())
        .args(args)
        .arg("--admin")
        .arg(gate.admin_addr())
        .arg("--admin-token-file")
        .arg(token_file)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_sees_and_changes_quotas_and_reads_the_ledger_through_the_cli() {
    let dir = unique_dir("quota-admin");
    let (token, read_token, audit) = (
        dir.join("admin.token"),
        dir.join("read.token"),
        dir.join("audit.jsonl"),
    );
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::write(&read_token, format!("{READ_TOKEN}\n")).unwrap();
    let state = dir.join("state");
    let gate_on = || {
        gate(state.to_str().unwrap())
            .admin_token(TOKEN)
            .opt("--admin-read-token-file", read_token.display())
            .opt("--audit-log", audit.display())
    };
    let up = FakeUpstream::instant().start().await;
    let mut first = gate_on().upstream(&up).start().await;
    let client = first.client();
    for tag in ["a1", "a2"] {
        let resp = client.post_chat(&Req::chat(tag).completion_tokens(7)).await;
        assert_eq!(resp.status, 200);
    }
    assert_error(
        &client.post_chat(&Req::chat("a3")).await,
        429,
        "quota_exceeded",
    );

    // The read-only token lists: two requests of two used.
    let (ok, out, err) = cli(&first, &read_token, &["quota", "list", "--json"]);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let q = list["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["key"].as_str().unwrap().starts_with("requests:"))
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    let key = q["key"].as_str().unwrap().to_owned();
    assert_eq!(
        (q["limit"].as_f64(), q["used"].as_f64(), q["left"].as_f64()),
        (Some(2.0), Some(2.0), Some(0.0))
    );
    assert_eq!(q["limit_set_by"], "policy");
    let (ok, table, _) = cli(&first, &read_token, &["quota", "list", "--policy", "quota"]);
    assert!(
        ok && table.contains(&key) && table.contains("2 quotas"),
        "{table}"
    );
    // ... but may not change anything: 403, and the refusal is audited.
    let target = ["--policy", "quota", "--key", &key, "--period", "day"];
    let (ok, _, err) = cli(
        &first,
        &read_token,
        &[&["quota", "set"][..], &target, &["5"]].concat(),
    );
    assert!(!ok && err.contains("403"), "{err}");

    // The admin token: a limit of 5 leaves 3 (2 used), and the tenant is served again.
    let (ok, out, err) = cli(
        &first,
        &token,
        &[&["quota", "set"][..], &target, &["5"]].concat(),
    );
    assert!(ok, "{err}");
    assert!(out.contains(": 3 left of 5"), "{out}");
    let resp = client
        .post_chat(&Req::chat("a4").completion_tokens(7))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("x-ratelimit-limit-requests").as_deref(),
        Some("5")
    );
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("2")
    );
    // Top up one back, then reset to whole.
    let (ok, out, _) = cli(
        &first,
        &token,
        &[&["quota", "top-up"][..], &target, &["1"]].concat(),
    );
    assert!(ok && out.contains(": 3 left of 5"), "{out}");
    let (ok, out, _) = cli(&first, &token, &[&["quota", "reset"][..], &target].concat());
    assert!(ok && out.contains(": 5 left of 5"), "{out}");
    // A bad period is refused with its reason.
    let (ok, _, err) = cli(
        &first,
        &token,
        &[
            "quota",
            "reset",
            "--policy",
            "quota",
            "--key",
            &key,
            "--period",
            "fortnight",
        ],
    );
    assert!(
        !ok && err.contains("expected hour, day, week or month"),
        "{err}"
    );
    // So is a zone the time zone database does not know: the caller's mistake, a 400.
    let (ok, _, err) = cli(
        &first,
        &token,
        &[
            "quota",
            "reset",
            "--policy",
            "quota",
            "--key",
            &key,
            "--period",
            "day@Mars/Olympus_Mons",
        ],
    );
    assert!(!ok && err.contains("answered 400"), "{err}");

    // The ledger: three requests reached the fake (the refused one did not), 7 tokens out each.
    first.assert_settled(&up, 1).await;
    let usage = first.admin_get("/usage").await;
    assert_eq!(usage.status, 200, "{}", usage.body);
    let v: serde_json::Value = serde_json::from_str(&usage.body).unwrap();
    assert_eq!(v["total"]["requests"], 3, "{v}");
    assert_eq!(v["total"]["completion_tokens"], 21, "{v}");
    let (ok, csv, err) = cli(&first, &read_token, &["usage", "--csv"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "day,tenant,team,key,model,requests,prompt_tokens,cached_tokens,completion_tokens"
    );
    assert_eq!(lines.len(), 2, "{csv}");
    let fields: Vec<&str> = lines[1].split(',').collect();
    assert_eq!((fields[5], fields[8]), ("3", "21"), "{csv}");
    let bad = first.admin_get("/usage?from=yesterday").await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    // Every change in the audit file, the refused one too, naming the quota.
    let text = std::fs::read_to_string(&audit).unwrap();
    let actions: Vec<(String, String)> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["result"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("quota_set".to_owned(), "forbidden".to_owned()),
            ("quota_set".into(), "ok".into()),
            ("quota_top_up".into(), "ok".into()),
            ("quota_reset".into(), "ok".into()),
            ("quota_reset".into(), "bad_request".into()),
            ("quota_reset".into(), "bad_request".into()),
        ],
        "{text}"
    );
    assert!(text.contains(&format!("key={key}")), "{text}");

    // A SIGKILL past a flush keeps the operator's limit and the ledger.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(5)).await;
    let gate = gate_on().upstream(&up).start().await;
    let list = gate.admin_get("/quotas").await;
    let v: serde_json::Value = serde_json::from_str(&list.body).unwrap();
    let q = v["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["key"] == key.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (
            q["limit"].as_f64(),
            q["left"].as_f64(),
            q["limit_set_by"].as_str()
        ),
        (Some(5.0), Some(5.0), Some("operator")),
        "{v}"
    );
    let usage: serde_json::Value =
        serde_json::from_str(&gate.admin_get("/usage").await.body).unwrap();
    assert_eq!(usage["total"]["requests"], 3, "{usage}");
    gate.assert_settled(&up, 1).await;
}

/// A clean stop waits for the last requests' settlements before the state is written: a request
/// still answering when SIGTERM came is charged what it used, not its estimate, after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clean_stop_settles_the_requests_it_drained() {
    let up = FakeUpstream::instant().start().await;
    let dir = unique_dir("quota-stop").join("state");
    let dir = dir.to_str().unwrap();
    let mut first = gate(dir).upstream(&up).start().await;
    let client = first.client();
    let slow = tokio::spawn(async move {
        client
            .post_chat(
                &Req::chat("slow")
                    .set("max_tokens", 5000)
                    .prompt_tokens(10)
                    .completion_tokens(7)
                    .delay(Duration::from_millis(800)),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        first.quota_left("tokens").await < 95_000.0,
        "charged its estimate"
    );
    first.sigterm();
    assert_eq!(slow.await.unwrap().status, 200, "drained");
    first.wait_exit(Duration::from_secs(10)).await;
    let gate = gate(dir).upstream(&up).start().await;
    assert_eq!(
        gate.quota_left("tokens").await,
        100_000.0 - 17.0,
        "settled to its usage"
    );
    gate.assert_settled(&up, 1).await;
}

/// A request the quota allowed and the queue then turned away still hears its allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_refusal_after_the_quota_carries_the_allowance() {
    let up = FakeUpstream::instant().start().await;
    let dir = unique_dir("quota-queue").join("state");
    let gate = Gate::new()
        .slots(1)
        .opt("--queue-depth", "0")
        .opt("--state-dir", dir.to_str().unwrap())
        .policies(&[(
            &wat::built("quota"),
            Some("{ period = \"day\", requests = 10 }"),
        )])
        .upstream(&up)
        .start()
        .await;
    let client = gate.client();
    let holder = tokio::spawn(async move {
        client
            .post_chat(&Req::chat("hold").delay(Duration::from_millis(800)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = gate.client().post_chat(&Req::chat("turned-away")).await;
    assert_error(&resp, 429, "queue_full");
    assert_eq!(
        resp.header("x-ratelimit-limit-requests").as_deref(),
        Some("10")
    );
    assert_eq!(
        resp.header("x-ratelimit-remaining-requests").as_deref(),
        Some("8"),
        "as charged when it was allowed"
    );
    assert_eq!(holder.await.unwrap().status, 200);
    gate.assert_settled(&up, 1).await;
}

/// A model name in the ledger is whatever name llama-server serves under (its `--alias`, a router's
/// model id): `slotgate usage` prints its control characters as escapes, and the ledger's CSV (from
/// the CLI and from `GET /usage`) neither holds them nor starts a spreadsheet formula (issue 46).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_shows_a_clients_model_name_without_its_escapes_or_formulas() {
    const ESCAPES: &str = "\u{1b}[2J\u{1b}]0;pwned\u{7}evil";
    const FORMULA: &str = "=HYPERLINK(\"http://x\",\"y\")";
    let dir = unique_dir("usage-hostile");
    let token = dir.join("admin.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let state = dir.join("state");
    // One llama-server serving under each name in turn, one state directory.
    let mut last = None;
    for (tag, model) in [("escapes", ESCAPES), ("formula", FORMULA)] {
        if let Some((_up, mut gate)) = last.take() {
            let gate: &mut RunningGate = &mut gate;
            gate.sigterm();
            gate.wait_exit(std::time::Duration::from_secs(10)).await;
        }
        let up = FakeUpstream::instant().model_alias(model).start().await;
        let gate = Gate::new()
            .opt("--state-dir", state.display())
            .admin_token(TOKEN)
            .upstream(&up)
            .start()
            .await;
        let resp = gate.client().post_chat(&Req::chat(tag)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        gate.assert_settled(&up, 1).await;
        last = Some((up, gate));
    }
    let (_up, gate) = last.unwrap();
    let usage: serde_json::Value =
        serde_json::from_str(&gate.admin_get("/usage").await.body).unwrap();
    let models: Vec<&str> = usage["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["model"].as_str())
        .collect();
    assert!(
        models.contains(&ESCAPES) && models.contains(&FORMULA),
        "both booked as served: {usage}"
    );

    let (ok, table, err) = cli(&gate, &token, &["usage"]);
    assert!(ok, "{err}");
    assert!(!table.contains(['\u{1b}', '\u{7}']), "{table:?}");
    assert!(
        table.contains(r"\u{1b}[2J\u{1b}]0;pwned\u{7}evil"),
        "{table}"
    );

    let served = gate.admin_get("/usage?format=csv").await.body;
    let (ok, csv, err) = cli(&gate, &token, &["usage", "--csv"]);
    assert!(ok, "{err}");
    for csv in [&served, &csv] {
        assert!(!csv.contains(['\u{1b}', '\u{7}']), "{csv:?}");
        assert!(csv.contains(r"\u{1b}[2J\u{1b}]0;pwned\u{7}evil"), "{csv}");
        // Quoted for its commas and quotes, and made text by a leading `'`.
        assert!(
            csv.contains(r#","'=HYPERLINK(""http://x"",""y"")","#),
            "{csv}"
        );
        for line in csv.lines() {
            assert!(!line.contains(",=") && !line.contains(",\"="), "{line}");
        }
    }
}
