//! The console signed in with the admin token reads the live view while a burst runs, creates,
//! rotates and revokes a key, shows the quotas per tenant and team, and downloads the usage CSV the
//! API gives; signed in with the read-only token it has no write control, and the API refuses a
//! change all the same. On every page, no token, key secret or digest is in the page, its storage
//! or its URL, and no script error or Content-Security-Policy violation happened.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};
use slotgate_tests::gate::{hash_key, Gate, RunningGate};
use slotgate_tests::python;
use slotgate_tests::request::{spawn_post, Req, CHAT};
use slotgate_tests::wait::unique_dir;
use slotgate_tests::{wat, FakeUpstream};

const ADMIN: &str = "admin-token-for-the-console-0001";
const READ: &str = "read-token-for-the-console-0002";
const WRONG: &str = "not-a-token-of-this-gate-0003";

/// Day quotas per tenant, and one for the team research.
const QUOTA: &str = "{ period = \"day\", tokens = 100000, requests = 1000, \
                     teams = { \"research\" = { tokens = 500000 } } }";
const PRICES: &str = "[prices]\ncurrency = \"EUR\"\n\
                      [prices.default]\ninput = 1.0\ncached-input = 0.1\noutput = 2.0\n";

/// A browser at a time: two Chromiums on two cores would make each page's waits a race.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const DRIVER_TIMEOUT: Duration = Duration::from_secs(180);

/// `$SLOTGATE_CONSOLE_PYTHON` and `$SLOTGATE_CHROMIUM`, else what `scripts/setup-console.sh`
/// installs and prints; a failure names the script and its error: the test never skips.
fn tools() -> &'static (PathBuf, PathBuf) {
    static TOOLS: OnceLock<Result<(PathBuf, PathBuf), String>> = OnceLock::new();
    let found = TOOLS.get_or_init(|| {
        let script = "setup-console.sh";
        let from_env = |k: &str| std::env::var_os(k).map(PathBuf::from);
        let (py, chromium) = match (
            from_env("SLOTGATE_CONSOLE_PYTHON"),
            from_env("SLOTGATE_CHROMIUM"),
        ) {
            (Some(p), Some(c)) => (p, c),
            _ => {
                let out = slotgate_tests::setup_script(script)?;
                (
                    slotgate_tests::setup_value(script, &out, "SLOTGATE_CONSOLE_PYTHON")?,
                    slotgate_tests::setup_value(script, &out, "SLOTGATE_CHROMIUM")?,
                )
            }
        };
        for p in [&py, &chromium] {
            if !p.is_file() {
                return Err(format!(
                    "{} is not a file: run `eval \"$(bash scripts/setup-console.sh)\"`",
                    p.display()
                ));
            }
        }
        Ok((py, chromium))
    });
    match found {
        Ok(t) => t,
        Err(e) => panic!("the console tests need Chromium and Playwright: {e}"),
    }
}

/// The driver's command for one scenario.
fn driver(config: &Value) -> tokio::process::Command {
    let (py, _) = tools();
    let mut cmd = tokio::process::Command::new(py);
    cmd.arg(slotgate_tests::workspace().join("tests/console/console.py"))
        .arg(config.to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    cmd
}

/// Where screenshots go, when `SLOTGATE_SCREENSHOTS` asks for them (relative to the workspace).
fn screenshots() -> Option<String> {
    let dir = std::env::var_os("SLOTGATE_SCREENSHOTS")?;
    let dir = slotgate_tests::workspace().join(dir);
    std::fs::create_dir_all(&dir).expect("make the screenshot directory");
    Some(dir.canonicalize().unwrap().display().to_string())
}

fn config(gate: &RunningGate, scenario: &str, token: &str, forbidden: &[String]) -> Value {
    let (_, chromium) = tools();
    let url = format!("http://{}", gate.admin_addr().trim_start_matches("tcp:"));
    json!({
        "url": url, "chromium": chromium, "scenario": scenario, "token": token,
        "wrong_token": WRONG, "forbidden": forbidden, "screenshots": screenshots(),
        "running": 2, "waiting": 3,
    })
}

/// Two slots, keys, both admin tokens, the quota policy and prices, its state in `dir`.
fn gate(dir: &Path) -> Gate {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("console.toml");
    let quota = wat::built("quota");
    std::fs::write(
        &config,
        format!(
            "[[policy]]\npath = \"{}\"\nsettings = {QUOTA}\n{PRICES}",
            quota.display()
        ),
    )
    .unwrap();
    let read = dir.join("read.token");
    std::fs::write(&read, format!("{READ}\n")).unwrap();
    Gate::new()
        .slots(2)
        .queue_depth(16)
        .opt("--client-auth", "keys")
        .opt("--state-dir", dir.join("state").display())
        .opt("--admin-read-token-file", read.display())
        .config_file(&config)
        .admin_token(ADMIN)
}

async fn start(dir: &Path) -> (slotgate_tests::RunningUpstream, RunningGate) {
    gate(dir).start_with(FakeUpstream::instant()).await
}

/// The LD_PRELOAD library of libfaketime, from its wheel in the console's venv.
fn libfaketime() -> PathBuf {
    let (py, _) = tools();
    slotgate_tests::python::libfaketime(py.as_ref())
}

/// Days before today that get ledger rows, and the requests of alice, bob and carol on each.
const PAST: [(u32, [usize; 3]); 3] = [(5, [2, 1, 0]), (3, [1, 3, 1]), (1, [2, 2, 1])];

/// Ledger rows on the days of [`PAST`], each written by a slotgate whose wall clock is set back
/// that many days (libfaketime; its monotonic clock left alone), on the state of `dir`: the keys
/// of alice, bob and carol, made on the first of them.
async fn history(dir: &Path) -> [String; 3] {
    let mut keys = None;
    for (days_ago, counts) in PAST {
        let (_up, mut gate) = gate(dir)
            .env("LD_PRELOAD", libfaketime().to_str().unwrap())
            .env("FAKETIME", &format!("-{days_ago}d"))
            .env("DONT_FAKE_MONOTONIC", "1")
            .start_with(FakeUpstream::instant())
            .await;
        let people = keys.get_or_insert_with(|| make_keys(&gate)).clone();
        for (secret, n) in people.iter().zip(counts) {
            for _ in 0..n {
                let r = gate.client().post_chat(&chat(secret, 0)).await;
                assert_eq!(r.status, 200, "{}", r.body);
            }
        }
        gate.wait_outcome("ok", counts.iter().sum::<usize>() as u64)
            .await;
        // A clean stop writes the ledger whole.
        gate.sigterm();
        gate.wait_exit(Duration::from_secs(15)).await;
    }
    keys.unwrap()
}

fn key(gate: &RunningGate, tenant: &str, team: Option<&str>) -> String {
    let mut args = vec!["key", "create", "--json", "--tenant", tenant];
    args.extend(team.iter().flat_map(|t| ["--team", t]));
    let (ok, out, err) = gate.admin_cli(&args);
    assert!(ok, "{out}{err}");
    serde_json::from_str::<Value>(out.trim()).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A chat of 1,000 prompt tokens (900 of them cached) and 50 generated, as `secret`'s tenant.
fn chat(secret: &str, delay_ms: u64) -> Req {
    Req::chat("console")
        .api_key(secret)
        .set("max_tokens", 50)
        .set("fake_prompt_tokens", 1000)
        .set("fake_cached_tokens", 900)
        .set("fake_completion_tokens", 50)
        .set("fake_delay_ms", delay_ms)
}

/// Three tenants' keys: alice and bob of the team research, and carol.
fn make_keys(gate: &RunningGate) -> [String; 3] {
    [
        key(gate, "alice", Some("research")),
        key(gate, "bob", Some("research")),
        key(gate, "carol", None),
    ]
}

/// Each of `people` served once: the ledger and the quotas have rows of today.
async fn serve(gate: &RunningGate, people: &[String; 3]) {
    // A second each, two at a time: the queue's model of service time has something to go by.
    let served: Vec<_> = people
        .iter()
        .map(|s| spawn_post(&gate.client(), CHAT, &chat(s, 1000)))
        .collect();
    for h in served {
        let (r, _) = h.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    gate.wait_outcome("ok", 3).await;
}

/// Every secret and token the pages must never show, with the key digests.
fn secrets(keys: &[String]) -> Vec<String> {
    let mut out = vec![ADMIN.to_owned(), READ.to_owned()];
    for k in keys {
        let digest = hash_key(k);
        let hex = digest.trim_start_matches("sha256:").to_owned();
        out.extend([k.clone(), digest, hex]);
    }
    out
}

fn text(v: &Value) -> String {
    v.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_admin_token_the_console_shows_the_burst_manages_keys_and_downloads_the_csv() {
    let _one = BROWSER.lock().await;
    let dir = unique_dir("console-admin");
    let [alice, bob, carol] = history(&dir).await;
    let (_up, gate) = start(&dir).await;
    serve(&gate, &[alice.clone(), bob.clone(), carol.clone()]).await;
    let forbidden = secrets(&[alice.clone(), bob.clone(), carol.clone()]);

    // The burst, once the page is signed in: alice holds both slots, bob and carol wait.
    let burst = async {
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(spawn_post(&gate.client(), CHAT, &chat(&alice, 8000)));
        }
        gate.wait_busy(2).await;
        for s in [&bob, &bob, &carol] {
            held.push(gate.enqueue(&chat(s, 50)).await);
        }
        held
    };
    let cfg = config(&gate, "admin", ADMIN, &forbidden);
    let (out, held) =
        python::run_on_cue(driver(&cfg), "console.py admin", DRIVER_TIMEOUT, burst).await;
    let out: Value = python::result("console.py", &["admin".into()], &out);
    for h in held {
        let (r, _) = h.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }

    assert!(
        text(&out["wrong_token_message"]).contains("refused that token"),
        "{out}"
    );
    assert_eq!(out["who"], "admin token");

    // Who runs and who waits, with why and when.
    let running = out["live"]["running"].as_array().unwrap();
    assert_eq!(running.len(), 2, "{running:?}");
    assert!(running.iter().all(|r| r[1] == "alice"), "{running:?}");
    let waiting = out["live"]["waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 3, "{waiting:?}");
    let mut who: Vec<&str> = waiting.iter().map(|w| w[2].as_str().unwrap()).collect();
    who.sort_unstable();
    assert_eq!(who, ["bob", "bob", "carol"]);
    for w in waiting {
        assert!(w[7].as_str().unwrap().starts_with("in "), "{w}");
        assert!(w[8].as_str().unwrap().contains("all 2 slots busy"), "{w}");
    }

    // The API's refusal is shown; the key made in the page is revoked, its secrets refused.
    assert!(text(&out["create_error"]).contains("anonymous"), "{out}");
    let id = out["key"]["id"].as_str().unwrap();
    let shown = gate.admin().get(&format!("/keys/{id}")).await.json();
    assert_eq!(shown["tenant"], "dave");
    assert_eq!(shown["team"], "research");
    assert_eq!(shown["state"], "revoked");
    for s in ["secret", "rotated"] {
        let secret = out["key"][s].as_str().unwrap();
        assert!(secret.starts_with("sgk_"), "{secret}");
        let r = gate.client().post_chat(&chat(secret, 0)).await;
        assert_eq!(r.status, 401, "{s}: {}", r.body);
    }
    let row = out["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == id)
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(row[4], "revoked");
    assert!(text(&out["keys_status"]).contains("revoked"), "{out}");
    // The grace chosen on the page reached the API; a revocation ends it too (both 401 above).
    assert!(
        text(&out["rotate_status"]).contains("old secret works until"),
        "{out}"
    );

    // Quotas per tenant and per team, every one the API lists.
    let quotas = gate.admin().get("/quotas").await.json();
    let listed: usize = ["tenant", "team", "key", "other"]
        .iter()
        .filter_map(|s| out["quotas"][s].as_array())
        .map(Vec::len)
        .sum();
    assert_eq!(listed as u64, quotas["count"].as_u64().unwrap(), "{quotas}");
    let tenants = text(&out["quotas"]["tenant"]);
    for t in ["alice", "bob", "carol"] {
        assert!(tenants.contains(t), "{tenants}");
    }
    assert!(text(&out["quotas"]["team"]).contains("research"), "{out}");

    // Usage: the chart's tenants, the table, and the CSV the API gives for the same days.
    let legend = text(&out["usage"]["legend"]);
    for t in ["alice", "bob", "carol"] {
        assert!(legend.contains(t), "{legend}");
    }
    let csv = out["usage"]["csv"].as_str().unwrap();
    let api = gate
        .admin()
        .get("/usage?by=day,tenant&format=csv")
        .await
        .body;
    assert_eq!(csv, api);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "day,tenant,requests,prompt_tokens,cached_tokens,completion_tokens,cost_eur"
    );
    // Each day of the history, then today: alice 1 + 2 in the burst, bob 1 + 2, carol 1 + 1.
    let requests: Vec<(&str, &str)> = lines[1..]
        .iter()
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c[1], c[2])
        })
        .collect();
    let mut want: Vec<(&str, String)> = Vec::new();
    for (_, counts) in PAST {
        for (t, n) in ["alice", "bob", "carol"].into_iter().zip(counts) {
            if n > 0 {
                want.push((t, n.to_string()));
            }
        }
    }
    want.extend([
        ("alice", "3".into()),
        ("bob", "3".into()),
        ("carol", "2".into()),
    ]);
    let want: Vec<(&str, &str)> = want.iter().map(|(t, n)| (*t, n.as_str())).collect();
    assert_eq!(requests, want, "{csv}");
    let days: std::collections::BTreeSet<&str> = lines[1..].iter().map(|l| &l[..10]).collect();
    assert_eq!(days.len(), PAST.len() + 1, "{csv}");
    assert!(
        out["usage"]["csv_name"]
            .as_str()
            .unwrap()
            .starts_with("slotgate-usage-"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_admin_token_configured_the_console_opens_at_once_and_says_so() {
    let _one = BROWSER.lock().await;
    let dir = unique_dir("console-open");
    let (_up, gate) = Gate::new()
        .opt("--client-auth", "keys")
        .opt("--state-dir", dir.join("state").display())
        .start_instant()
        .await;
    let (ok, out, err) = gate.admin_cli(&["key", "create", "--json", "--tenant", "erin"]);
    assert!(ok, "{out}{err}");
    let secret = serde_json::from_str::<Value>(out.trim()).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let cfg = config(&gate, "open", "", &[secret.clone(), hash_key(&secret)]);
    let out = tokio::time::timeout(DRIVER_TIMEOUT, driver(&cfg).output())
        .await
        .expect("console.py open finished in time")
        .expect("run console.py");
    let out: Value = python::result("console.py", &["open".into()], &out);
    assert!(
        text(&out["who"]).contains("no admin token configured"),
        "{out}"
    );
    assert!(text(&out["keys"]).contains("erin"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_read_only_token_the_console_has_no_write_control_and_the_api_refuses_one() {
    let _one = BROWSER.lock().await;
    let dir = unique_dir("console-read");
    let (_up, gate) = start(&dir).await;
    let people = make_keys(&gate);
    serve(&gate, &people).await;
    let forbidden = secrets(&people);
    let cfg = config(&gate, "read", READ, &forbidden);
    let out = tokio::time::timeout(DRIVER_TIMEOUT, driver(&cfg).output())
        .await
        .expect("console.py read finished in time")
        .expect("run console.py");
    let out: Value = python::result("console.py", &["read".into()], &out);

    assert!(text(&out["who"]).contains("read-only"), "{out}");
    assert!(
        text(&out["wrong_token_message"]).contains("refused that token"),
        "{out}"
    );
    assert!(text(&out["keys_notice"]).contains("admin token"), "{out}");
    assert_eq!(out["write_controls"], json!([]), "{out}");
    assert_eq!(out["post_keys_status"], 403, "{out}");
    assert_eq!(gate.admin().get("/keys").await.json()["count"], 3);
    assert_eq!(out["csv_lines"], 4, "a header and three tenants: {out}");
    assert_eq!(out["after_logout_session"], json!([]), "{out}");
}
