//! Metric names, their descriptions and histogram buckets: the one list an SRE reads.

use std::collections::HashMap;
use std::sync::Arc;

use metrics::{
    describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::Outcome;

pub const REQUESTS_TOTAL: &str = "slotgate_requests_total";
pub const QUEUE_DEPTH: &str = "slotgate_queue_depth";
pub const INFLIGHT: &str = "slotgate_inflight";
pub const SLOTS_BUSY: &str = "slotgate_slots_busy";
pub const SLOTS_TOTAL: &str = "slotgate_slots_total";
pub const QUEUE_CAPACITY: &str = "slotgate_queue_capacity";
pub const QUEUE_WAIT_SECONDS: &str = "slotgate_queue_wait_seconds";
pub const UPSTREAM_SECONDS: &str = "slotgate_upstream_seconds";
pub const TTFB_SECONDS: &str = "slotgate_time_to_first_byte_seconds";
pub const TOKENS_TOTAL: &str = "slotgate_tokens_total";
pub const TENANT_TOKENS_TOTAL: &str = "slotgate_tenant_tokens_total";
pub const UPSTREAM_READY: &str = "slotgate_upstream_ready";
pub const UPSTREAM_RETRIES_TOTAL: &str = "slotgate_upstream_retries_total";
pub const UPSTREAM_CONNECTIONS_TOTAL: &str = "slotgate_upstream_connections_total";
pub const PROMPT_COUNTS_TOTAL: &str = "slotgate_prompt_counts_total";
pub const RETRY_AFTER_SECONDS: &str = "slotgate_retry_after_seconds";
pub const TOKENS_RESERVED_TOTAL: &str = "slotgate_tokens_reserved_total";
pub const TOKENS_REFUNDED_TOTAL: &str = "slotgate_tokens_refunded_total";
pub const COST_ESTIMATE_ERROR_RATIO: &str = "slotgate_cost_estimate_error_ratio";
pub const POLICY_EVAL_SECONDS: &str = "slotgate_policy_eval_seconds";
pub const POLICY_DECISIONS_TOTAL: &str = "slotgate_policy_decisions_total";
pub const POLICY_ERRORS_TOTAL: &str = "slotgate_policy_errors_total";
pub const POLICY_FUEL_CONSUMED: &str = "slotgate_policy_fuel_consumed";
pub const POLICY_RELOADS_TOTAL: &str = "slotgate_policy_reloads_total";
pub const POLICY_EVENTS_TOTAL: &str = "slotgate_policy_events_total";
pub const ADMIN_ACTIONS_TOTAL: &str = "slotgate_admin_actions_total";
pub const STATE_WRITES_TOTAL: &str = "slotgate_state_writes_total";
pub const STATE_ROWS_WRITTEN_TOTAL: &str = "slotgate_state_rows_written_total";
pub const UPSTREAM_SLOTS: &str = "slotgate_upstream_slots";
pub const SLOTS_MISMATCH: &str = "slotgate_slots_mismatch";
pub const CHILD_RESTARTS_TOTAL: &str = "slotgate_child_restarts_total";
pub const KV_CACHE_RESERVED_RATIO: &str = "slotgate_kv_cache_reserved_ratio";
pub const KV_POOL_TOKENS: &str = "slotgate_kv_pool_tokens";
pub const KV_RESERVED_TOKENS: &str = "slotgate_kv_reserved_tokens";
pub const TENANTS_AT_CAP: &str = "slotgate_tenants_at_cap";
pub const MODEL_QUEUE_DEPTH: &str = "slotgate_model_queue_depth";
pub const MODEL_QUEUE_CAPACITY: &str = "slotgate_model_queue_capacity";
pub const MODEL_SLOTS_BUSY: &str = "slotgate_model_slots_busy";
pub const MODEL_SLOTS_TOTAL: &str = "slotgate_model_slots_total";
pub const MODEL_LOADED: &str = "slotgate_model_loaded";
pub const MODEL_LOADS_TOTAL: &str = "slotgate_model_loads_total";
pub const MODEL_UNLOADS_TOTAL: &str = "slotgate_model_unloads_total";
pub const MODEL_LOAD_SECONDS: &str = "slotgate_model_load_seconds";
pub const MODEL_REQUESTS_TOTAL: &str = "slotgate_model_requests_total";
pub const SHED_TOTAL: &str = "slotgate_shed_total";
pub const BAND_SLOTS_BUSY: &str = "slotgate_band_slots_busy";
pub const BAND_QUEUE_DEPTH: &str = "slotgate_band_queue_depth";
pub const BAND_REFUSED_TOTAL: &str = "slotgate_band_refused_total";
pub const STATE_UP: &str = "slotgate_state_up";
pub const STATE_SYNC_SECONDS: &str = "slotgate_state_sync_seconds";
pub const STATE_ERRORS_TOTAL: &str = "slotgate_state_errors_total";
pub const STATE_LEASE_TOKENS: &str = "slotgate_state_lease_tokens";
pub const CALLERS_REFUSED_TOTAL: &str = "slotgate_callers_refused_total";
pub const STATE_EVICTED_TOTAL: &str = "slotgate_state_evicted_total";
pub const KEYS_FILE_READS_TOTAL: &str = "slotgate_keys_file_reads_total";
pub const REFUSALS_DELAYED_TOTAL: &str = "slotgate_refusals_delayed_total";
pub const KEYS_SYNCED_TOTAL: &str = "slotgate_keys_synced_total";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "slotgate_connections_refused_total";

/// Seconds of one round trip to the state store: a Unix socket's tens of microseconds to a remote
/// store's milliseconds, and the fetch timeout.
const STATE_SYNC_BUCKETS: &[f64] = &[
    5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05, 0.25,
];

/// Seconds of one policy evaluation: microseconds normally, the deadline at worst.
const POLICY_BUCKETS: &[f64] = &[
    1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.02, 0.1,
];

/// `estimate / exact` prompt tokens: 1 is a perfect estimate.
const ERROR_RATIO_BUCKETS: &[f64] = &[
    0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0,
];

/// Fuel consumed, in buckets from a trivial policy to the default budget.
pub const FUEL_BUCKETS: &[f64] = &[1e2, 1e3, 1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7, 1e8];

/// Seconds, from a fast 429 to a long generation.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Installs the global Prometheus recorder and describes every metric, so each name is scrapeable
/// (with HELP and TYPE) from the first scrape on.
pub fn install() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let mut builder = PrometheusBuilder::new();
    builder = builder.set_buckets_for_metric(
        Matcher::Full(RETRY_AFTER_SECONDS.to_owned()),
        &[1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0],
    )?;
    for name in [
        QUEUE_WAIT_SECONDS,
        UPSTREAM_SECONDS,
        TTFB_SECONDS,
        MODEL_LOAD_SECONDS,
    ] {
        builder =
            builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), LATENCY_BUCKETS)?;
    }
    builder = builder
        .set_buckets_for_metric(
            Matcher::Full(POLICY_EVAL_SECONDS.to_owned()),
            POLICY_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Full(POLICY_FUEL_CONSUMED.to_owned()), FUEL_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(STATE_SYNC_SECONDS.to_owned()),
            STATE_SYNC_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(COST_ESTIMATE_ERROR_RATIO.to_owned()),
            ERROR_RATIO_BUCKETS,
        )?;
    let handle = builder.install_recorder()?;
    describe();
    let _ = hot();
    Ok(handle)
}

/// Handles of the metrics every request touches, resolved once, from the recorder `install` put in
/// place: a registry look-up (hashing the name and labels, a shard lock) costs more than the update.
pub struct Hot {
    /// `slotgate_requests_total`, by outcome (in `Outcome::ALL` order).
    requests: Vec<Counter>,
    pub queue_wait: Histogram,
    pub upstream_seconds: Histogram,
    pub ttfb: Histogram,
    pub prompt_tokens: Counter,
    pub completion_tokens: Counter,
    pub tokens_reserved: Counter,
    pub tokens_refunded: Counter,
    pub queue_depth: Gauge,
    pub slots_busy: Gauge,
    pub kv_reserved: Gauge,
    /// `slotgate_tenants_at_cap`: tenants with as many requests in service as their cap allows.
    pub tenants_at_cap: Gauge,
    pub inflight: Gauge,
    pub upstream_connections: Counter,
    pub cost_error: Histogram,
    /// `slotgate_prompt_counts_total`, by source (see [`PROMPT_COUNT_SOURCES`]).
    prompt_counts: Vec<Counter>,
}

/// How a prompt was counted: the `source` label of `slotgate_prompt_counts_total`.
pub const PROMPT_COUNT_SOURCES: [&str; 4] = ["upstream", "cache", "estimate", "forwarded"];

impl Hot {
    fn resolve() -> Hot {
        Hot {
            requests: Outcome::ALL
                .iter()
                .map(|o| metrics::counter!(REQUESTS_TOTAL, "outcome" => o.label()))
                .collect(),
            queue_wait: metrics::histogram!(QUEUE_WAIT_SECONDS),
            upstream_seconds: metrics::histogram!(UPSTREAM_SECONDS),
            ttfb: metrics::histogram!(TTFB_SECONDS),
            prompt_tokens: metrics::counter!(TOKENS_TOTAL, "kind" => "prompt"),
            completion_tokens: metrics::counter!(TOKENS_TOTAL, "kind" => "completion"),
            tokens_reserved: metrics::counter!(TOKENS_RESERVED_TOTAL),
            tokens_refunded: metrics::counter!(TOKENS_REFUNDED_TOTAL),
            queue_depth: metrics::gauge!(QUEUE_DEPTH),
            slots_busy: metrics::gauge!(SLOTS_BUSY),
            kv_reserved: metrics::gauge!(KV_RESERVED_TOKENS),
            tenants_at_cap: metrics::gauge!(TENANTS_AT_CAP),
            inflight: metrics::gauge!(INFLIGHT),
            upstream_connections: metrics::counter!(UPSTREAM_CONNECTIONS_TOTAL),
            cost_error: metrics::histogram!(COST_ESTIMATE_ERROR_RATIO),
            prompt_counts: PROMPT_COUNT_SOURCES
                .iter()
                .map(|s| metrics::counter!(PROMPT_COUNTS_TOTAL, "source" => *s))
                .collect(),
        }
    }

    /// `slotgate_prompt_counts_total{source}`.
    pub fn prompt_counts(&self, source: &str) -> &Counter {
        let at = PROMPT_COUNT_SOURCES.iter().position(|s| *s == source);
        &self.prompt_counts[at.unwrap_or(0)]
    }

    /// `slotgate_requests_total{outcome}`.
    pub fn requests(&self, outcome: Outcome) -> &Counter {
        let at = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        &self.requests[at]
    }
}

/// `slotgate_retry_after_seconds{code}`, its handle resolved once per code (there are a handful).
pub fn retry_after(code: &'static str) -> Histogram {
    static SEEN: std::sync::Mutex<Vec<(&'static str, Histogram)>> =
        std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, h)) = seen.iter().find(|(c, _)| *c == code) {
        return h.clone();
    }
    let h = metrics::histogram!(RETRY_AFTER_SECONDS, "code" => code);
    seen.push((code, h.clone()));
    h
}

/// `slotgate_callers_refused_total{reason}`: a request refused for its caller before anything was
/// charged.
pub fn caller_refused(reason: &'static str) {
    metrics::counter!(CALLERS_REFUSED_TOTAL, "reason" => reason).increment(1);
}

/// `slotgate_state_evicted_total{kind}`: `n` entries forgotten at a bound.
pub fn state_evicted(kind: &'static str, n: usize) {
    if n > 0 {
        metrics::counter!(STATE_EVICTED_TOTAL, "kind" => kind).increment(n as u64);
    }
}

/// The hot handles (see [`Hot`]). Resolved by `install`; before it (a test without a recorder)
/// they are resolved on first use, against whatever recorder is in place then.
pub fn hot() -> &'static Hot {
    static HOT: std::sync::OnceLock<Hot> = std::sync::OnceLock::new();
    HOT.get_or_init(Hot::resolve)
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric's kind, unit and HELP text.
struct Help(Kind, &'static str, Option<Unit>, &'static str);

const fn counter(name: &'static str, help: &'static str) -> Help {
    Help(Kind::Counter, name, None, help)
}

const fn gauge(name: &'static str, help: &'static str) -> Help {
    Help(Kind::Gauge, name, None, help)
}

const fn histogram(name: &'static str, help: &'static str) -> Help {
    Help(Kind::Histogram, name, None, help)
}

/// A histogram of seconds.
const fn seconds(name: &'static str, help: &'static str) -> Help {
    Help(Kind::Histogram, name, Some(Unit::Seconds), help)
}

/// Every metric, one row each: what `describe` tells the exporter.
const HELP: &[Help] = &[
    counter(
        REQUESTS_TOTAL,
        "Requests finished, by outcome (ok, bad_request, queue_full, tenant_queue_full, displaced, wait_too_long, queue_timeout, client_gone, client_stalled, upstream_error, upstream_timeout, upstream_5xx: llama-server answered 500 or more, upstream_4xx: llama-server refused the request itself, shutting_down, drain_timeout: cut by the shutdown's drain timeout, policy_denied, policy_error, deadline_exceeded, band_queue_full, shed: a sheddable stream ended for a more urgent request, tenant_busy: its tenant at its concurrency cap).",
    ),
    gauge(
        TENANTS_AT_CAP,
        "Tenants with as many requests in service as their concurrency cap allows (--tenant-max-in-service, [tenants.NAME], a policy's max_in_service), over every pool.",
    ),
    gauge(
        BAND_SLOTS_BUSY,
        "Slots held by the requests of this overload band ([bands.NAME]), over every pool; set per scrape.",
    ),
    gauge(
        BAND_QUEUE_DEPTH,
        "Requests of this overload band waiting, over every pool; set per scrape.",
    ),
    counter(
        BAND_REFUSED_TOTAL,
        "Requests of this overload band refused at arrival (band_queue_full: its share of the queue was full).",
    ),
    counter(
        CONNECTIONS_REFUSED_TOTAL,
        "Connections closed by a connection limit, by listener (client, admin) and reason: peer_cap (a request other than a probe from a peer holding --max-connections-per-peer; answered 429), header_timeout (the first request head not in within the header deadline), evicted (a connection past the limits still sending its head, or waiting for a place, closed for a newer one).",
    ),
    counter(
        SHED_TOTAL,
        "Sheddable requests told to yield their slots to a more urgent one (--sheddable-priority), by stage: before_first_byte (sent back to their place in the queue, the client sent nothing) or after_first_byte (the stream ended with an error event; also counted as outcome shed).",
    ),
    gauge(
        MODEL_QUEUE_DEPTH,
        "In front of llama-server's router: requests waiting in this model's own queue (the model label is one of the router's /models ids).",
    ),
    gauge(
        MODEL_QUEUE_CAPACITY,
        "In front of llama-server's router: the places of this model's queue.",
    ),
    gauge(
        MODEL_SLOTS_BUSY,
        "In front of llama-server's router: this model's slots held by requests in service.",
    ),
    gauge(
        MODEL_SLOTS_TOTAL,
        "In front of llama-server's router: the slots slotgate admits this model's requests to (its child's total_slots, or the per-model override).",
    ),
    gauge(
        MODEL_LOADED,
        "In front of llama-server's router: 1 while this model is loaded and admitting, 0 otherwise.",
    ),
    counter(
        MODEL_LOADS_TOTAL,
        "Model loads slotgate asked llama-server's router for, by model and result (loaded, failed).",
    ),
    counter(
        MODEL_UNLOADS_TOTAL,
        "Idle models slotgate unloaded to make room under --models-max, by model.",
    ),
    seconds(
        MODEL_LOAD_SECONDS,
        "Time from asking the router to load a model until it was loaded, by model.",
    ),
    counter(
        MODEL_REQUESTS_TOTAL,
        "In front of llama-server's router: requests finished, by model and outcome (the labels of slotgate_requests_total).",
    ),
    gauge(
        KV_POOL_TOKENS,
        "Tokens of the KV pool llama-server's slots share (its default without -np, or --kv-unified), as slotgate admits by it; 0 when each slot has a context of its own.",
    ),
    gauge(
        KV_RESERVED_TOKENS,
        "KV tokens reserved by the requests in service (prompt + the most each may generate, for the tasks that run at once).",
    ),
    gauge(
        QUEUE_DEPTH,
        "Requests waiting for a slot.",
    ),
    gauge(
        KV_CACHE_RESERVED_RATIO,
        "Share of llama-server's KV cache (its shared pool, or n_ctx per slot x slots) reserved by the requests in service (prompt + the most each may generate): an upper bound of its use, for load-aware pickers such as the Gateway API Inference Extension. Updated at each scrape.",
    ),
    counter(
        CHILD_RESTARTS_TOTAL,
        "Times the llama-server run by `slotgate wrap` exited and was started again.",
    ),
    gauge(
        UPSTREAM_SLOTS,
        "Slots llama-server reports (total_slots in /props, its -np), read whenever it becomes ready.",
    ),
    gauge(
        SLOTS_MISMATCH,
        "1 while a fixed --slots differs from llama-server's total_slots (requests wait in llama-server's own queue, or its slots idle), else 0.",
    ),
    gauge(
        STATE_UP,
        "1 while the fleet state store (state.backend = redis) is reachable, else 0.",
    ),
    seconds(
        STATE_SYNC_SECONDS,
        "Round trips to the fleet state store, by kind: background (lease top-up, hand-back, settling) or fetch (a take the lease could not cover).",
    ),
    counter(
        STATE_ERRORS_TOTAL,
        "Failed calls to the fleet state store, by kind (connect, heartbeat, sync, fetch; no_fetch_connection: a dry lease found no connection for its fetch, made again in the background).",
    ),
    gauge(
        STATE_LEASE_TOKENS,
        "Tokens this sidecar holds leased from fleet buckets.",
    ),
    counter(
        CALLERS_REFUSED_TOTAL,
        "Requests refused before anything was charged, by reason: llama-server would refuse their caller (no_key, refused_key); their credentials could be read two ways (ambiguous); under --client-auth keys no_key, unknown_key, revoked_key, expired_key; from outside --allow-from or a key's networks (source_network).",
    ),
    counter(
        REFUSALS_DELAYED_TOTAL,
        "Refusals of callers (no key, a made-up one, a network not allowed, a bad admin token) sent a second late because their peer was refused more than 100 times at once or 20 a second.",
    ),
    counter(
        KEYS_FILE_READS_TOTAL,
        "Reads of a changed --keys-file, by result (ok; error: the keys read before stay in force).",
    ),
    counter(
        KEYS_SYNCED_TOTAL,
        "Keys changes shared with the fleet's store, by direction (pushed: made here; pulled: made by another sidecar).",
    ),
    counter(
        STATE_EVICTED_TOTAL,
        "Entries forgotten at a bound, by kind (verdicts, buckets, windows, tenants, conversations, ledger_rows: a day's rows folded into `other`).",
    ),
    gauge(
        INFLIGHT,
        "Requests currently forwarded to the upstream (slot and passthrough).",
    ),
    gauge(
        SLOTS_BUSY,
        "Slots held by a request whose response has not finished streaming.",
    ),
    gauge(
        SLOTS_TOTAL,
        "Slots slotgate forwards to at once (--slots): the denominator of slotgate_slots_busy.",
    ),
    gauge(
        QUEUE_CAPACITY,
        "Requests that may wait for a slot (--queue-depth): the denominator of slotgate_queue_depth.",
    ),
    seconds(
        QUEUE_WAIT_SECONDS,
        "Time a request waited for a slot.",
    ),
    seconds(
        UPSTREAM_SECONDS,
        "Time from forwarding a request to the end of its response body.",
    ),
    seconds(
        TTFB_SECONDS,
        "Time from forwarding a request to the first byte of its response body.",
    ),
    counter(
        TOKENS_TOTAL,
        "Tokens reported by the upstream's `usage`, by kind (prompt, completion).",
    ),
    seconds(
        RETRY_AFTER_SECONDS,
        "Retry-After handed out, by error code (queue_full, tenant_queue_full, tenant_busy, displaced, ...).",
    ),
    counter(
        PROMPT_COUNTS_TOTAL,
        "Prompts counted before admission, by source: upstream (llama-server's tokenizer), cache, estimate (characters / 4, when llama-server could not count), forwarded (a slot was free: sent at once on the estimate, settled from usage).",
    ),
    counter(
        TOKENS_RESERVED_TOTAL,
        "Tokens reserved by admitted generation requests: prompt + the most each may generate within its slot.",
    ),
    counter(
        TOKENS_REFUNDED_TOTAL,
        "Reserved tokens given back when a request ended: its reservation minus the tokens it really used.",
    ),
    histogram(
        COST_ESTIMATE_ERROR_RATIO,
        "The characters/4 estimate divided by the exact prompt tokens (1 = exact).",
    ),
    counter(
        TENANT_TOKENS_TOTAL,
        "Tokens served per tenant (prompt + completion, from the upstream's usage), by tenant; \
         after the first 50 tenants, the rest are counted under `other`.",
    ),
    gauge(
        UPSTREAM_READY,
        "1 while the upstream's /health answers 200, else 0.",
    ),
    counter(
        UPSTREAM_RETRIES_TOTAL,
        "Upstream attempts retried because the upstream was down or loading.",
    ),
    seconds(
        POLICY_EVAL_SECONDS,
        "Time one policy took to evaluate one request, by policy.",
    ),
    histogram(
        POLICY_FUEL_CONSUMED,
        "Wasm fuel one policy evaluation consumed, by policy.",
    ),
    counter(
        POLICY_DECISIONS_TOTAL,
        "Policy evaluations, by policy and decision (allow, deny, error).",
    ),
    counter(
        POLICY_EVENTS_TOTAL,
        "Events a policy counted (host function `event`), by policy and event: a tenant past its \
         quota's soft limit, say. At most 256 pairs; later ones count as event=\"other\".",
    ),
    counter(
        POLICY_ERRORS_TOTAL,
        "Policy evaluations that failed, by policy and kind (trap, timeout, fuel, memory, invalid_output); the policy's on-error then allowed or refused the request.",
    ),
    counter(
        POLICY_RELOADS_TOTAL,
        "Policy and configuration reloads, by policy and result (ok, error).",
    ),
    counter(
        STATE_WRITES_TOTAL,
        "Batches of changed policy budgets written to state.dir, by result (ok, error: the disk refused; they stay in memory and are tried again).",
    ),
    counter(
        STATE_ROWS_WRITTEN_TOTAL,
        "Rows (buckets, windows, quota windows, ledger rows) written to state.dir by successful \
         commits: with slotgate_state_writes_total, how much each commit carries.",
    ),
    counter(
        ADMIN_ACTIONS_TOTAL,
        "Audited admin actions (slot_save, slot_restore, slot_erase, slot_other, lora_set, props_set, model_add, model_load, model_unload, model_delete, other, reload), by result (ok, upstream_4xx, upstream_5xx, upstream_error, client_gone, bad_request, unauthenticated, forbidden; for a reload: swapped, unchanged, rejected).",
    ),
    counter(
        UPSTREAM_CONNECTIONS_TOTAL,
        "Connections opened to the upstream for requests (streams and slotgate's own calls each open one; whole answers reuse idle ones). The admin scrape's copy of llama-server's /metrics is not counted.",
    ),
];

fn describe() {
    for &Help(kind, name, unit, help) in HELP {
        match (kind, unit) {
            (Kind::Counter, None) => describe_counter!(name, help),
            (Kind::Counter, Some(unit)) => describe_counter!(name, unit, help),
            (Kind::Gauge, None) => describe_gauge!(name, help),
            (Kind::Gauge, Some(unit)) => describe_gauge!(name, unit, help),
            (Kind::Histogram, None) => describe_histogram!(name, help),
            (Kind::Histogram, Some(unit)) => describe_histogram!(name, unit, help),
        }
    }
    zero_initialise();
}

/// Every series a dashboard or alert expects is there, at zero, before its first event.
fn zero_initialise() {
    for outcome in Outcome::ALL {
        metrics::counter!(REQUESTS_TOTAL, "outcome" => outcome.label()).absolute(0);
    }
    for kind in ["prompt", "completion"] {
        metrics::counter!(TOKENS_TOTAL, "kind" => kind).absolute(0);
    }
    metrics::counter!(UPSTREAM_RETRIES_TOTAL).absolute(0);
    metrics::counter!(UPSTREAM_CONNECTIONS_TOTAL).absolute(0);
    metrics::counter!(TOKENS_RESERVED_TOTAL).absolute(0);
    metrics::counter!(TOKENS_REFUNDED_TOTAL).absolute(0);
    for source in PROMPT_COUNT_SOURCES {
        metrics::counter!(PROMPT_COUNTS_TOTAL, "source" => source).absolute(0);
    }
    metrics::gauge!(QUEUE_DEPTH).set(0.0);
    metrics::gauge!(INFLIGHT).set(0.0);
    metrics::gauge!(SLOTS_BUSY).set(0.0);
    metrics::gauge!(UPSTREAM_READY).set(0.0);
    metrics::gauge!(KV_POOL_TOKENS).set(0.0);
    metrics::gauge!(KV_RESERVED_TOKENS).set(0.0);
    metrics::gauge!(TENANTS_AT_CAP).set(0.0);
}

/// Caps the distinct values of a label so a flood of names cannot grow the exporter without bound:
/// the first `cap` values seen keep their own series, every later one shares `other`.
#[derive(Debug)]
pub struct BoundedLabels {
    /// The counter of each label value seen, resolved once.
    seen: HashMap<Arc<str>, Counter>,
    other: Option<Counter>,
    cap: usize,
    name: &'static str,
    key: &'static str,
}

impl BoundedLabels {
    pub const OTHER: &'static str = "other";

    /// At most `cap` values of label `key` on counter `name`; the rest count as `other`.
    pub fn new(cap: usize, name: &'static str, key: &'static str) -> Self {
        BoundedLabels {
            seen: HashMap::new(),
            other: None,
            cap,
            name,
            key,
        }
    }

    /// The counter to record `value` on: its own while fewer than `cap` values have been seen,
    /// else the one of `other`.
    pub fn counter(&mut self, value: &Arc<str>) -> Counter {
        if let Some(c) = self.seen.get(value) {
            return c.clone();
        }
        if self.seen.len() < self.cap {
            let c = metrics::counter!(self.name, self.key => value.to_string());
            self.seen.insert(value.clone(), c.clone());
            return c;
        }
        let (name, key) = (self.name, self.key);
        self.other
            .get_or_insert_with(|| metrics::counter!(name, key => Self::OTHER))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use metrics::{Key, KeyName, Metadata, Recorder, SharedString};

    use super::*;

    /// Records the names `describe` describes; every handle it hands out is a no-op.
    #[derive(Default)]
    struct Names(Mutex<BTreeSet<String>>);

    impl Names {
        fn add(&self, key: KeyName) {
            self.0.lock().unwrap().insert(key.as_str().to_owned());
        }
    }

    impl Recorder for Names {
        fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(key);
        }
        fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(key);
        }
        fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
            self.add(key);
        }
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// The metrics the binary exports: every name `describe` gives the exporter at start-up.
    fn described() -> BTreeSet<String> {
        let names = Names::default();
        metrics::with_local_recorder(&names, describe);
        names.0.into_inner().unwrap()
    }

    /// The names of the `pub const NAME: &str = "slotgate_…";` lines of this file.
    fn declared(source: &str) -> BTreeSet<String> {
        source
            .lines()
            .filter(|l| l.starts_with("pub const ") && l.contains(": &str = \"slotgate_"))
            .filter_map(|l| l.split('"').nth(1))
            .map(str::to_owned)
            .collect()
    }

    /// Whether `doc` names `metric` as a whole word (not as a part of a longer name).
    fn names(doc: &str, metric: &str) -> bool {
        let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        doc.match_indices(metric).any(|(at, _)| {
            !word(doc[..at].chars().next_back()) && !word(doc[at + metric.len()..].chars().next())
        })
    }

    #[test]
    fn every_exported_metric_is_described_and_in_observability_md() {
        let described = described();
        let undescribed: Vec<_> = declared(include_str!("metrics.rs"))
            .into_iter()
            .filter(|n| !described.contains(n))
            .collect();
        assert!(
            undescribed.is_empty(),
            "metric names declared in metrics.rs but not described: {undescribed:?}"
        );
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/observability.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let missing: Vec<_> = described.iter().filter(|n| !names(&doc, n)).collect();
        assert!(
            missing.is_empty(),
            "metrics exported but not in docs/observability.md: {missing:?}"
        );
    }

    #[test]
    fn a_metric_missing_from_the_doc_is_caught() {
        assert!(described().contains(REQUESTS_TOTAL));
        assert!(declared("pub const X: &str = \"slotgate_x_total\";").contains("slotgate_x_total"));
        let doc = "`slotgate_tenant_tokens_total{tenant}` and slotgate_queue_wait_seconds_bucket";
        assert!(names(doc, "slotgate_tenant_tokens_total"));
        assert!(!names(doc, "slotgate_tokens_total"));
        assert!(!names(doc, "slotgate_queue_wait_seconds"));
    }

    #[test]
    fn labels_beyond_the_cap_fold_into_other() {
        let mut labels = BoundedLabels::new(2, TENANT_TOKENS_TOTAL, "tenant");
        for name in ["a", "b", "a"] {
            let _ = labels.counter(&Arc::from(name));
        }
        assert!(labels.other.is_none());
        let _ = labels.counter(&Arc::from("c"));
        assert!(labels.other.is_some() && !labels.seen.contains_key("c"));
        assert_eq!(labels.seen.len(), 2);
    }
}
