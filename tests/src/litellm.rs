//! LiteLLM's proxy, the real one (`litellm[proxy]` from PyPI, installed by
//! `scripts/setup-python-clients.sh`), run from `examples/litellm/config.yaml` (or the example with
//! another routing strategy) in front of two slotgates: for the LiteLLM tests and the scale-out
//! bench.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::Child;

use crate::client::{self, post_with_headers, Client, Response};
use crate::gate::free_port;
use crate::llama::PROMPT;
use crate::logged;
use crate::request::CHAT;
use crate::wait::unique_dir;

/// The model name of both deployments in the example.
pub const MODEL: &str = "local-llama";
/// `LITELLM_MASTER_KEY`: what clients send to LiteLLM.
pub const MASTER_KEY: &str = "sk-e2e-litellm-master";
/// `SLOTGATE_API_KEY`: what LiteLLM sends to both slotgates.
pub const SLOTGATE_KEY: &str = "sk-e2e-litellm-to-slotgate";
/// LiteLLM imports a great deal of Python before it listens.
const LITELLM_START: Duration = Duration::from_secs(180);
const ANSWER: Duration = Duration::from_secs(60);

/// `litellm --config examples/litellm/config.yaml` on a free port of 127.0.0.1, pointed at the two
/// pairs through the environment the example names; killed on drop.
pub struct LiteLlm {
    child: Child,
    client: Client,
    dir: PathBuf,
    log: PathBuf,
}

impl LiteLlm {
    /// The example as it is, in front of the slotgates at `a` and `b` (their `/v1` bases).
    pub async fn start(a: &str, b: &str) -> LiteLlm {
        let config = crate::workspace().join("examples/litellm/config.yaml");
        LiteLlm::start_with(&config, a, b).await
    }

    /// The example with another routing strategy (`least-busy`, ...), as an operator changes it.
    pub async fn start_routing(strategy: &str, a: &str, b: &str) -> LiteLlm {
        let example = crate::workspace().join("examples/litellm/config.yaml");
        let text = std::fs::read_to_string(&example).expect("the LiteLLM example");
        let shuffle = "routing_strategy: simple-shuffle";
        assert!(text.contains(shuffle), "the example routes by {shuffle}");
        let config = unique_dir("litellm-config").join("config.yaml");
        std::fs::write(
            &config,
            text.replace(shuffle, &format!("routing_strategy: {strategy}")),
        )
        .unwrap();
        LiteLlm::start_with(&config, a, b).await
    }

    pub async fn start_with(config: &Path, a: &str, b: &str) -> LiteLlm {
        let dir = unique_dir("litellm");
        let log = dir.join("litellm.log");
        let port = free_port();
        // Nothing from this environment (a DATABASE_URL, provider keys) may configure it.
        let mut cmd = logged::command(crate::python::litellm(), &dir, &log);
        cmd.arg("--config")
            .arg(config)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .env("SLOTGATE_A_API_BASE", a)
            .env("SLOTGATE_B_API_BASE", b)
            .env("SLOTGATE_API_KEY", SLOTGATE_KEY)
            .env("LITELLM_MASTER_KEY", MASTER_KEY)
            // Its model price list ships with it; else it fetches one from the internet first.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", crate::python::litellm().display()));
        let mut litellm = LiteLlm {
            child,
            client: Client::tcp(([127, 0, 0, 1], port).into()),
            dir,
            log,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = litellm.child.try_wait() {
                panic!(
                    "LiteLLM exited ({status}) before it was up; log:\n{}",
                    litellm.log_tail(60)
                );
            }
            let probe = client::get_request("/health/liveliness");
            if matches!(litellm.client.try_send(probe).await, Ok(r) if r.status == 200) {
                break;
            }
            assert!(
                started.elapsed() < LITELLM_START,
                "LiteLLM not up after {LITELLM_START:?}; log:\n{}",
                litellm.log_tail(60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("LiteLLM up after {:?}", started.elapsed());
        litellm
    }

    pub fn log_tail(&self, lines: usize) -> String {
        logged::tail(&self.log, lines)
    }

    pub async fn send(&self, req: http::Request<http_body_util::Full<bytes::Bytes>>) -> Response {
        logged::send(&self.client, req, ANSWER, "LiteLLM", &self.log).await
    }

    pub async fn get(&self, path: &str, key: &str) -> Response {
        let req = http::Request::get(path)
            .header("host", "localhost")
            .header("authorization", format!("Bearer {key}"))
            .body(Default::default())
            .expect("valid request");
        self.send(req).await
    }

    /// A short chat completion of the example's model, as `tenant`, with `key` if any.
    pub async fn chat_with(&self, key: Option<&str>, tenant: &str) -> Response {
        self.chat_of(key, tenant, 2).await
    }

    /// A chat completion of `max_tokens` (generated in full) as `tenant`, with `key` if any.
    pub async fn chat_of(&self, key: Option<&str>, tenant: &str, max_tokens: u64) -> Response {
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "ignore_eos": true,
        });
        let mut headers = vec![("x-tenant".to_owned(), tenant.to_owned())];
        if let Some(key) = key {
            headers.push(("authorization".to_owned(), format!("Bearer {key}")));
        }
        self.send(post_with_headers(CHAT, &body, &headers)).await
    }

    /// A chat completion as `tenant`, which must be answered.
    pub async fn chat(&self, tenant: &str) -> Response {
        let resp = self.chat_with(Some(MASTER_KEY), tenant).await;
        assert_eq!(
            resp.status,
            200,
            "{tenant} through LiteLLM: {}\n{}",
            resp.body,
            self.log_tail(30)
        );
        assert_eq!(resp.json()["object"], "chat.completion", "{}", resp.body);
        resp
    }
}

impl Drop for LiteLlm {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            eprintln!(
                "--- LiteLLM log ({}) ---\n{}",
                self.log.display(),
                self.log_tail(60)
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
