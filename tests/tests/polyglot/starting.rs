//! A start with a Python policy: the client port answers at once, 503 `starting` with Retry-After
//! while the policy compiles (not a refused connection), the log names each policy it compiles,
//! and a restart that finds the policy in the compile cache serves within about a second.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use slotgate_tests::client::Client;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::{command, free_port};
use slotgate_tests::request::Req;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

/// slotgate with `policy` and the compile cache in `cache`, its log in `log`.
fn start(
    upstream: &str,
    policy: &Path,
    cache: &Path,
    log: &Path,
) -> (tokio::process::Child, Client, Client) {
    let (port, admin) = (free_port(), free_port());
    let mut cmd = tokio::process::Command::from(command());
    cmd.args(["--upstream", upstream])
        .args(["--listen", &format!("tcp:127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("tcp:127.0.0.1:{admin}")])
        .args(["--state-dir", "off", "--health-interval", "100ms"])
        .args(["--policy", policy.to_str().unwrap()])
        .args(["--policy-cache-dir", cache.to_str().unwrap()])
        .env("SLOTGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("spawn slotgate");
    let at = |p: u16| Client::tcp(SocketAddr::from(([127, 0, 0, 1], p)));
    (child, at(port), at(admin))
}

/// The first answer to a chat request: retried only while the process has not bound its port yet
/// (its first milliseconds).
async fn first_answer(client: &Client) -> slotgate_tests::client::Response {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let req = Req::chat("hello");
        let sent = client
            .try_post_json(slotgate_tests::request::CHAT, &req.json())
            .await;
        match sent {
            Ok(resp) => return resp,
            Err(e) if Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("no answer within 5 s of the start: {e}"),
        }
    }
}

/// Seconds until a chat request is served (200), from `since`.
async fn served(client: &Client, since: Instant, log: &Path) -> Duration {
    let until = since + Duration::from_secs(120);
    loop {
        if first_answer(client).await.status == 200 {
            return since.elapsed();
        }
        assert!(
            Instant::now() < until,
            "not serving after 120 s: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_answers_starting_while_a_python_policy_compiles_and_a_warm_cache_serves_at_once() {
    let dir = unique_dir("starting");
    let cache = dir.join("cache");
    let policy = wat::built("request-guard-py");
    let up = FakeUpstream::instant().start().await;

    // A fresh cache: the compile takes seconds, and the port answers meanwhile.
    let cold_log = dir.join("cold.log");
    let began = Instant::now();
    let (mut cold, client, admin) = start(&up.url(), &policy, &cache, &cold_log);
    let resp = first_answer(&client).await;
    assert_eq!(resp.status, 503, "{}", resp.body);
    assert_eq!(resp.header("retry-after").as_deref(), Some("1"), "{resp:?}");
    assert_eq!(
        resp.header("x-slotgate-reason").as_deref(),
        Some("starting")
    );
    let body: serde_json::Value = serde_json::from_str(&resp.body).unwrap();
    assert_eq!(body["error"]["code"], "starting", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("slotgate is starting: compiling policy `request-guard-py`"),
        "{message}"
    );
    // Anthropic's API gets Anthropic's shape.
    let messages = client
        .try_post_json(
            "/v1/messages",
            &serde_json::json!({"model": "m", "max_tokens": 8, "messages": []}),
        )
        .await
        .unwrap();
    assert_eq!(messages.status, 503, "{}", messages.body);
    assert!(
        messages.body.contains(r#""type":"error""#),
        "{}",
        messages.body
    );
    let ready = admin
        .try_send(slotgate_tests::client::get_request("/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status, 503, "{}", ready.body);
    let live = admin
        .try_send(slotgate_tests::client::get_request("/livez"))
        .await
        .unwrap();
    assert_eq!(live.status, 200);
    let cold_took = served(&client, began, &cold_log).await;
    let log = std::fs::read_to_string(&cold_log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("compiling policy") && l.contains("policy=request-guard-py"))
        .unwrap_or_else(|| panic!("no compile line in {log}"));
    assert!(line.contains("bytes="), "{line}");
    assert!(
        log.contains("0 of 1 modules read from the compile cache"),
        "{log}"
    );
    cold.kill().await.unwrap();

    // The same policy again: read from the cache, served within about a second.
    let warm_log = dir.join("warm.log");
    let began = Instant::now();
    let (_warm, client, _admin) = start(&up.url(), &policy, &cache, &warm_log);
    let warm_took = served(&client, began, &warm_log).await;
    let log = std::fs::read_to_string(&warm_log).unwrap();
    assert!(
        log.contains("1 of 1 modules read from the compile cache"),
        "{log}"
    );
    println!(
        "start with request-guard-py: {:.2} s with a fresh compile cache, {:.2} s with it warm",
        cold_took.as_secs_f64(),
        warm_took.as_secs_f64()
    );
    // A sanity bound, not a timing test: the figure is the author-loop benchmark's.
    assert!(warm_took < Duration::from_secs(5), "{warm_took:?}\n{log}");
}
