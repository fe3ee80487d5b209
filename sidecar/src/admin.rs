//! The admin listener: Prometheus scrape, liveness, readiness and a JSON status for operators.

use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::json;

use crate::metrics as m;
use crate::respond::{self, Body};
use crate::state::App;

pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Response<Body> {
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
            if app.upstream.is_ready() && !app.admission.stats().closed {
                respond::text(200, "ready\n")
            } else {
                respond::text(503, "not ready\n")
            }
        }
        "/status" => respond::json(200, &status(&app)),
        _ => respond::json(
            404,
            &json!({"error": {"message": format!("no admin endpoint {}", req.uri().path()), "type": "not_found_error", "code": "not_found"}}),
        ),
    }
}

/// slotgate's series, then llama-server's own (`--upstream-metrics`) when it answers in time: one
/// scrape target for both. The estimate of reserved KV cache is computed here, per scrape, not on
/// the request path.
async fn metrics_text(app: &App) -> String {
    let q = app.admission.stats();
    if let Some(ctx) = app.cost.slot_context() {
        let capacity = (ctx.n_ctx as f64) * q.slots as f64;
        metrics::gauge!(m::KV_CACHE_RESERVED_RATIO)
            .set((q.tokens_in_service / capacity).clamp(0.0, 1.0));
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

pub fn status(app: &App) -> serde_json::Value {
    let q = app.admission.stats();
    let slots = app.slots_status();
    let tenants: Vec<serde_json::Value> = app
        .admission
        .tenants(STATUS_TENANTS)
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
        "queue": { "depth": q.depth, "capacity": q.capacity, "tenant_limit": q.tenant_limit },
        "fairness": {
            "priority_aging_seconds": app.config.priority_aging.map_or(0.0, |d| d.as_secs_f64()),
            "tenants": tenants,
        },
        "inflight": app.upstream.inflight(),
        "upstream": { "ready": app.upstream.is_ready(), "target": app.upstream.target().to_string() },
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
