//! SMG, the Shepherd Model Gateway (PyPI `smg`, pinned and installed by `scripts/setup-smg.sh`): a
//! router whose load-aware policies (`least_load`, `power_of_two`) poll each worker's load, run in
//! front of slotgates. From its source (1.13.0, `model_gateway/src/worker/monitor.rs`): every
//! `--load-monitor-interval` it asks a worker `GET /loads?model=<id>` (a gateway's route), then
//! `GET /v1/loads?include=core,disagg,queues,memory` (an engine's), remembers which answered and
//! which 404'd, and without either reads vLLM's or SGLang's Prometheus gauges from `/metrics`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::process::Child;

use crate::client::{self, Client, Response};
use crate::gate::free_port;
use crate::llama::PROMPT;
use crate::logged;
use crate::request::CHAT;
use crate::wait::unique_dir;

const START: Duration = Duration::from_secs(60);
const ANSWER: Duration = Duration::from_secs(60);

/// `$SLOTGATE_SMG`, else the one `scripts/setup-smg.sh` installs (the first time) and prints. Fails
/// the test with the script's stderr when neither works: it never skips.
pub fn smg() -> &'static Path {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let resolved = PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("SLOTGATE_SMG") {
            return Ok(PathBuf::from(p));
        }
        let script = "setup-smg.sh";
        let stdout = crate::setup_script(script)?;
        crate::setup_value(script, &stdout, "SLOTGATE_SMG")
    });
    match resolved {
        Ok(p) if p.is_file() => p,
        Ok(p) => panic!("SMG is not at {}: run scripts/setup-smg.sh", p.display()),
        Err(e) => panic!("{e}"),
    }
}

/// `smg launch` on a free port of 127.0.0.1 in front of `workers`; killed on drop.
pub struct Smg {
    child: Child,
    client: Client,
    log: PathBuf,
    /// The model its workers serve (from its `/v1/models`).
    pub model: String,
}

impl Smg {
    /// SMG with `--worker-urls workers` and the further `args` (`--policy least_load`, ...), up
    /// once it lists a model: every worker answered its health check and model list.
    pub async fn start(workers: &[String], args: &[&str]) -> Smg {
        let dir = unique_dir("smg");
        let log = dir.join("smg.log");
        let port = free_port();
        // Its Prometheus listener too: by default 0.0.0.0:29000, which a second SMG cannot bind.
        let metrics_port = free_port();
        let mut cmd = logged::command(smg(), &dir, &log);
        cmd.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--prometheus-host", "127.0.0.1"])
            .args(["--prometheus-port", &metrics_port.to_string()])
            .arg("--worker-urls")
            .args(workers)
            .args(args)
            .env("NO_COLOR", "1");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", smg().display()));
        let mut smg = Smg {
            child,
            client: Client::tcp(([127, 0, 0, 1], port).into()),
            log,
            model: String::new(),
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = smg.child.try_wait() {
                panic!(
                    "SMG exited ({status}) before it was up; log:\n{}",
                    smg.log_tail(60)
                );
            }
            let probe = client::get_request("/v1/models");
            if let Ok(r) = smg.client.try_send(probe).await {
                if let Some(id) = r.status.is_success().then(|| model_of(&r)).flatten() {
                    smg.model = id;
                    break;
                }
            }
            assert!(
                started.elapsed() < START,
                "SMG not up after {START:?}; log:\n{}",
                smg.log_tail(60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("SMG up after {:?}, model {}", started.elapsed(), smg.model);
        smg
    }

    pub fn log_tail(&self, lines: usize) -> String {
        logged::tail(&self.log, lines)
    }

    async fn send(&self, req: http::Request<http_body_util::Full<bytes::Bytes>>) -> Response {
        logged::send(&self.client, req, ANSWER, "SMG", &self.log).await
    }

    /// SMG's own `GET /loads`: the last load it polled from each worker, one rank per worker
    /// (`worker` names it).
    pub async fn loads(&self) -> Value {
        let resp = self.send(client::get_request("/loads")).await;
        assert_eq!(resp.status, 200, "SMG /loads: {}", resp.body);
        resp.json()
    }

    /// The rank SMG last polled from `worker` (its URL), if any.
    pub async fn load_of(&self, worker: &str) -> Option<Value> {
        let loads = self.loads().await;
        loads["loads"]
            .as_array()?
            .iter()
            .find(|r| r["worker"].as_str() == Some(worker))
            .cloned()
    }

    /// A chat completion of `max_tokens` (generated in full), as `tenant`.
    pub async fn chat(&self, tenant: &str, max_tokens: u64) -> Response {
        let body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "ignore_eos": true,
        });
        let headers = [("x-tenant".to_owned(), tenant.to_owned())];
        self.send(client::post_with_headers(CHAT, &body, &headers))
            .await
    }
}

fn model_of(r: &Response) -> Option<String> {
    r.json()["data"][0]["id"].as_str().map(str::to_owned)
}
