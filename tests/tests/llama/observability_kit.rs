//! The operator kit in `examples/`: Prometheus rules and a Grafana dashboard, checked with the real
//! tools and against what the real binaries export.
//!
//! - `promtool check rules` accepts `examples/prometheus/alerts.yml` and `promtool test rules` passes
//!   its unit tests (every alert fires where it should and stays quiet where it should not);
//! - every dashboard query is PromQL that promtool parses, every panel has queries and reads the
//!   `${datasource}` variable;
//! - no dead panel or rule: every `slotgate_*` name a panel, a rule or a rule test reads is exported by
//!   a real slotgate after real traffic (429s, policies, a tenant, a stream), and every `llamacpp:*`
//!   name by a real llama-server started with `--metrics`;
//! - queue wait and time to first byte are Prometheus histograms with buckets from milliseconds to
//!   minutes;
//! - `examples/prometheus/prometheus.yml` passes `promtool check config`, and Prometheus itself
//!   scrapes a slotgate that wants a token with it (the read-only token), and not without.
//!
//! promtool comes from `scripts/setup-prometheus.sh`; a missing one fails the test, naming it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use slotgate_tests::llama::{self, LlamaServer, PROMPT};
use slotgate_tests::*;

const ALERTS: &str = "examples/prometheus/alerts.yml";
const ALERTS_TEST: &str = "examples/prometheus/alerts.test.yml";
const DASHBOARD: &str = "examples/grafana/slotgate.json";

/// Panel types that hold no query of their own.
const QUERYLESS_PANELS: &[&str] = &["row", "text"];

/// What the dashboard's variables and Grafana's interval macros stand for, so promtool can parse a
/// query as Prometheus would receive it.
const GRAFANA_MACROS: &[(&str, &str)] = &[
    ("$__rate_interval", "5m"),
    ("$__interval", "1m"),
    ("$__range", "1h"),
    ("$llama_instance", ".*"),
    ("$llama_job", ".*"),
    ("$instance", ".*"),
    ("$job", ".*"),
];

fn read(rel: &str) -> String {
    let path = workspace().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

// ---------------------------------------------------------------------------------------------------
// Extracting queries and metric names
// ---------------------------------------------------------------------------------------------------

/// Metric names in a PromQL expression: the identifiers (runs of `[A-Za-z0-9_:]`, outside string
/// literals) that start with `slotgate_` or `llamacpp:`. Recording rules (`slotgate:...`) are not
/// metrics and are left out.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut token = String::new();
    let mut quote = None;
    let mut escaped = false;
    for c in expr.chars().chain([' ']) {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                c if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            token.push(c);
            continue;
        }
        if token.starts_with("slotgate_") || token.starts_with("llamacpp:") {
            names.insert(std::mem::take(&mut token));
        }
        token.clear();
        if matches!(c, '"' | '\'' | '`') {
            quote = Some(c);
        }
    }
    names
}

/// The `expr:` of every rule in a rules file: plain or quoted on its line, or a `|`/`>` block of
/// the lines indented deeper than the key.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(value) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let value = value.trim();
        let expr = if value.starts_with(['|', '>']) {
            lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            value.trim_matches(['"', '\'']).to_owned()
        };
        exprs.push(expr.trim().to_owned());
    }
    exprs
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"]
        .as_array()
        .expect("dashboard has panels")
    {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// `(panel title, refId, expr)` of every panel query.
fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {:?}: a target without expr: {t}", p["title"]));
            out.push((
                p["title"].as_str().unwrap_or("").to_owned(),
                t["refId"].as_str().unwrap_or("").to_owned(),
                expr.to_owned(),
            ));
        }
    }
    out
}

/// The queries of the dashboard's template variables (`label_values(metric, label)`).
fn variable_queries(dashboard: &Value) -> Vec<String> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("dashboard has templating.list")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| match &v["query"] {
            Value::String(q) => q.clone(),
            q => q["query"].as_str().unwrap_or("").to_owned(),
        })
        .collect()
}

/// Names read by the series of the rule unit tests, so a test cannot pass on a name nothing exports.
fn rule_test_series_names(yaml: &str) -> BTreeSet<String> {
    yaml.lines()
        .filter_map(|l| l.trim_start().strip_prefix("- series:"))
        .flat_map(|s| {
            let s = s.trim().trim_matches(['"', '\'']);
            // The name is what comes before the label set.
            metric_names(&s[..s.find('{').unwrap_or(s.len())])
        })
        .collect()
}

/// Every metric name the kit reads: dashboard queries and variables, rules, rule test series.
fn kit_names() -> BTreeSet<String> {
    let d = dashboard();
    let mut names = BTreeSet::new();
    for (_, _, expr) in dashboard_exprs(&d) {
        names.extend(metric_names(&expr));
    }
    for q in variable_queries(&d) {
        names.extend(metric_names(&q));
    }
    for expr in rule_exprs(&read(ALERTS)) {
        names.extend(metric_names(&expr));
    }
    names.extend(rule_test_series_names(&read(ALERTS_TEST)));
    names
}

/// The names in `wanted` (with `prefix`) that `m` has no sample of: a family name matches its
/// `_bucket`/`_sum`/`_count` samples too.
fn missing(m: &Metrics, wanted: &BTreeSet<String>, prefix: &str) -> Vec<String> {
    wanted
        .iter()
        .filter(|n| n.starts_with(prefix))
        .filter(|n| !m.samples.iter().any(|s| &s.name == *n) && !m.has_samples(n))
        .cloned()
        .collect()
}

#[test]
fn extraction_finds_names_and_every_rule() {
    let names = metric_names(
        r#"sum by (le) (rate(slotgate_queue_wait_seconds_bucket{job=~"slotgate_x"}[5m])) / llamacpp:requests_deferred + slotgate:queue_fill:ratio"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "llamacpp:requests_deferred",
            "slotgate_queue_wait_seconds_bucket"
        ]
    );
    let yaml = read(ALERTS);
    let rules = yaml
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("- alert:") || l.starts_with("- record:")
        })
        .count();
    let exprs = rule_exprs(&yaml);
    assert_eq!(exprs.len(), rules, "one expr per rule: {exprs:#?}");
    assert!(
        exprs.iter().all(|e| !metric_names(e).is_empty()),
        "every rule reads a metric: {exprs:#?}"
    );
}

// ---------------------------------------------------------------------------------------------------
// promtool
// ---------------------------------------------------------------------------------------------------

/// `$PROMTOOL`, else `promtool` on PATH; a missing one fails the test with how to get it.
fn promtool() -> PathBuf {
    const SETUP: &str = "run `bash scripts/setup-prometheus.sh` (it installs Debian's prometheus \
                         package), then re-run this test";
    if let Some(p) = std::env::var_os("PROMTOOL").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "$PROMTOOL names {}, which is not a file: {SETUP}",
            p.display()
        );
        return p;
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("promtool"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("promtool is not on PATH (nor in $PROMTOOL): {SETUP}"))
}

/// Runs promtool with `args` in the workspace; panics with its output unless it succeeds.
fn run_promtool(args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(workspace())
        .output()
        .unwrap_or_else(|e| panic!("run promtool {args:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{text}",
        args.join(" "),
        out.status
    );
    text
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let check = run_promtool(&["check", "rules", ALERTS]);
    assert!(check.contains("SUCCESS"), "{check}");
    let test = run_promtool(&["test", "rules", ALERTS_TEST]);
    assert!(test.contains("SUCCESS"), "{test}");

    // Every alert has a unit test that makes it fire.
    let rules = read(ALERTS);
    let tests = read(ALERTS_TEST);
    for alert in rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert:"))
    {
        let alert = alert.trim();
        let fires = tests
            .split("alertname:")
            .skip(1)
            .any(|case| case.trim_start().starts_with(alert) && case.contains("exp_labels:"));
        assert!(fires, "{ALERTS_TEST} has no case in which {alert} fires");
    }
    assert!(
        tests.contains("exp_alerts: []"),
        "{ALERTS_TEST} has no case in which an alert stays quiet"
    );
}

#[test]
fn dashboard_panels_have_queries_promtool_parses_and_use_the_datasource_variable() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion {}",
        d["schemaVersion"]
    );
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no template variable {name}"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for name in ["job", "instance"] {
        assert_eq!(var(name)["type"], "query", "variable {name}");
    }

    let uses_variable = |ds: &Value| ds["uid"] == "${datasource}" && ds["type"] == "prometheus";
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or("(untitled)");
        let kind = p["type"].as_str().unwrap_or("");
        if !ids.insert(p["id"].as_u64()) {
            problems.push(format!("{title}: duplicate id {}", p["id"]));
        }
        if QUERYLESS_PANELS.contains(&kind) {
            continue;
        }
        let targets = p["targets"].as_array().map_or(&[][..], Vec::as_slice);
        if targets.is_empty() {
            problems.push(format!("{title}: a {kind} panel without targets"));
        }
        if !uses_variable(&p["datasource"]) {
            problems.push(format!("{title}: datasource {}", p["datasource"]));
        }
        for t in targets {
            if !uses_variable(&t["datasource"]) {
                problems.push(format!(
                    "{title}/{}: datasource {}",
                    t["refId"], t["datasource"]
                ));
            }
        }
    }
    for var in vars.iter().filter(|v| v["type"] == "query") {
        if !uses_variable(&var["datasource"]) {
            problems.push(format!(
                "variable {}: datasource {}",
                var["name"], var["datasource"]
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{DASHBOARD}:\n  {}",
        problems.join("\n  ")
    );

    // promtool parses every query, as recording rules, once Grafana's macros are filled in.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (title, ref_id, expr)) in dashboard_exprs(&d).into_iter().enumerate() {
        let expr = GRAFANA_MACROS
            .iter()
            .fold(expr, |e, (macro_, value)| e.replace(macro_, value));
        assert!(
            !expr.contains('$'),
            "{title}/{ref_id}: a variable GRAFANA_MACROS does not know: {expr}"
        );
        rules += &format!(
            "      # {title} / {ref_id}\n      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).expect("a string")
        );
    }
    let dir = unique_dir("dashboard-rules");
    let file = dir.join("dashboard.rules.yml");
    std::fs::write(&file, rules).expect("write dashboard rules");
    run_promtool(&["check", "rules", &file.display().to_string()]);
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------------------------------
// Against the real binaries
// ---------------------------------------------------------------------------------------------------

/// A one-slot gate with room for two waiters, whose policy chain names tenant `team-a` for API key
/// `key-a` (tenant-priority, as built by scripts/build-policies.sh) and then traps on
/// [`wat::MARKER`]; in front of an instant fake.
async fn gate_with_policies() -> (RunningUpstream, RunningGate) {
    let dir = unique_dir("kit-policies");
    let settings = format!(
        "{{ tenants = {{ team-a = {{ api_keys = [\"{}\"], priority = 0 }} }} }}",
        gate::hash_key("key-a")
    );
    let trap = wat::hostile(&dir, "trap-on-marker", "unreachable", "");
    Gate::one_slot(2)
        .policies(&[
            (&wat::built("tenant-priority"), Some(&settings)),
            (&trap, None),
        ])
        .start_instant()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_slotgate_metric_the_kit_reads_is_exported_after_real_traffic() {
    let _serial = slotgate_tests::llama::serial().await;
    let (up, gate) = gate_with_policies().await;
    let client = gate.client();

    // One holds the slot, two queue, the fourth is turned away: a 429 with a Retry-After.
    let a = gate
        .hold_slot(&Req::chat("a").delay(ms(500)).api_key("key-a"))
        .await;
    let b = gate.enqueue(&Req::chat("b").api_key("key-a")).await;
    let c = gate.enqueue(&Req::chat("c").api_key("key-a")).await;
    let (full, _) = spawn_post(&client, CHAT, &Req::chat("d").api_key("key-a"))
        .await
        .expect("the fourth request's task");
    assert_error(&full, 429, "queue_full");
    for (resp, _) in join_all(vec![a, b, c]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    // A stream whose last chunk carries usage, and a request the second policy traps on.
    let sse = client
        .stream(
            CHAT,
            &Req::chat("s")
                .chunks(3, ms(10))
                .prompt_tokens(12)
                .api_key("key-a")
                .json(),
        )
        .await
        .read_sse(Duration::from_secs(5))
        .await;
    assert!(sse.complete(), "{sse:?}");
    let trapped = client
        .post_chat(&Req::chat("t").set("model", wat::MARKER))
        .await;
    assert_error(&trapped, 503, "policy_error");

    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("ok", 4).await;
    gate.wait_outcome("queue_full", 1).await;
    gate.wait_outcome("policy_error", 1).await;

    let m = gate.metrics().await;
    let names = kit_names();
    assert!(
        names.len() >= 15,
        "the kit reads only {} slotgate/llamacpp names: {names:?}",
        names.len()
    );
    let absent = missing(&m, &names, "slotgate_");
    assert!(
        absent.is_empty(),
        "the dashboard or the rules read metrics slotgate does not export: {absent:?}\n/metrics:\n{}",
        m.text
    );
    // The denominators are the configuration, and the tenant is the policy's.
    assert_eq!(m.value("slotgate_slots_total", &[]), Some(1.0));
    assert_eq!(m.value("slotgate_queue_capacity", &[]), Some(2.0));
    assert!(
        m.value("slotgate_tenant_tokens_total", &[("tenant", "team-a")])
            .is_some_and(|v| v > 0.0),
        "no tokens for tenant team-a:\n{}",
        m.text
    );
    assert!(
        m.value(
            "slotgate_retry_after_seconds_count",
            &[("code", "queue_full")]
        )
        .is_some_and(|v| v >= 1.0),
        "no Retry-After recorded for queue_full:\n{}",
        m.text
    );
    for family in [
        "slotgate_slots_total",
        "slotgate_queue_capacity",
        "slotgate_policy_eval_seconds",
        "slotgate_policy_errors_total",
    ] {
        assert!(m.has_help(family), "{family} has no # HELP:\n{}", m.text);
    }
    gate.assert_idle().await;
}

/// The `le` bounds of `family`'s buckets, after checking it is a real histogram: `# TYPE histogram`,
/// cumulative buckets ending in `+Inf` equal to `_count`.
fn histogram_bounds(m: &Metrics, family: &str) -> Vec<f64> {
    assert_eq!(
        m.type_of(family).as_deref(),
        Some("histogram"),
        "{family}:\n{}",
        m.text
    );
    let bucket = format!("{family}_bucket");
    let buckets: Vec<(f64, f64)> = m
        .samples
        .iter()
        .filter(|s| s.name == bucket)
        .map(|s| {
            let le = s
                .labels
                .iter()
                .find(|(k, _)| k == "le")
                .unwrap_or_else(|| panic!("{bucket} without le: {s:?}"));
            let bound = match le.1.as_str() {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|e| panic!("{bucket} le={v}: {e}")),
            };
            (bound, s.value)
        })
        .collect();
    assert!(buckets.len() >= 2, "{family} has no buckets:\n{}", m.text);
    assert!(
        buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "{family} buckets are not ascending and cumulative: {buckets:?}"
    );
    let (last, inf_count) = *buckets.last().expect("buckets");
    assert!(
        last.is_infinite(),
        "{family} has no +Inf bucket: {buckets:?}"
    );
    assert_eq!(
        Some(inf_count),
        m.value(&format!("{family}_count"), &[]),
        "{family}: +Inf bucket and _count differ"
    );
    buckets
        .iter()
        .map(|(b, _)| *b)
        .filter(|b| b.is_finite())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_wait_and_ttft_are_histograms_from_milliseconds_to_minutes() {
    let _serial = slotgate_tests::llama::serial().await;
    let (up, gate) = Gate::one_slot(1).start_instant().await;
    let a = gate.hold_slot(&Req::chat("a").delay(ms(400))).await;
    let b = gate.enqueue(&Req::chat("b")).await;
    for (resp, _) in join_all(vec![a, b]).await {
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    gate.assert_settled(&up, 1).await;
    gate.wait_outcome("ok", 2).await;

    let m = gate.metrics().await;
    for family in [
        "slotgate_queue_wait_seconds",
        "slotgate_time_to_first_byte_seconds",
    ] {
        let bounds = histogram_bounds(&m, family);
        let (low, high) = (bounds[0], bounds[bounds.len() - 1]);
        assert!(
            low <= 0.01,
            "{family}: lowest bound {low} s cannot tell a free slot or a small model's first token from 10 ms"
        );
        assert!(
            high >= 60.0,
            "{family}: highest bound {high} s is below the default 60 s queue timeout"
        );
        assert_eq!(
            m.value(&format!("{family}_count"), &[]),
            Some(2.0),
            "{family}: one observation per forwarded request"
        );
    }
    // a found the slot free; b waited most of a's 400 ms: the buckets tell them apart.
    let waited_at_most = |le: &str| {
        m.value("slotgate_queue_wait_seconds_bucket", &[("le", le)])
            .unwrap_or_else(|| panic!("no le={le} bucket:\n{}", m.text))
    };
    assert_eq!(waited_at_most("0.1"), 1.0, "{}", m.text);
    assert_eq!(waited_at_most("+Inf"), 2.0, "{}", m.text);
    gate.assert_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_llamacpp_metric_the_kit_reads_is_exported_by_the_real_llama_server() {
    let _serial = slotgate_tests::llama::serial().await;
    let llama = LlamaServer::start(1).await;
    let gate = Gate::one_slot(1).start_before(&llama).await;
    let sse = gate
        .client()
        .stream(CHAT, &llama::chat(PROMPT, 8, true))
        .await
        .read_sse(Duration::from_secs(60))
        .await;
    assert!(sse.complete(), "{sse:?}");
    let usage = llama::stream_usage(&sse, 8);
    gate.assert_idle().await;
    llama.assert_idle().await;
    gate.wait_outcome("ok", 1).await;

    let names = kit_names();
    assert!(
        names.iter().any(|n| n.starts_with("llamacpp:")),
        "the kit reads no llamacpp: metric"
    );
    let m = llama.metrics().await;
    let absent = missing(&m, &names, "llamacpp:");
    assert!(
        absent.is_empty(),
        "the dashboard or the rules read llama-server metrics it does not export: {absent:?}\n\
         llama-server /metrics:\n{}",
        m.text
    );
    // slotgate counted the real answer's tokens and its first byte.
    let g = gate.metrics().await;
    g.assert_present(
        "slotgate_tokens_total",
        &[("kind", "completion")],
        usage.completion as f64,
    );
    g.assert_present("slotgate_time_to_first_byte_seconds_count", &[], 1.0);
}

/// `examples/prometheus/prometheus.yml` as written, pointed at `admin` with `token_file`, scraping
/// every second; and beside its job the same job without a token, to see that one refused.
fn scrape_config(dir: &std::path::Path, admin: &str, token_file: &std::path::Path) -> PathBuf {
    let text = read("examples/prometheus/prometheus.yml");
    assert!(
        text.contains("credentials_file: /etc/prometheus/slotgate-read-token")
            && text.contains("type: Bearer"),
        "the example scrapes with the read-only token: {text}"
    );
    let ours = text
        .replace(
            "/etc/prometheus/slotgate-read-token",
            &token_file.display().to_string(),
        )
        .replace("127.0.0.1:9464", admin)
        .replace("scrape_interval: 15s", "scrape_interval: 1s");
    let without = format!(
        "  - job_name: slotgate-without-token\n    metrics_path: /metrics\n    static_configs:\n      - targets: [\"{admin}\"]\n"
    );
    std::fs::copy(workspace().join(ALERTS), dir.join("alerts.yml")).unwrap();
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, ours + &without).unwrap();
    file
}

/// Prometheus itself (Debian's package, beside promtool) scrapes a slotgate that wants a token with
/// the example's scrape job and the read-only token: the target is up and slotgate's series are in;
/// the same job without the token is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_scrapes_a_slotgate_with_a_token_as_the_example_says() {
    let _serial = slotgate_tests::llama::serial().await;
    let prometheus = promtool().with_file_name("prometheus");
    assert!(
        prometheus.exists(),
        "no prometheus beside promtool at {}: run `bash scripts/setup-prometheus.sh`",
        prometheus.display()
    );
    let dir = unique_dir("prom");
    let read_token = "prometheus-read-token-0123456789";
    let read_file = dir.join("read-token");
    std::fs::write(&read_file, format!("{read_token}\n")).unwrap();
    let (_up, gate) = Gate::new()
        .admin_token("the-admin-token-0123456789")
        .opt("--admin-read-token-file", read_file.display())
        .start_instant()
        .await;
    let admin = gate
        .admin_addr()
        .strip_prefix("tcp:")
        .expect("a TCP admin listener")
        .to_owned();
    let config = scrape_config(&dir, &admin, &read_file);
    let check = run_promtool(&["check", "config", config.to_str().unwrap()]);
    assert!(check.contains("SUCCESS"), "{check}");

    let port = slotgate_tests::gate::free_port();
    let mut child = tokio::process::Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    let api = Client::tcp(([127, 0, 0, 1], port).into());
    let up = |job: &'static str| {
        let api = api.clone();
        async move {
            let q = format!("/api/v1/query?query=up%7Bjob%3D%22{job}%22%7D");
            let r = api
                .try_send(slotgate_tests::client::get_request(&q))
                .await
                .ok()?;
            let v: Value = serde_json::from_str(&r.body).ok()?;
            v["data"]["result"][0]["value"][1]
                .as_str()
                .map(str::to_owned)
        }
    };
    let log = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (with, without) = loop {
        if let (Some(a), Some(b)) = (up("slotgate").await, up("slotgate-without-token").await) {
            break (a, b);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "prometheus scraped nothing in 60 s:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        with, "1",
        "the example's job with the read-only token is up"
    );
    assert_eq!(
        without, "0",
        "without the token slotgate refuses the scrape"
    );
    let series = api
        .get("/api/v1/query?query=slotgate_slots_total%7Bjob%3D%22slotgate%22%7D")
        .await;
    assert!(
        series.body.contains("\"slotgate_slots_total\""),
        "{}",
        series.body
    );
    let _ = child.kill().await;
    assert!(!gate.stderr_text().contains(read_token));
    gate.assert_idle().await;
}
