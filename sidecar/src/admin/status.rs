//! `GET /status`: the operator's JSON picture of slotgate, and the sums over every pool (the
//! server's, and each model's in front of a router) that `/live` and `/metrics` share.

use serde_json::json;

use crate::state::App;

/// Tenants listed in /status, the next to be served first.
const STATUS_TENANTS: usize = 100;

/// Every queue: the server's, and in front of llama-server's router each model's (with its id).
pub(super) fn queues(app: &App) -> Vec<(Option<String>, crate::admission::Admission)> {
    let mut all = vec![(None, app.admission.clone())];
    all.extend(
        app.models
            .all()
            .into_iter()
            .map(|p| (Some(p.id.clone()), p.admission.clone())),
    );
    all
}

/// The server's queue figures, with every model's pool added in front of a router: what is busy,
/// in service and waiting anywhere.
pub(super) fn totals(app: &App) -> crate::admission::QueueStats {
    let mut q = app.admission.stats();
    for p in app.models.all() {
        let m = p.admission.stats();
        q.busy += m.busy;
        q.serving += m.serving;
        q.depth += m.depth;
        q.kv_reserved += m.kv_reserved;
        q.tokens_in_service += m.tokens_in_service;
        q.with_deadline += m.with_deadline;
        q.sheddable += m.sheddable;
        q.yielding += m.yielding;
        q.shed_requeued += m.shed_requeued;
        q.shed_ended += m.shed_ended;
    }
    q
}

/// The scheduler's tenants over every queue: waiting and in service summed, the highest counter.
pub(super) fn tenant_stats(app: &App, limit: usize) -> Vec<crate::admission::TenantStats> {
    let mut by: std::collections::BTreeMap<String, crate::admission::TenantStats> =
        Default::default();
    for (_, a) in queues(app) {
        for t in a.tenants(usize::MAX) {
            match by.get_mut(&t.tenant) {
                Some(e) => {
                    e.waiting += t.waiting;
                    e.in_service += t.in_service;
                    e.counter = e.counter.max(t.counter);
                }
                None => {
                    by.insert(t.tenant.clone(), t);
                }
            }
        }
    }
    let mut all: Vec<_> = by.into_values().collect();
    crate::admission::TenantStats::next_served_first(&mut all, limit);
    all
}

/// `GET /status`: how slotgate is set up and what it holds now (docs/operations.md).
pub fn status(app: &App) -> serde_json::Value {
    let q = totals(app);
    let slots = app.slots_status();
    json!({
        "slots": {
            "total": q.slots,
            "busy": q.busy,
            "configured": app.config.slots.to_string(),
            "source": slots["source"],
            "upstream_total_slots": slots["upstream_total_slots"],
            "mismatch": slots["mismatch"],
        },
        "kv_pool": app.capacity.status(q.kv_reserved),
        "requests_in_service": q.serving,
        "queue": {
            "depth": q.depth,
            "capacity": q.capacity,
            "tenant_limit": q.tenant_limit,
            "with_deadline": q.with_deadline,
        },
        "fairness": fairness(app),
        "inflight": app.upstream.inflight(),
        "upstream": upstream_with_auth(app),
        "models": app.models.status(),
        "model_turns": app.models.turns_status(),
        "admin": admin_plane(app),
        "bands": bands(app),
        "shedding": {
            "sheddable_priority": app.config.sheddable_priority,
            "sheddable_in_service": q.sheddable,
            "yielding": q.yielding,
            "shed_before_first_byte": q.shed_requeued,
            "shed_after_first_byte": q.shed_ended,
            "guard_seconds": crate::admission::SHED_GUARD.as_secs_f64(),
            "max_requeues": crate::admission::MAX_REQUEUES,
        },
        "service_time_seconds": q.service_seconds,
        "estimated_wait_seconds": q.wait_seconds,
        "draining": q.closed,
        "policies": policies(app),
        "state": state(app),
    })
}

/// `/status` → `fairness`: aging, the tenants next served, and the operator's caps.
fn fairness(app: &App) -> serde_json::Value {
    let caps = &app.config.tenant_caps;
    let tenants: Vec<serde_json::Value> = tenant_stats(app, STATUS_TENANTS)
        .into_iter()
        .map(|t| {
            // The operator's caps on it (a policy may cut them for a request).
            let cap = caps.of(&t.tenant);
            json!({
                "tenant": t.tenant,
                "virtual_tokens": t.counter,
                "waiting": t.waiting,
                "in_service": t.in_service,
                "max_in_service": cap.max_in_service,
                "max_waiting": cap.max_waiting,
            })
        })
        .collect();
    json!({
        "priority_aging_seconds": app.config.priority_aging.map_or(0.0, |d| d.as_secs_f64()),
        "tenants": tenants,
        "tenant_caps": {
            "max_in_service": caps.default.max_in_service,
            "max_waiting": caps.default.max_waiting,
            "over_cap": caps.over_cap.to_string(),
            "configured_tenants": caps.tenants.len(),
        },
    })
}

/// `/status` → `policies`: the chain in force, each policy as loaded.
fn policies(app: &App) -> serde_json::Value {
    let chain = app.policies.current();
    let policies: Vec<serde_json::Value> = chain
        .policies()
        .map(|p| {
            json!({
                "name": p.name,
                "state_key": p.state_key,
                // `v1` (an ABI v1 core module) or `v2` (a slotgate:policy@2.0.0 component).
                "contract": p.policy.contract().label(),
                "sha256": crate::policy::set::hex(&p.sha256),
                "mode": format!("{:?}", p.mode).to_lowercase(),
                "on_error": format!("{:?}", p.on_error).to_lowercase(),
                // Served from a snapshot taken after it parsed its settings (`keeps_settings`).
                "preinitialised": p.preinitialised(),
                // `caller` (instances kept per caller) or `call` (a fresh one per call).
                "isolation": p.policy.isolation().label(),
                "instances_kept": p.policy.instances_kept(),
            })
        })
        .collect();
    json!({
        "generation": chain.generation(),
        "chain": policies,
        "evaluated": if chain.runs_inline() { "inline" } else { "blocking_pool" },
        "compile_cache": app.policies.cache_status(),
    })
}

/// `/status` → `state`: where the policies' budgets live, and the emptiest of them.
fn state(app: &App) -> serde_json::Value {
    match &app.fleet {
        None => json!({
            "backend": "memory",
            "file": app.policies.shared().store_file().map(|f| f.display().to_string()),
            "flush_interval_seconds": app.config.state.flush_interval.as_secs_f64(),
            "buckets": buckets(app),
            "quotas": quotas(app),
        }),
        Some(f) => {
            let mut s = f.status();
            s["quotas"] = quotas(app);
            s
        }
    }
}

/// Buckets listed in /status, the emptiest first.
const STATUS_BUCKETS: usize = 100;

/// `/status` → `state.buckets`: this sidecar's token buckets, their levels now.
fn buckets(app: &App) -> serde_json::Value {
    let (levels, count) = app.policies.shared().bucket_levels(STATUS_BUCKETS);
    let list: Vec<serde_json::Value> = levels
        .into_iter()
        .map(|b| {
            json!({
                "policy": &*b.name.policy,
                "key": b.name.key,
                "level": b.level,
                "capacity": b.capacity,
                "refill_per_second": b.refill_per_second,
            })
        })
        .collect();
    json!({ "count": count, "emptiest": list })
}

/// `/status` → `state.quotas`: this sidecar's calendar quotas in their current windows.
fn quotas(app: &App) -> serde_json::Value {
    let (levels, count) = app.policies.shared().quota_levels(STATUS_BUCKETS);
    let list: Vec<serde_json::Value> = levels
        .into_iter()
        .map(|q| {
            json!({
                "policy": &*q.quota.policy,
                "key": q.quota.key,
                "period": q.quota.period,
                "window_start": rfc3339(q.window_start_ms),
                "window_end": rfc3339(q.window_end_ms),
                "limit": q.limit,
                "left": q.left,
            })
        })
        .collect();
    json!({ "count": count, "emptiest": list })
}

/// Unix milliseconds as an RFC 3339 UTC time.
/// `/status` and `/live` → `upstream`: where llama-server is and how it answers.
pub(super) fn upstream(app: &App) -> crate::live::schema::Upstream {
    let router = &app.capacity.router;
    crate::live::schema::Upstream {
        target: app.upstream.target().to_string(),
        ready: app.upstream.is_ready(),
        reached: app.upstream.reached(),
        last_error: app.upstream.last_error(),
        total_slots: app.capacity.upstream_slots().map(|n| n as u64),
        role: if router.is_on() { "router" } else { "server" }.into(),
        router: router.status(),
    }
}

/// `/status` → `upstream`: `/live`'s, and how slotgate's own calls authenticate.
fn upstream_with_auth(app: &App) -> serde_json::Value {
    let mut u = json!(upstream(app));
    u["auth"] = json!(app.upstream.auth_status());
    u
}

pub(super) fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).map_or_else(|_| ms.to_string(), |t| t.to_string())
}

/// `/status` → `admin`: how the admin listener is protected (never a token: only whether one is set).
fn admin_plane(app: &App) -> serde_json::Value {
    let a = &app.config.admin;
    let tokens = app.admin_tokens();
    let set = |on: bool| if on { "set" } else { "none" };
    json!({
        "token": set(tokens.full.is_some()),
        "read_token": set(tokens.read.is_some()),
        "open_metrics": a.open_metrics,
        "allow_uids": a.allow_uids,
        "audit_log": a.audit_log.to_string(),
    })
}

/// `/status` → `bands`: each overload band over every pool, what it holds and may hold.
fn bands(app: &App) -> Vec<serde_json::Value> {
    band_totals(app)
        .into_iter()
        .map(|b| {
            json!({
                "band": &*b.name,
                "priorities": [b.priorities.0, b.priorities.1],
                "slots_busy": b.slots_busy,
                "slot_limit": b.slot_limit,
                "waiting": b.waiting,
                "queue_limit": b.queue_limit,
                "refused": b.refused,
            })
        })
        .collect()
}

/// Each overload band over every pool: the server's own first (every pool has the same bands),
/// each model's added.
pub(super) fn band_totals(app: &App) -> Vec<crate::admission::BandStats> {
    let mut out: Vec<crate::admission::BandStats> = app.admission.band_stats();
    for p in app.models.all() {
        for (i, s) in p.admission.band_stats().into_iter().enumerate() {
            if let Some(o) = out.get_mut(i) {
                o.slots_busy += s.slots_busy;
                o.waiting += s.waiting;
            }
        }
    }
    out
}
