//! What `slotgate top` reads: the admin listener's `GET /live` (docs/live.md) and llama-server's
//! own `GET /slots`, forwarded there. Every field has a default, so a slotgate a version apart (a
//! field added or gone) still shows what both know.

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Live {
    pub version: String,
    pub uptime_seconds: f64,
    pub upstream: Upstream,
    pub slots: Slots,
    pub queue: Queue,
    pub requests: Vec<Request>,
    pub tenants: Vec<Tenant>,
    pub rates: Rates,
    pub history: History,
    /// In front of llama-server's router: each model's pool (docs/router.md).
    pub models: Vec<ModelPool>,
    /// The emptiest quotas and buckets.
    pub budgets: Vec<Budget>,
}

/// One quota or bucket, as `/live`'s `budgets[]` describes it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Budget {
    pub policy: String,
    pub key: String,
    pub left: f64,
    pub limit: Option<f64>,
}

impl Live {
    /// The emptiest budget of `tenant` (a key that is the tenant, or ends in `:` and the tenant, as
    /// the example policies key them): what is left of its limit.
    pub fn budget_of(&self, tenant: &str) -> Option<&Budget> {
        self.budgets
            .iter()
            .filter(|b| {
                b.key == tenant || b.key.strip_suffix(tenant).is_some_and(|k| k.ends_with(':'))
            })
            .min_by(|a, b| fill(a).total_cmp(&fill(b)))
    }
}

fn fill(b: &Budget) -> f64 {
    b.limit.map_or(1.0, |l| b.left / l.max(1e-9))
}

/// One model's pool behind a router, as `/live`'s `models[]` describes it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ModelPool {
    pub model: String,
    pub admitting: bool,
    pub load: ModelLoad,
    pub slots: u64,
    pub busy: u64,
    pub depth: u64,
    pub capacity: u64,
    pub estimated_wait_seconds: f64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ModelLoad {
    pub doing: Option<String>,
    pub for_seconds: Option<f64>,
    pub last_seconds: Option<f64>,
    pub failures: u64,
    pub error: Option<String>,
    pub retry_in_seconds: Option<f64>,
}

impl ModelPool {
    /// Where its model stands: `loaded`, what its load is doing (`loading 2.1s`, `waiting for
    /// room`), `failed` (retried in so long), or `unloaded`.
    pub fn state(&self) -> String {
        let l = &self.load;
        if let Some(doing) = &l.doing {
            return match l.for_seconds {
                Some(s) => format!("{doing} {}", super::view::dur(s)),
                None => doing.clone(),
            };
        }
        if let (Some(_), Some(retry)) = (&l.error, l.retry_in_seconds) {
            return format!("failed, retry in {}", super::view::dur(retry));
        }
        match (self.admitting, l.error.is_some()) {
            (true, _) => "loaded".into(),
            (false, true) => "failed".into(),
            (false, false) => "unloaded".into(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Upstream {
    pub target: String,
    pub ready: bool,
    pub reached: bool,
    pub last_error: Option<String>,
    pub total_slots: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Slots {
    pub total: u64,
    pub busy: u64,
    pub in_service: u64,
    pub kv_pool_tokens: Option<u64>,
    pub kv_reserved_tokens: u64,
    /// Sheddable requests in service, and requests shed since start (`--sheddable-priority`).
    pub sheddable: u64,
    pub shed_before_first_byte: u64,
    pub shed_after_first_byte: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Queue {
    pub depth: u64,
    pub capacity: u64,
    pub estimated_wait_seconds: f64,
    pub draining: bool,
    pub waiters: Vec<Waiter>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Waiter {
    pub request_id: Option<String>,
    pub path: Option<String>,
    pub tenant: String,
    pub priority: i64,
    pub effective_priority: i64,
    pub age_seconds: f64,
    pub reserved_tokens: u64,
    pub slots: u64,
    pub expected_start_seconds: f64,
    /// Until its own deadline (`null` without one).
    pub deadline_in_seconds: Option<f64>,
    /// Its overload band (`null`: none).
    pub band: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Request {
    pub request_id: String,
    pub method: String,
    pub path: String,
    pub tenant: Option<String>,
    pub phase: String,
    pub priority: i64,
    pub stream: bool,
    pub age_seconds: f64,
    pub in_service_seconds: Option<f64>,
    pub slots: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Times it was shed before its first byte and queued again.
    pub shed: u64,
}

impl Request {
    /// Holding slots: admitted, and not yet over.
    pub fn in_service(&self) -> bool {
        self.in_service_seconds.is_some() && self.slots > 0
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Tenant {
    pub tenant: String,
    pub requests: u64,
    pub served_tokens: u64,
    pub share: f64,
    pub virtual_tokens: Option<f64>,
    pub waiting: u64,
    pub in_service: u64,
    pub refused: std::collections::BTreeMap<String, u64>,
}

impl Tenant {
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Rates {
    pub window_seconds: u64,
    pub requests_per_second: f64,
    pub tokens_per_second: f64,
    pub refused_per_second: f64,
    pub queue_wait_p50_seconds: Option<f64>,
    pub queue_wait_p95_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct History {
    pub requests: Vec<u64>,
    pub tokens: Vec<u64>,
    pub refused: Vec<u64>,
}

/// One of llama-server's slots, as its `GET /slots` describes it (tools/server/server-context.cpp,
/// `server_slot::to_json`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct LlamaSlot {
    pub id: u64,
    pub n_ctx: u64,
    pub is_processing: bool,
    pub id_task: Option<i64>,
    pub n_prompt_tokens: Option<u64>,
    pub next_token: Vec<NextToken>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct NextToken {
    pub n_decoded: u64,
}

impl LlamaSlot {
    pub fn decoded(&self) -> u64 {
        self.next_token.first().map_or(0, |t| t.n_decoded)
    }
}

/// What one refresh brought.
#[derive(Debug, Clone)]
pub struct Picture {
    pub live: Live,
    /// llama-server's `/slots`, or why it could not be read (not ready, `--no-slots`, an older
    /// slotgate).
    pub llama_slots: Result<Vec<LlamaSlot>, String>,
}
