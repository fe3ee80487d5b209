//! The load report a router in front reads off a response (docs/observability.md): ORCA's
//! `endpoint-load-metrics` header, as vLLM and Triton send it and Envoy parses it, with what
//! slotgate knows exactly: its slots, its queue, the KV pool and the wait a request queued now
//! would have.

use std::fmt::Write;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::admission::QueueStats;
use crate::config::LoadReport;

pub const LOAD_HEADER: HeaderName = HeaderName::from_static("endpoint-load-metrics");
/// The request header that asks for a report, and in which format (vLLM's, Envoy's).
pub const FORMAT_HEADER: HeaderName = HeaderName::from_static("endpoint-load-metrics-format");

/// The two text forms of ORCA's report (its binary form, `endpoint-load-metrics-bin`, is not
/// written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `TEXT application_utilization=0.5, named_metrics.x=1`
    Text,
    /// `JSON {"application_utilization":0.5,"named_metrics":{"x":1}}`
    Json,
}

/// Whether a response to a request with `headers` carries a report, and in which form.
pub fn wanted(setting: LoadReport, headers: &HeaderMap) -> Option<Format> {
    if setting == LoadReport::Never {
        return None;
    }
    let asked = headers
        .get(&FORMAT_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let form = |f: &str| match f.eq_ignore_ascii_case("json") {
        true => Format::Json,
        false => Format::Text,
    };
    match setting {
        LoadReport::Never => None,
        LoadReport::Asked => asked.map(form),
        LoadReport::Always => Some(asked.map_or(Format::Text, form)),
    }
}

/// The report of `q` (one pool's queue: the gate's, or a model's behind a router).
///
/// `application_utilization` is the work there is over the slots to do it, `(busy + waiting) /
/// slots`: 1 when every slot is busy, more while requests wait, so a router weighting backends by
/// it (Envoy's client-side weighted round robin) sends less to a pair whose queue grows. The named
/// metrics carry vLLM's names where vLLM has one (the Inference Extension's model server protocol
/// reads those), and slotgate's own beside them.
pub fn report(q: &QueueStats, format: Format) -> HeaderValue {
    let slots = q.slots.max(1) as f64;
    let utilization = (q.busy + q.depth) as f64 / slots;
    let named: [(&str, Option<f64>); 7] = [
        ("num_requests_running", Some(q.serving as f64)),
        ("num_requests_waiting", Some(q.depth as f64)),
        ("kv_cache_usage_perc", q.kv_share()),
        ("slots_in_use", Some(q.busy as f64)),
        ("slots_total", Some(q.slots as f64)),
        ("queue_capacity", Some(q.capacity as f64)),
        ("expected_wait_seconds", Some(round(q.drain_seconds()))),
    ];
    let mut out = String::with_capacity(256);
    match format {
        Format::Text => {
            let _ = write!(out, "TEXT application_utilization={}", round(utilization));
            for (name, v) in named.iter().filter_map(|(n, v)| Some((n, (*v)?))) {
                let _ = write!(out, ", named_metrics.{name}={}", round(v));
            }
        }
        Format::Json => {
            let _ = write!(
                out,
                "JSON {{\"application_utilization\":{},\"named_metrics\":{{",
                round(utilization)
            );
            for (i, (name, v)) in named
                .iter()
                .filter_map(|(n, v)| Some((n, (*v)?)))
                .enumerate()
            {
                let sep = if i > 0 { "," } else { "" };
                let _ = write!(out, "{sep}\"{name}\":{}", round(v));
            }
            out.push_str("}}");
        }
    }
    HeaderValue::from_str(&out).unwrap_or(HeaderValue::from_static("TEXT"))
}

/// Four decimals: a load, not a measurement to the last bit.
pub(super) fn round(v: f64) -> f64 {
    if !v.is_finite() {
        return 0.0;
    }
    (v * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> QueueStats {
        QueueStats {
            slots: 4,
            busy: 4,
            serving: 4,
            kv_reserved: 3072,
            kv_pool: Some(8192),
            depth: 2,
            capacity: 8,
            wait_seconds: 1.23456,
            ..QueueStats::default()
        }
    }

    #[test]
    fn text_and_json_carry_the_same_load() {
        let text = report(&stats(), Format::Text);
        assert_eq!(
            text.to_str().unwrap(),
            "TEXT application_utilization=1.5, named_metrics.num_requests_running=4, \
             named_metrics.num_requests_waiting=2, named_metrics.kv_cache_usage_perc=0.375, \
             named_metrics.slots_in_use=4, named_metrics.slots_total=4, \
             named_metrics.queue_capacity=8, named_metrics.expected_wait_seconds=1.2346"
        );
        let json = report(&stats(), Format::Json);
        let body = json.to_str().unwrap().strip_prefix("JSON ").unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["application_utilization"], 1.5);
        assert_eq!(v["named_metrics"]["num_requests_waiting"], 2.0);
        assert_eq!(v["named_metrics"]["kv_cache_usage_perc"], 0.375);
        // No pool seen: no KV figure rather than a made-up one.
        let q = QueueStats {
            kv_pool: None,
            ..stats()
        };
        assert!(!report(&q, Format::Text)
            .to_str()
            .unwrap()
            .contains("kv_cache"));
    }

    #[test]
    fn a_report_is_sent_when_the_setting_and_the_request_say() {
        let mut asked = HeaderMap::new();
        asked.insert(FORMAT_HEADER, HeaderValue::from_static("json"));
        let none = HeaderMap::new();
        assert_eq!(wanted(LoadReport::Asked, &asked), Some(Format::Json));
        assert_eq!(wanted(LoadReport::Asked, &none), None);
        assert_eq!(wanted(LoadReport::Always, &none), Some(Format::Text));
        assert_eq!(wanted(LoadReport::Never, &asked), None);
    }
}
