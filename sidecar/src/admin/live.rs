//! `GET /live`: what is inside slotgate now, for `slotgate top` and scripts (docs/live.md), as the
//! one type both read and write (`live::schema`).

use std::collections::HashMap;

use crate::admission::{TenantStats, WaiterView};
use crate::live::schema::{Budget, Live, Queue, Slots, Tenant, Totals, Waiter};
use crate::live::{Snapshot, TenantTotals};
use crate::state::App;

use super::status::{queues, tenant_stats, totals};

/// Waiters listed in /live, the next to be served first.
const LIVE_WAITERS: usize = 200;

/// Budgets shown in `/live`, the emptiest first.
const LIVE_BUDGETS: usize = 50;

/// `GET /live`.
pub fn live(app: &App) -> Live {
    let Snapshot {
        uptime,
        requests,
        outcomes,
        tokens,
        tenants: ended,
        rates,
        history,
    } = app.live.snapshot();
    let q = totals(app);
    Live {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_seconds: uptime.as_secs_f64(),
        upstream: super::status::upstream(app),
        models: app.models.status(),
        slots: Slots {
            total: q.slots as u64,
            busy: q.busy as u64,
            in_service: q.serving as u64,
            kv_pool_tokens: q.kv_pool,
            kv_reserved_tokens: q.kv_reserved,
            sheddable: q.sheddable as u64,
            shed_before_first_byte: q.shed_requeued,
            shed_after_first_byte: q.shed_ended,
        },
        queue: Queue {
            depth: q.depth as u64,
            capacity: q.capacity as u64,
            estimated_wait_seconds: q.wait_seconds,
            draining: q.closed,
            waiters: waiters(app),
        },
        requests,
        tenants: tenants(app, &ended),
        budgets: budgets(app),
        rates,
        history,
        totals: Totals {
            outcomes: (outcomes.into_iter())
                .filter(|o| o.1 > 0)
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            tokens,
        },
    }
}

/// `queue.waiters`: every pool's, the next to be served first, at most [`LIVE_WAITERS`].
fn waiters(app: &App) -> Vec<Waiter> {
    queues(app)
        .into_iter()
        .flat_map(|(model, a)| {
            a.waiters(LIVE_WAITERS)
                .into_iter()
                .map(move |w| (model.clone(), w))
        })
        .take(LIVE_WAITERS)
        .map(|(model, w)| waiter(app, model, w))
        .collect()
}

fn waiter(app: &App, model: Option<String>, w: WaiterView) -> Waiter {
    let r = app.live.request(w.tag);
    Waiter {
        model,
        request_id: r.as_ref().map(|r| r.request_id.clone()),
        path: r.map(|r| r.path),
        tenant: w.tenant,
        priority: w.priority,
        effective_priority: w.effective_priority,
        age_seconds: w.age_seconds,
        reserved_tokens: w.cost,
        slots: w.slots as u64,
        kv_tokens: w.kv,
        expected_start_seconds: w.expected_start_seconds,
        deadline_in_seconds: w.deadline_in_seconds,
        band: w.band.as_deref().map(str::to_owned),
    }
}

/// `tenants`: everyone seen since start or in the scheduler now, by name.
fn tenants(app: &App, ended: &[(String, TenantTotals)]) -> Vec<Tenant> {
    let scheduler: HashMap<String, TenantStats> = tenant_stats(app, usize::MAX)
        .into_iter()
        .map(|t| (t.tenant.clone(), t))
        .collect();
    let served: u64 = ended.iter().map(|t| t.1.served_tokens).sum();
    // Looked up by name: thousands of tenants are one pass, not a scan each.
    let totals_of: HashMap<&str, &TenantTotals> =
        ended.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut names: Vec<&str> = totals_of.keys().copied().collect();
    names.extend(scheduler.keys().map(String::as_str));
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let totals = totals_of.get(name).copied();
            let now = scheduler.get(name);
            let served_tokens = totals.map_or(0, |t| t.served_tokens);
            Tenant {
                tenant: name.to_owned(),
                requests: totals.map_or(0, |t| t.requests),
                served_tokens,
                share: if served > 0 {
                    served_tokens as f64 / served as f64
                } else {
                    0.0
                },
                virtual_tokens: now.map(|t| t.counter),
                waiting: now.map_or(0, |t| t.waiting as u64),
                in_service: now.map_or(0, |t| t.in_service as u64),
                refused: totals.map_or_else(Default::default, |t| {
                    t.refused.iter().map(|(k, v)| (k.to_string(), *v)).collect()
                }),
            }
        })
        .collect()
}

/// `budgets`: this sidecar's calendar quotas and token buckets with what is left, the emptiest (by
/// share of its limit) first. A policy keys them as it likes; the example policies key by tenant
/// (`uid:1000`, `tokens:uid:1000`), which is how `top` matches them to tenants.
fn budgets(app: &App) -> Vec<Budget> {
    let shared = app.policies.shared();
    let (quotas, _) = shared.quota_levels(LIVE_BUDGETS);
    let (buckets, _) = shared.bucket_levels(LIVE_BUDGETS);
    let mut all: Vec<Budget> = quotas
        .into_iter()
        .map(|q| Budget {
            policy: q.quota.policy.to_string(),
            key: q.quota.key,
            kind: "quota".into(),
            period: Some(q.quota.period),
            left: q.left,
            limit: q.limit,
            resets_at: Some(super::status::rfc3339(q.window_end_ms)),
            refill_per_second: None,
        })
        .chain(buckets.into_iter().map(|b| Budget {
            policy: b.name.policy.to_string(),
            key: b.name.key,
            kind: "bucket".into(),
            period: None,
            left: b.level,
            limit: b.capacity,
            resets_at: None,
            refill_per_second: b.refill_per_second,
        }))
        .collect();
    all.sort_by(|a, b| a.fill().total_cmp(&b.fill()));
    all.truncate(LIVE_BUDGETS);
    all
}
