//! The admin listener: Prometheus scrape, liveness, readiness and a JSON status for operators, and
//! llama-server's own whole-server endpoints (`/slots`, `/lora-adapters`, `POST /props`, the
//! router's `/models/*`; see `routes::Handling::Admin`), forwarded with slotgate's upstream key
//! where the caller brings none: on a private socket (`slotgate wrap`) nothing else can reach them.

use std::sync::Arc;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;

use crate::error::GateError;
use crate::metrics as m;
use crate::pipeline::routes;
use crate::respond::{self, Body};
use crate::state::App;

pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
    // What the answer shows (a request counted, say) is in the log before it.
    crate::log::flush();
    let own = matches!(
        req.uri().path(),
        "/metrics" | "/livez" | "/readyz" | "/status" | "/live"
    );
    if !own {
        if let Some(route) = routes::lookup(req.method().as_str(), req.uri().path()) {
            if matches!(route.handling, routes::Handling::Admin) {
                return forward(&app, req).await;
            }
        }
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond::json(
            405,
            &json!({"error": {"message": "admin endpoints are GET only", "type": "invalid_request_error", "code": "method_not_allowed"}}),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let mut resp = Response::new(respond::full(metrics_text(&app).await));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        "/livez" => respond::text(200, "ok\n"),
        "/readyz" => {
            if app.upstream.is_ready() && !app.admission.is_closed() {
                respond::text(200, "ready\n")
            } else {
                respond::text(503, "not ready\n")
            }
        }
        "/status" => respond::json(200, &status(&app)),
        "/live" => respond::json(200, &live(&app)),
        _ => respond::json(
            404,
            &json!({"error": {"message": format!("no admin endpoint {}", req.uri().path()), "type": "not_found_error", "code": "not_found"}}),
        ),
    }
}

/// One of llama-server's admin endpoints, forwarded as it came; slotgate's own key goes with it
/// when the caller brings none.
async fn forward(app: &App, req: Request<Incoming>) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let limits = &app.limits;
    let body = match tokio::time::timeout(
        limits.body_timeout,
        http_body_util::Limited::new(body, limits.max_body).collect(),
    )
    .await
    {
        Ok(Ok(c)) => c.to_bytes(),
        _ => {
            return respond::json(
                400,
                &json!({"error": {"message": "the request body could not be read within the limits", "type": "invalid_request_error", "code": "body_read_error"}}),
            )
        }
    };
    app.upstream.authorize(&mut parts.headers);
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    match app
        .upstream
        .send(&parts.method, pq, &parts.headers, body, true)
        .await
    {
        Ok(resp) => resp,
        Err(e) => respond::error(&GateError::Upstream(e.to_string()), None),
    }
}

/// slotgate's series, then llama-server's own (`--upstream-metrics`) when it answers in time: one
/// scrape target for both. The estimate of reserved KV cache is computed here, per scrape, not on
/// the request path.
async fn metrics_text(app: &App) -> String {
    let q = app.admission.stats();
    if let Some(ctx) = app.capacity.slot_context() {
        let capacity = ctx.pool.unwrap_or(ctx.n_ctx * q.slots as u64) as f64;
        metrics::gauge!(m::KV_CACHE_RESERVED_RATIO)
            .set((q.kv_reserved as f64 / capacity).clamp(0.0, 1.0));
    }
    // Each band's share now, and its refusals (bounded: the bands are the configuration's).
    for b in band_totals(app) {
        let band = b.name.to_string();
        metrics::gauge!(m::BAND_SLOTS_BUSY, "band" => band.clone()).set(b.slots_busy as f64);
        metrics::gauge!(m::BAND_QUEUE_DEPTH, "band" => band.clone()).set(b.waiting as f64);
        metrics::counter!(m::BAND_REFUSED_TOTAL, "band" => band).absolute(b.refused);
    }
    let mut text = app.prometheus.render();
    if app.config.upstream_metrics && app.upstream.is_ready() {
        if let Some(theirs) = app.upstream.metrics_copy().await {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            // Only llama-server's own families: nothing it says can shadow a slotgate series.
            for line in theirs.lines().filter(|l| !l.contains("slotgate_")) {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    text
}

/// Tenants listed in /status, the next to be served first.
const STATUS_TENANTS: usize = 100;

/// Every queue: the server's, and in front of llama-server's router each model's (with its id).
fn queues(app: &App) -> Vec<(Option<String>, crate::admission::Admission)> {
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
fn totals(app: &App) -> crate::admission::QueueStats {
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
fn tenant_stats(app: &App, limit: usize) -> Vec<crate::admission::TenantStats> {
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

pub fn status(app: &App) -> serde_json::Value {
    let q = totals(app);
    let slots = app.slots_status();
    let tenants: Vec<serde_json::Value> = tenant_stats(app, STATUS_TENANTS)
        .into_iter()
        .map(|t| {
            json!({
                "tenant": t.tenant,
                "virtual_tokens": t.counter,
                "waiting": t.waiting,
                "in_service": t.in_service,
            })
        })
        .collect();
    let chain = app.policies.current();
    let policies: Vec<serde_json::Value> = chain
        .policies()
        .map(|p| {
            json!({
                "name": p.name,
                "sha256": crate::policy::set::hex(&p.sha256),
                "mode": format!("{:?}", p.mode).to_lowercase(),
                "on_error": format!("{:?}", p.on_error).to_lowercase(),
                // Served from a snapshot taken after it parsed its settings (`keeps_settings`).
                "preinitialised": p.preinitialised(),
            })
        })
        .collect();
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
        "fairness": {
            "priority_aging_seconds": app.config.priority_aging.map_or(0.0, |d| d.as_secs_f64()),
            "tenants": tenants,
        },
        "inflight": app.upstream.inflight(),
        "upstream": {
            "ready": app.upstream.is_ready(),
            "target": app.upstream.target().to_string(),
            "reached": app.upstream.reached(),
            "last_error": app.upstream.last_error(),
            "auth": app.upstream.auth_status(),
            "role": if app.capacity.router.is_on() { "router" } else { "server" },
            "router": app.capacity.router.status(),
        },
        "models": app.models.status(),
        "model_turns": app.models.turns_status(),
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
        "policies": {
            "generation": chain.generation(),
            "chain": policies,
            "evaluated": if chain.runs_inline() { "inline" } else { "blocking_pool" },
            "compile_cache": app.policies.cache_status(),
        },
        "state": app.fleet.as_ref().map_or_else(
            || json!({ "backend": "memory" }),
            |f| f.status(),
        ),
    })
}

/// Waiters listed in /live, the next to be served first.
const LIVE_WAITERS: usize = 200;

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
fn band_totals(app: &App) -> Vec<crate::admission::BandStats> {
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
