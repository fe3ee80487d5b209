//! `examples/enterprise/`: the seed's chat, embedding and reranker llama-servers, each with its own
//! slotgate. Every config is valid, they can run side by side, their settings follow the reasoning
//! in their comments, and the embedding one serves a burst in front of the real llama-server.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;
use slotgate_tests::llama::{library_path, LlamaPaths};
use slotgate_tests::*;

fn example(name: &str) -> PathBuf {
    slotgate_tests::workspace().join(format!("examples/enterprise/{name}.toml"))
}

/// `slotgate check --config` on the example: its effective settings.
fn effective(name: &str) -> toml::Table {
    let out = gate::command()
        .args(["check", "--config"])
        .arg(example(name))
        .output()
        .expect("run slotgate check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.parse().expect("check prints TOML")
}

fn seconds(t: &toml::Table, key: &str) -> f64 {
    let text = t[key].as_str().unwrap_or_else(|| panic!("{key}: {t:#?}"));
    let n: f64 = text
        .trim_end_matches(|c: char| c.is_alphabetic())
        .parse()
        .unwrap();
    match text.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.') {
        "s" => n,
        "m" => n * 60.0,
        "ms" => n / 1000.0,
        unit => panic!("{key} = {text}: unit {unit}"),
    }
}

#[test]
fn the_three_configs_are_valid_fit_side_by_side_and_match_their_workloads() {
    let [chat, embedding, reranker] = ["chat", "embedding", "reranker"].map(effective);
    let all = [&chat, &embedding, &reranker];
    for t in all {
        assert_eq!(t["slots"].as_str(), Some("auto"), "slots follow each -np");
    }
    // Side by side on one machine: no shared socket or admin port.
    let mut places: Vec<String> = all
        .iter()
        .flat_map(|t| {
            let mut v: Vec<String> = t["listen"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap().to_owned())
                .collect();
            v.push(t["admin-listen"].as_str().unwrap().to_owned());
            v
        })
        .collect();
    let n = places.len();
    places.sort();
    places.dedup();
    assert_eq!(places.len(), n, "a socket or port is shared: {places:?}");
    // The reranker sits on the user's path: it fails fastest; chat waits longest.
    let wait = |t: &toml::Table| seconds(t, "queue-timeout");
    assert!(wait(&reranker) < wait(&embedding) && wait(&embedding) < wait(&chat));
    // Short requests may queue deeper than long ones.
    let depth = |t: &toml::Table| t["queue-depth"].as_integer().unwrap();
    assert!(depth(&chat) < depth(&reranker) && depth(&reranker) < depth(&embedding));
    // Chat prefill of a long prompt needs the longest first-byte timeout.
    let first = |t: &toml::Table| seconds(t, "upstream-first-byte-timeout");
    assert!(first(&chat) > first(&embedding) && first(&chat) > first(&reranker));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedding_config_serves_a_burst_in_front_of_the_real_llama_server() {
    let _serial = slotgate_tests::llama::serial().await;
    let paths = LlamaPaths::get();
    let argv = [
        paths.server.display().to_string(),
        "-m".into(),
        paths.model.display().to_string(),
        "--embeddings".into(),
        "--pooling".into(),
        "mean".into(),
        "-np".into(),
        "4".into(),
        "-c".into(),
        "4096".into(),
    ];
    // The harness's own --listen and --admin-listen beat the file's (flags beat the file).
    let gate = Gate::new()
        .opt("--config", example("embedding").display())
        .wrapping(argv)
        .env("LD_LIBRARY_PATH", library_path().to_str().unwrap())
        .start()
        .await;
    gate.wait_status(Duration::from_secs(10), "four slots", |s| {
        s["slots"]["total"] == 4
    })
    .await;
    let client = gate.client();
    let burst: Vec<_> = (0..24)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let body = json!({"input": [format!("document {i}"), "a query"]});
                client.post_json("/v1/embeddings", &body).await
            })
        })
        .collect();
    for h in burst {
        let resp = h.await.unwrap();
        assert_eq!(resp.status, 200, "{}", resp.body);
        let v = resp.json();
        assert_eq!(v["data"].as_array().map(Vec::len), Some(2), "{v}");
    }
    gate.wait_outcome("ok", 24).await;
    gate.assert_idle().await;
}
