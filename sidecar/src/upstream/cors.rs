//! CORS as llama-server does it, for the answers slotgate writes itself. llama-server puts
//! `Access-Control-Allow-Origin` on every answer (by `--cors-origins`: the request's `Origin` echoed
//! for `*` with credentials, its default; only a localhost origin for `localhost`; else the list as
//! given) and answers every `OPTIONS` itself with the credentials, methods and headers allowed.
//! slotgate forwards preflights to llama-server, and learns its settings by sending one of its own
//! whenever llama-server becomes ready, so its refusals (429, 503, ...) reach a browser client as
//! llama-server's own answers would.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::client::{PROBE_BODY_LIMIT, USER_AGENT};
use crate::respond::{self, Body};
use crate::upstream::Upstream;

/// The origin of slotgate's own preflight: nobody's, so llama-server's answer shows its rule.
const PROBE_ORIGIN: &str = "http://slotgate-cors-probe.invalid";
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq)]
enum Origin {
    /// The request's `Origin` echoed (`--cors-origins *` with credentials; llama-server's default).
    Echo,
    /// Only a localhost origin echoed (`--cors-origins localhost`).
    Localhost,
    /// This value, whatever the request's origin.
    Fixed(HeaderValue),
}

#[derive(Debug, Clone)]
struct Rule {
    origin: Origin,
    credentials: HeaderValue,
    methods: HeaderValue,
    headers: HeaderValue,
}

impl Default for Rule {
    /// llama-server's defaults.
    fn default() -> Self {
        Rule {
            origin: Origin::Echo,
            credentials: HeaderValue::from_static("true"),
            methods: HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
            headers: HeaderValue::from_static("*"),
        }
    }
}

#[derive(Default)]
pub struct Cors {
    rule: Mutex<Rule>,
}

impl Cors {
    /// Learns llama-server's rule from its answer to a preflight; keeps the last one on failure.
    pub async fn learn(&self, upstream: &Upstream) {
        let Some(h) = preflight_answer(upstream, PROBE_ORIGIN, PROBE_TIMEOUT).await else {
            return;
        };
        let origin = match h.get(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
            Some(v) if v == PROBE_ORIGIN => Origin::Echo,
            Some(v) => Origin::Fixed(v.clone()),
            None => Origin::Localhost,
        };
        let mut rule = self.lock();
        let get = |name: header::HeaderName, old: &HeaderValue| {
            h.get(name).cloned().unwrap_or_else(|| old.clone())
        };
        *rule = Rule {
            origin,
            credentials: get(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, &rule.credentials),
            methods: get(header::ACCESS_CONTROL_ALLOW_METHODS, &rule.methods),
            headers: get(header::ACCESS_CONTROL_ALLOW_HEADERS, &rule.headers),
        };
    }

    /// Adds what llama-server would put on an answer to a request from `origin`.
    pub fn apply(&self, origin: Option<&HeaderValue>, out: &mut HeaderMap) {
        let rule = self.lock();
        let allow = match &rule.origin {
            // As llama-server: echoed even when absent (an empty value).
            Origin::Echo => Some(
                origin
                    .cloned()
                    .unwrap_or_else(|| HeaderValue::from_static("")),
            ),
            Origin::Localhost => origin.filter(|o| is_localhost(o)).cloned(),
            Origin::Fixed(v) => Some(v.clone()),
        };
        if let Some(v) = allow {
            out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
    }

    /// llama-server's answer to a preflight, for when llama-server cannot give it itself.
    pub fn preflight(&self, origin: Option<&HeaderValue>) -> Response<Body> {
        let mut resp = Response::new(respond::full(bytes::Bytes::new()));
        *resp.status_mut() = StatusCode::OK;
        self.apply(origin, resp.headers_mut());
        let rule = self.lock().clone();
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, rule.credentials);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, rule.methods);
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, rule.headers);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
        resp
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rule> {
        self.rule
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The headers of llama-server's answer to a CORS preflight from `origin`, when it answered it
/// (2xx).
async fn preflight_answer(
    upstream: &Upstream,
    origin: &str,
    timeout: Duration,
) -> Option<HeaderMap> {
    let attempt = async {
        let req = Request::builder()
            .method(Method::OPTIONS)
            .uri(upstream.uri("/health"))
            .header(header::ORIGIN, origin)
            .header("access-control-request-method", "POST")
            .header(header::USER_AGENT, USER_AGENT)
            .header(header::CONNECTION, "close")
            .body(Full::new(Bytes::new()))
            .ok()?;
        let resp = upstream.inner.fresh.request(req).await.ok()?;
        // Only llama-server's own answer to a preflight says its rule.
        let headers = resp.status().is_success().then(|| resp.headers().clone());
        let _ = Limited::new(resp.into_body(), PROBE_BODY_LIMIT)
            .collect()
            .await;
        headers
    };
    tokio::time::timeout(timeout, attempt).await.ok().flatten()
}

/// Whether an `Origin` names localhost, 127.0.0.1 or ::1 (any port), as llama-server checks it.
fn is_localhost(origin: &HeaderValue) -> bool {
    let Ok(text) = origin.to_str() else {
        return false;
    };
    let rest = text.split_once("://").map_or(text, |(_, r)| r);
    let host = rest.split('/').next().unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(cors: &Cors, o: Option<&'static str>) -> Option<String> {
        let mut h = HeaderMap::new();
        let o = o.map(HeaderValue::from_static);
        cors.apply(o.as_ref(), &mut h);
        h.get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn each_rule_answers_as_llama_server_does() {
        let cors = Cors::default();
        assert_eq!(
            origin(&cors, Some("http://a.example")).as_deref(),
            Some("http://a.example")
        );
        assert_eq!(origin(&cors, None).as_deref(), Some(""));
        cors.lock().origin = Origin::Localhost;
        assert_eq!(origin(&cors, Some("http://a.example")), None);
        assert_eq!(
            origin(&cors, Some("http://localhost:3000")).as_deref(),
            Some("http://localhost:3000")
        );
        assert!(is_localhost(&HeaderValue::from_static("http://[::1]:8080")));
        cors.lock().origin = Origin::Fixed(HeaderValue::from_static("https://app.example"));
        assert_eq!(
            origin(&cors, Some("http://b.example")).as_deref(),
            Some("https://app.example")
        );
        let pre = cors.preflight(None);
        assert_eq!(
            pre.headers()[header::ACCESS_CONTROL_ALLOW_METHODS],
            "GET, POST, DELETE, OPTIONS"
        );
    }
}
