//! The load a router polls (docs/observability.md#load-polled-by-routers-v1loads): `GET /v1/loads`
//! in the engine-native load schema SGLang serves and SMG (the Shepherd Model Gateway) polls for its
//! load-aware policies (`least_load`, `power_of_two`, `cache_aware`), filled with what slotgate
//! knows exactly: requests in service and waiting, its slots and the KV pool's reserved share.
//!
//! Answered by slotgate itself, like `/health`: no policy judges it and no access line is written
//! (a router polls it every second). It is answered only to a caller llama-server would answer:
//! the caller's own credentials are first shown to llama-server on `GET /v1/models` (a route its
//! `--api-key` guards), and its refusal is the answer here. slotgate's key is never lent to it.
//! Under `--client-auth keys` it is a key slotgate issued that lets the caller in, and llama-server
//! is not asked.

use bytes::Bytes;
use http::{HeaderMap, Method};
use serde_json::{json, Value};

use super::orca::round;
use crate::admission::QueueStats;
use crate::config::LoadReport;
use crate::error::GateError;
use crate::respond;
use crate::state::App;
use crate::upstream::{copy_end_to_end, SendError};

type Response = http::Response<crate::respond::Body>;

/// Its path (SGLang's engine route; not one of llama-server's).
pub const PATH: &str = "/v1/loads";

/// llama-server's route the caller's key is shown to: guarded by its `--api-key`, cheap, and
/// answered the same in router mode.
const KEY_PROBE: &str = "/v1/models";

/// The answer to `GET /v1/loads` with `headers`.
pub async fn answer(app: &App, headers: &HeaderMap, addr: Option<std::net::IpAddr>) -> Response {
    if app.config.load_report == LoadReport::Never {
        return respond::error(
            &GateError::NotFound {
                method: Method::GET.to_string(),
                path: PATH.to_owned(),
            },
            None,
        );
    }
    let source = super::caller::check_source(&app.config.allow_from, addr);
    if let Err(e) = super::caller::held(source, addr, None).await {
        return respond::error(&e, None);
    }
    // Under `--client-auth keys` the caller's key is slotgate's to check, never llama-server's
    // to see.
    if app.config.client_auth == crate::config::ClientAuth::Keys {
        let checked = match super::caller::credential(headers) {
            Ok(c) => {
                let digest = c.as_ref().map(super::caller::Credential::digest);
                super::caller::let_in(app, c.as_ref(), digest, None, addr).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = super::caller::held(checked, addr, None).await {
            return respond::error(&e, None);
        }
    } else {
        match app
            .upstream
            .send(&Method::GET, KEY_PROBE, headers, Bytes::new(), false)
            .await
        {
            Ok(resp) if resp.status().is_success() => {}
            // llama-server's own refusal (401 for a missing or wrong key), as it gave it.
            Ok(resp) => {
                let (parts, body) = resp.into_parts();
                let mut out = Response::new(body);
                *out.status_mut() = parts.status;
                copy_end_to_end(&parts.headers, out.headers_mut());
                return out;
            }
            Err(SendError::Loading) => return respond::loading(),
            Err(e) => {
                return respond::error(
                    &GateError::UpstreamUnavailable {
                        reason: e.to_string(),
                        retry_after: 1,
                    },
                    None,
                )
            }
        }
    }
    if app.admission.is_closed() {
        return respond::loading();
    }
    let stamp = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    respond::json(200, &report(&app.admission.stats(), &stamp))
}

/// The report of `q`, stamped `timestamp`: one rank (one llama-server behind one gate) and the
/// aggregate SGLang adds, with slotgate's own figures beside them under `slotgate` (a reader of
/// the schema ignores what it does not know).
///
/// - `num_running_reqs`: requests in service; `num_waiting_reqs`: waiting in slotgate's queue
///   (llama-server's own queue stays empty behind a gate).
/// - `max_running_requests`: the slots; `utilization`: the share of them in use.
/// - `num_used_tokens` / `max_total_num_tokens` / `token_usage`: the KV pool's tokens reserved by
///   the requests in service, the pool, and their ratio (0 while the pool is unknown).
/// - `num_waiting_uncached_tokens` and `gen_throughput` stay 0: slotgate does not know them, and
///   the schema reads 0 as "not reported" (SMG then prices a waiting request at its mean).
pub fn report(q: &QueueStats, timestamp: &str) -> Value {
    let slots = q.slots.max(1) as f64;
    let pool = q.kv_pool.filter(|p| *p > 0);
    let usage = q.kv_share().unwrap_or(0.0);
    let utilization = round(q.busy as f64 / slots);
    let (running, waiting) = (q.serving as i64, q.depth as i64);
    json!({
        "timestamp": timestamp,
        "version": concat!("slotgate ", env!("CARGO_PKG_VERSION")),
        "dp_rank_count": 1,
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_waiting_uncached_tokens": 0,
            "num_total_reqs": running + waiting,
            "num_used_tokens": q.kv_reserved,
            "max_total_num_tokens": pool.unwrap_or(0),
            "token_usage": round(usage),
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": utilization,
            "max_running_requests": q.slots,
        }],
        "aggregate": {
            "total_running_reqs": running,
            "total_waiting_reqs": waiting,
            "total_reqs": running + waiting,
            "avg_token_usage": round(usage),
            "avg_throughput": 0.0,
            "avg_utilization": utilization,
        },
        "slotgate": {
            "slots_in_use": q.busy,
            "slots_total": q.slots,
            "queue_capacity": q.capacity,
            "expected_wait_seconds": round(q.drain_seconds()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_the_queue_in_the_schema_routers_read() {
        let q = QueueStats {
            slots: 4,
            busy: 3,
            serving: 3,
            kv_reserved: 3072,
            kv_pool: Some(8192),
            depth: 2,
            capacity: 8,
            wait_seconds: 1.5,
            ..QueueStats::default()
        };
        let v = report(&q, "2026-12-06T12:00:00.000Z");
        let rank = &v["loads"][0];
        assert_eq!(v["dp_rank_count"], 1);
        assert_eq!(rank["num_running_reqs"], 3);
        assert_eq!(rank["num_waiting_reqs"], 2);
        assert_eq!(rank["num_total_reqs"], 5);
        assert_eq!(rank["token_usage"], 0.375);
        assert_eq!(rank["max_total_num_tokens"], 8192);
        assert_eq!(rank["max_running_requests"], 4);
        assert_eq!(rank["utilization"], 0.75);
        assert_eq!(v["aggregate"]["total_reqs"], 5);
        assert_eq!(v["slotgate"]["expected_wait_seconds"], 1.5);
        // No pool known: no made-up share.
        let v = report(&QueueStats { kv_pool: None, ..q }, "t");
        assert_eq!(v["loads"][0]["token_usage"], 0.0);
        assert_eq!(v["loads"][0]["max_total_num_tokens"], 0);
    }
}
