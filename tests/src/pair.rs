//! One llama-server (the tiny model, one slot, one thread) behind one slotgate listening on TCP:
//! what the scale-out tests and bench put behind a router (LiteLLM, SMG).

use crate::gate::{free_port, Gate, RunningGate};
use crate::llama::{server_argv, LlamaServer, RunningLlama};

pub struct Pair {
    pub name: &'static str,
    pub llama: RunningLlama,
    pub gate: RunningGate,
    pub port: u16,
}

impl Pair {
    /// `gate` (its queue, policies and options as the caller sets them) in front of a new
    /// llama-server of one slot, on a free port of 127.0.0.1.
    pub async fn start(name: &'static str, gate: Gate) -> Pair {
        // One thread each: two llama-servers decoding at once with a thread per core each run many
        // times slower on a two-core machine (docs/router.md), and a burst's answers would outlast
        // a test's patience.
        let mut argv = server_argv(1);
        argv.extend(["-t".to_owned(), "1".to_owned()]);
        let llama = LlamaServer::start_argv(argv).await;
        let port = free_port();
        let gate = gate
            .upstream_path(llama.socket())
            .listen(format!("tcp:127.0.0.1:{port}"))
            .start()
            .await;
        Pair {
            name,
            llama,
            gate,
            port,
        }
    }

    /// `http://127.0.0.1:<port>`: the worker URL a router is given.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The OpenAI base (`<url>/v1`).
    pub fn api_base(&self) -> String {
        format!("{}/v1", self.url())
    }

    /// Requests this slotgate has finished, all outcomes.
    pub async fn finished(&self) -> u64 {
        self.gate
            .metrics()
            .await
            .sum("slotgate_requests_total", &[]) as u64
    }

    /// Requests this slotgate has finished with `outcome`.
    pub async fn outcome(&self, outcome: &str) -> u64 {
        self.gate
            .metrics()
            .await
            .sum("slotgate_requests_total", &[("outcome", outcome)]) as u64
    }

    /// Requests it refused as overloaded: `queue_full`, or a wait longer than allowed.
    pub async fn overloaded(&self) -> u64 {
        self.outcome("queue_full").await + self.outcome("wait_too_long").await
    }

    /// Slots, queue and in-flight at 0, and llama-server idle.
    pub async fn assert_idle(&self) {
        self.gate.assert_idle().await;
        self.llama.assert_idle().await;
    }
}
