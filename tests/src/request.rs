//! Request bodies for tests: a fluent builder over chat/completions JSON plus the fake upstream's knobs.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::client::{Client, Response};

/// The chat path most tests use.
pub const CHAT: &str = "/v1/chat/completions";

/// A request body under construction, and any extra request headers.
#[derive(Clone, Debug)]
pub struct Req {
    body: Value,
    headers: Vec<(String, String)>,
}

impl Req {
    /// A chat request tagged `tag` (echoed back by the fake).
    pub fn chat(tag: &str) -> Self {
        Self {
            body: json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "fake_tag": tag}),
            headers: Vec::new(),
        }
    }

    /// Exactly `body`, as for the real llama-server (no fake knobs).
    pub fn from_json(body: Value) -> Self {
        Self {
            body,
            headers: Vec::new(),
        }
    }

    /// Adds a request header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sends `Authorization: Bearer <key>`: the request's tenant, unless a policy names another.
    pub fn api_key(self, key: &str) -> Self {
        self.header("authorization", &format!("Bearer {key}"))
    }

    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.body[key] = value.into();
        self
    }

    /// Non-stream service time at the fake.
    pub fn delay(self, d: Duration) -> Self {
        self.set("fake_delay_ms", d.as_millis() as u64)
    }

    pub fn stream(self) -> Self {
        self.set("stream", true)
    }

    /// A stream of `n` chunks, `every` apart.
    pub fn chunks(self, n: u64, every: Duration) -> Self {
        self.stream()
            .set("fake_chunks", n)
            .set("fake_chunk_delay_ms", every.as_millis() as u64)
    }

    pub fn priority(self, p: i64) -> Self {
        self.set("priority", p)
    }

    pub fn prompt_tokens(self, n: u64) -> Self {
        self.set("fake_prompt_tokens", n)
    }

    pub fn completion_tokens(self, n: u64) -> Self {
        self.set("fake_completion_tokens", n)
    }

    /// The counts are reported only as llama-server's `timings`, no `usage` (a stream whose client
    /// did not ask for `stream_options.include_usage`), `cached` of the prompt tokens as `cache_n`.
    pub fn usage_in_timings_only(self, cached: u64) -> Self {
        self.set("fake_usage", "timings")
            .set("fake_cached_tokens", cached)
    }

    pub fn json(&self) -> Value {
        self.body.clone()
    }

    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }
}

/// Sends `req` to `path` in a task; the handle yields the response and how long it took.
pub fn spawn_post(client: &Client, path: &str, req: &Req) -> JoinHandle<(Response, Duration)> {
    let (client, path, req) = (client.clone(), path.to_owned(), req.clone());
    tokio::spawn(async move {
        let t0 = Instant::now();
        let resp = client
            .post_json_with_headers(&path, &req.json(), req.headers())
            .await;
        (resp, t0.elapsed())
    })
}

/// Joins every handle; each must yield exactly one response (a panic or a lost task fails the test).
pub async fn join_all<T>(handles: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for (i, h) in handles.into_iter().enumerate() {
        out.push(
            h.await
                .unwrap_or_else(|e| panic!("client task {i} did not yield a response: {e}")),
        );
    }
    out
}
