//! The `GET /live` document (docs/live.md), as one set of types: the admin listener writes it and
//! `slotgate top` reads it. Field names are stable; new ones may be added. Every field has a
//! default when read, so a `top` a version apart from the slotgate it watches (a field added or
//! gone) still shows what both know.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Live {
    pub version: String,
    pub uptime_seconds: f64,
    pub upstream: Upstream,
    /// In front of llama-server's router: each model's pool (docs/router.md).
    pub models: Vec<ModelPool>,
    pub slots: Slots,
    pub queue: Queue,
    pub requests: Vec<Request>,
    pub tenants: Vec<Tenant>,
    /// The emptiest quotas and buckets.
    pub budgets: Vec<Budget>,
    pub rates: Rates,
    pub history: History,
    pub totals: Totals,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Upstream {
    pub target: String,
    pub ready: bool,
    pub reached: bool,
    pub last_error: Option<String>,
    pub total_slots: Option<u64>,
    /// `router` or `server`.
    pub role: String,
    /// The router's models and their states; `null` when not a router.
    pub router: serde_json::Value,
}

/// One model's pool behind a router (`/live` and `/status` → `models[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelPool {
    pub model: String,
    pub admitting: bool,
    pub load: ModelLoad,
    pub slots: u64,
    /// `fixed` or `its child's total_slots`.
    pub slots_source: String,
    pub busy: u64,
    pub serving: u64,
    pub depth: u64,
    pub capacity: u64,
    pub queue_timeout_seconds: f64,
    pub kv_pool_tokens: Option<u64>,
    pub kv_reserved_tokens: u64,
    pub n_ctx_slot: Option<u64>,
    pub estimated_wait_seconds: f64,
    pub sheddable: u64,
    pub shed_before_first_byte: u64,
    pub shed_after_first_byte: u64,
}

/// Where a model's load stands.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelLoad {
    /// `loading`, `waiting for room`, `unloading <model>`; `null` when idle.
    pub doing: Option<String>,
    pub for_seconds: Option<f64>,
    pub last_seconds: Option<f64>,
    pub failures: u64,
    pub error: Option<String>,
    pub retry_in_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Queue {
    pub depth: u64,
    pub capacity: u64,
    pub estimated_wait_seconds: f64,
    pub draining: bool,
    /// The next to be served first.
    pub waiters: Vec<Waiter>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Waiter {
    /// Its model's pool, behind a router; `null` for the one pool.
    pub model: Option<String>,
    pub request_id: Option<String>,
    pub path: Option<String>,
    pub tenant: String,
    pub priority: i64,
    pub effective_priority: i64,
    pub age_seconds: f64,
    pub reserved_tokens: u64,
    pub slots: u64,
    pub kv_tokens: u64,
    pub expected_start_seconds: f64,
    /// Until its own deadline (`null` without one).
    pub deadline_in_seconds: Option<f64>,
    /// Its overload band (`null`: none).
    pub band: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Its own deadline, milliseconds after arrival (header or policy).
    pub deadline_ms: Option<u64>,
    /// Times it was shed before its first byte and queued again.
    pub shed: u64,
    /// Its overload band, when it is in one.
    pub band: Option<String>,
    /// The session its client named (docs/sessions.md).
    pub session: Option<String>,
    /// The agent that sent it.
    pub agent: Option<String>,
    /// The agent that started that agent; none for a root agent.
    pub parent_agent: Option<String>,
    /// `X-Conversation-Id`: the resumable answer it is.
    pub conversation: Option<String>,
}

impl Request {
    /// Holding slots: admitted, and not yet over.
    pub fn in_service(&self) -> bool {
        self.in_service_seconds.is_some() && self.slots > 0
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tenant {
    pub tenant: String,
    pub requests: u64,
    pub served_tokens: u64,
    pub share: f64,
    pub virtual_tokens: Option<f64>,
    pub waiting: u64,
    pub in_service: u64,
    /// Requests refused, by outcome.
    pub refused: BTreeMap<String, u64>,
}

impl Tenant {
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }
}

/// One quota or bucket, with what is left.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    pub policy: String,
    pub key: String,
    /// `quota` or `bucket`.
    pub kind: String,
    /// A quota's calendar period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<String>,
    pub left: f64,
    pub limit: Option<f64>,
    /// When a quota's window ends (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<String>,
    /// A bucket's refill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refill_per_second: Option<f64>,
}

impl Budget {
    /// What is left, as a share of its limit (1 without one).
    pub fn fill(&self) -> f64 {
        self.limit.map_or(1.0, |l| self.left / l.max(1e-9))
    }
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
            .min_by(|a, b| a.fill().total_cmp(&b.fill()))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rates {
    /// What the per-second rates are averaged over.
    pub window_seconds: u64,
    pub requests_per_second: f64,
    pub tokens_per_second: f64,
    pub refused_per_second: f64,
    /// What the queue-wait quantiles are taken over.
    pub queue_wait_window_seconds: u64,
    /// Requests given a slot in that window; the quantiles are `null` without any.
    pub queue_waits: u64,
    pub queue_wait_p50_seconds: Option<f64>,
    pub queue_wait_p95_seconds: Option<f64>,
}

/// The last whole seconds, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct History {
    pub seconds: u64,
    pub requests: Vec<u64>,
    pub tokens: Vec<u64>,
    pub refused: Vec<u64>,
}

/// Since start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// Requests by outcome, those seen at least once.
    pub outcomes: BTreeMap<String, u64>,
    pub tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn page(name: &str) -> String {
        let path = format!("{}/../docs/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).expect(&path)
    }

    /// docs/live.md, and its example of `GET /live`.
    fn doc() -> (String, Value) {
        let text = page("live.md");
        let section = text.split("## `GET /live`").nth(1).expect("its section");
        let json = section.split("```json").nth(1).expect("its example");
        let json = json.split("```").next().unwrap().replace('…', "");
        let example = serde_json::from_str(&json).expect("the example is JSON");
        (text, example)
    }

    /// Every key of `v`, with its path (`queue.waiters[].tenant`).
    fn keys(v: &Value, at: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    // Maps keyed by data, not by field.
                    if k != "refused" && k != "outcomes" && k != "router" {
                        keys(v, &path, out);
                    }
                    out.push(path);
                }
            }
            Value::Array(items) => {
                for item in items {
                    keys(item, &format!("{at}[]"), out);
                }
            }
            _ => {}
        }
    }

    /// The documented example reads into the type and writes back with every key it has, and
    /// every key the type writes is in the example or named in the page (`models[]`: in
    /// docs/router.md): the doc and the one type cannot drift apart.
    #[test]
    fn the_type_and_docs_live_md_name_the_same_fields() {
        let (text, example) = doc();
        let router = page("router.md");
        let live: Live = serde_json::from_value(example.clone()).expect("the example reads");
        let back = serde_json::to_value(&live).unwrap();
        let (mut documented, mut written) = (Vec::new(), Vec::new());
        keys(&example, "", &mut documented);
        keys(&back, "", &mut written);
        let unknown: Vec<&String> = documented.iter().filter(|k| !written.contains(k)).collect();
        assert!(
            unknown.is_empty(),
            "in docs/live.md, not in the type: {unknown:?}"
        );
        // A full document: one of everything, every option set.
        let mut full = live.clone();
        full.models = vec![ModelPool::default()];
        full.upstream.router = Value::Null;
        let full = serde_json::to_value(&full).unwrap();
        let mut all = Vec::new();
        keys(&full, "", &mut all);
        let undocumented: Vec<&String> = all
            .iter()
            .filter(|k| !documented.contains(k))
            .filter(|k| {
                let last = k.rsplit('.').next().unwrap().trim_end_matches("[]");
                let page = if k.starts_with("models[].") {
                    &router
                } else {
                    &text
                };
                !page.contains(&format!("`{last}"))
            })
            .collect();
        assert!(
            undocumented.is_empty(),
            "written by the type, named nowhere in docs/live.md: {undocumented:?}"
        );
    }
}
