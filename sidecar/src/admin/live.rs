//! `GET /live`: what is inside slotgate now, for `slotgate top` and scripts (docs/live.md).

use serde_json::json;

use crate::state::App;

use super::status::{queues, tenant_stats, totals};

/// Waiters listed in /live, the next to be served first.
const LIVE_WAITERS: usize = 200;

/// `GET /live`: what is inside slotgate now, for `slotgate top` and scripts (docs/live.md). Field
/// names are stable; new ones may be added.
pub fn live(app: &App) -> serde_json::Value {
    let snap = app.live.snapshot();
    let q = totals(app);
    let requests: Vec<serde_json::Value> = snap
        .requests
        .iter()
        .map(|r| {
            json!({
                "request_id": r.request_id,
                "method": r.method,
                "path": r.path,
                "tenant": r.tenant,
                "phase": r.phase.label(),
                "priority": r.priority,
                "stream": r.stream,
                "age_seconds": r.age_seconds,
                "in_service_seconds": r.in_service_seconds,
                "slots": r.slots,
                "prompt_tokens": r.prompt_tokens,
                "generated_tokens": r.generated_tokens,
                "deadline_ms": r.deadline_ms,
                "shed": r.shed,
                "band": r.band,
            })
        })
        .collect();
    let waiters: Vec<serde_json::Value> = queues(app)
        .into_iter()
        .flat_map(|(model, a)| {
            a.waiters(LIVE_WAITERS)
                .into_iter()
                .map(move |w| (model.clone(), w))
        })
        .take(LIVE_WAITERS)
        .map(|(model, w)| {
            let r = app.live.request(w.tag);
            json!({
                "model": model,
                "request_id": r.as_ref().map(|r| r.request_id.clone()),
                "path": r.as_ref().map(|r| r.path.clone()),
                "tenant": w.tenant,
                "priority": w.priority,
                "effective_priority": w.effective_priority,
                "age_seconds": w.age_seconds,
                "reserved_tokens": w.cost,
                "slots": w.slots,
                "kv_tokens": w.kv,
                "expected_start_seconds": w.expected_start_seconds,
                "deadline_in_seconds": w.deadline_in_seconds,
                "band": w.band.as_deref(),
            })
        })
        .collect();
    let scheduler: std::collections::HashMap<String, crate::admission::TenantStats> =
        tenant_stats(app, usize::MAX)
            .into_iter()
            .map(|t| (t.tenant.clone(), t))
            .collect();
    let served: u64 = snap.tenants.iter().map(|t| t.1.served_tokens).sum();
    // Looked up by name: thousands of tenants are one pass, not a scan each.
    let totals_of: std::collections::HashMap<&str, &crate::live::TenantTotals> =
        snap.tenants.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut names: Vec<&str> = totals_of.keys().copied().collect();
    names.extend(scheduler.keys().map(String::as_str));
    names.sort_unstable();
    names.dedup();
    let tenants: Vec<serde_json::Value> = names
        .into_iter()
        .map(|name| {
            let totals = totals_of.get(name).copied();
            let now = scheduler.get(name);
            let served_tokens = totals.map_or(0, |t| t.served_tokens);
            json!({
                "tenant": name,
                "requests": totals.map_or(0, |t| t.requests),
                "served_tokens": served_tokens,
                "share": if served > 0 { served_tokens as f64 / served as f64 } else { 0.0 },
                "virtual_tokens": now.map(|t| t.counter),
                "waiting": now.map_or(0, |t| t.waiting),
                "in_service": now.map_or(0, |t| t.in_service),
                "refused": totals.map(|t| json!(t.refused)).unwrap_or_else(|| json!({})),
            })
        })
        .collect();
    let r = &snap.rates;
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": snap.uptime.as_secs_f64(),
        "upstream": {
            "target": app.upstream.target().to_string(),
            "ready": app.upstream.is_ready(),
            "reached": app.upstream.reached(),
            "last_error": app.upstream.last_error(),
            "total_slots": app.capacity.upstream_slots(),
            "role": if app.capacity.router.is_on() { "router" } else { "server" },
            "router": app.capacity.router.status(),
        },
        "models": app.models.status(),
        "slots": {
            "total": q.slots,
            "busy": q.busy,
            "in_service": q.serving,
            "kv_pool_tokens": q.kv_pool,
            "kv_reserved_tokens": q.kv_reserved,
            "sheddable": q.sheddable,
            "shed_before_first_byte": q.shed_requeued,
            "shed_after_first_byte": q.shed_ended,
        },
        "queue": {
            "depth": q.depth,
            "capacity": q.capacity,
            "estimated_wait_seconds": q.wait_seconds,
            "draining": q.closed,
            "waiters": waiters,
        },
        "requests": requests,
        "tenants": tenants,
        "budgets": budgets(app),
        "rates": {
            "window_seconds": crate::live::RATE_SECONDS,
            "requests_per_second": r.requests_per_second,
            "tokens_per_second": r.tokens_per_second,
            "refused_per_second": r.refused_per_second,
            "queue_wait_window_seconds": crate::live::HISTORY_SECONDS,
            "queue_waits": r.queue_waits,
            "queue_wait_p50_seconds": r.queue_wait_p50_seconds,
            "queue_wait_p95_seconds": r.queue_wait_p95_seconds,
        },
        "history": {
            "seconds": crate::live::HISTORY_SECONDS,
            "requests": snap.history.requests,
            "tokens": snap.history.tokens,
            "refused": snap.history.refused,
        },
        "totals": {
            "outcomes": snap.outcomes.iter().filter(|o| o.1 > 0).map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "tokens": snap.tokens,
        },
    })
}

/// Budgets shown in `/live`, the emptiest first.
const LIVE_BUDGETS: usize = 50;

/// `/live` → `budgets`: this sidecar's calendar quotas and token buckets with what is left, the
/// emptiest (by share of its limit) first. A policy keys them as it likes; the example policies
/// key by tenant (`uid:1000`, `tokens:uid:1000`), which is how `top` matches them to tenants.
fn budgets(app: &App) -> Vec<serde_json::Value> {
    let shared = app.policies.shared();
    let (quotas, _) = shared.quota_levels(LIVE_BUDGETS);
    let (buckets, _) = shared.bucket_levels(LIVE_BUDGETS);
    let mut all: Vec<(f64, serde_json::Value)> = quotas
        .into_iter()
        .map(|q| {
            let fill = q.limit.map_or(1.0, |l| q.left / l.max(1e-9));
            let v = json!({
                "policy": q.policy, "key": q.key, "kind": "quota", "period": q.period,
                "left": q.left, "limit": q.limit,
                "resets_at": super::status::rfc3339(q.window_end_ms),
            });
            (fill, v)
        })
        .chain(buckets.into_iter().map(|b| {
            let fill = b.capacity.map_or(1.0, |c| b.level / c.max(1e-9));
            let v = json!({
                "policy": b.policy, "key": b.key, "kind": "bucket",
                "left": b.level, "limit": b.capacity,
                "refill_per_second": b.refill_per_second,
            });
            (fill, v)
        }))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    all.truncate(LIVE_BUDGETS);
    all.into_iter().map(|(_, v)| v).collect()
}
