//! The reply phase: the one response a request gets. The upstream's answer, its body guarded (see
//! `body`), with slotgate's headers and the policies'; or slotgate's own refusal in the API's shape,
//! with the CORS headers llama-server would send.

use std::collections::BTreeMap;

use http::{header, HeaderName, HeaderValue, Request};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::dialect::DialectRef;
use crate::error::{GateError, Outcome};
use crate::respond;
use crate::server::write_watch::WriteWatch;
use crate::state::App;
use crate::upstream::copy_end_to_end;

use super::access::Exchange;
use super::body::GuardedBody;
use super::forward::Sent;
use super::intake::Intake;
use super::orca;
use super::routes::Handling;
use super::strip::StripUsage;
use super::{Response, PROMPT_TOKENS_HEADER, QUEUE_WAIT_HEADER, REASON_HEADER};

/// What the phases came to, short of a refusal.
#[allow(
    clippy::large_enum_variant,
    reason = "made once per request and moved once: boxing it would cost an allocation"
)]
pub(super) enum Answer {
    /// llama-server answered.
    Upstream {
        sent: Sent,
        intake: Intake,
        headers: BTreeMap<String, String>,
        slot_route: bool,
    },
    /// A CORS preflight llama-server could not answer: slotgate answers it as llama-server would.
    Preflight,
}

/// A request turned away, and whether its body was left unread.
pub(super) struct Refusal {
    error: GateError,
    body_unread: bool,
    /// The headers the policies that allowed the request asked for (its rate-limit headers):
    /// a refusal after them (the queue's, say) carries them too.
    headers: BTreeMap<String, String>,
}

impl Refusal {
    /// Answered before the body was read to its end: the connection closes lingering, so a
    /// client still writing its body gets to read the answer.
    pub fn body_unread(error: GateError) -> Self {
        Refusal {
            error,
            body_unread: true,
            headers: BTreeMap::new(),
        }
    }

    /// Reading the body failed: as JSON or as too slow, it was read through; otherwise not.
    pub fn reading(error: GateError) -> Self {
        let body_unread = !matches!(error, GateError::InvalidJson(_) | GateError::BodyTimeout(_));
        Refusal {
            error,
            body_unread,
            headers: BTreeMap::new(),
        }
    }

    /// The refusal of a request the policies had allowed, with the headers they asked for.
    pub fn after_policies(error: GateError, headers: &BTreeMap<String, String>) -> Self {
        Refusal {
            headers: headers.clone(),
            ..Refusal::from(error)
        }
    }
}

impl From<GateError> for Refusal {
    fn from(error: GateError) -> Self {
        Refusal {
            error,
            body_unread: false,
            headers: BTreeMap::new(),
        }
    }
}

/// How slotgate's own answers to one request are written: in its API's shape, with the CORS
/// headers llama-server would send.
pub(super) struct Reply<'a> {
    app: &'a App,
    dialect: Option<DialectRef>,
    origin: Option<HeaderValue>,
    watch: Option<WriteWatch>,
    /// The load report its answer carries, for a slot route (`--load-report`).
    load: Option<orca::Format>,
}

impl<'a> Reply<'a> {
    pub fn to(app: &'a App, req: &Request<Incoming>, found: &Result<Handling, GateError>) -> Self {
        let dialect = match found {
            Ok(Handling::Slot(d)) => Some(*d),
            _ => None,
        };
        Reply {
            app,
            dialect,
            origin: req.headers().get(header::ORIGIN).cloned(),
            watch: req.extensions().get::<WriteWatch>().cloned(),
            load: dialect.and_then(|_| orca::wanted(app.config.load_report, req.headers())),
        }
    }

    /// The load report of `admission` (the request's pool), when its answer carries one.
    fn report_load(&self, admission: &crate::admission::Admission, headers: &mut http::HeaderMap) {
        if let Some(format) = self.load {
            headers.insert(orca::LOAD_HEADER, orca::report(&admission.stats(), format));
        }
    }

    pub fn refuse(&self, mut ex: Exchange, refusal: Refusal) -> Response {
        let e = &refusal.error;
        if refusal.body_unread {
            if let Some(w) = &self.watch {
                w.mark_unread_body();
            }
        }
        ex.set_status(respond::status(e, self.dialect));
        ex.refused(e);
        ex.finish(e.outcome());
        if e.outcome() == Outcome::UpstreamError {
            tracing::warn!(error = %e, "upstream failure");
        }
        let mut resp = respond::error(e, self.dialect);
        for (name, value) in &refusal.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                resp.headers_mut().insert(n, v);
            }
        }
        resp.headers_mut()
            .insert(REASON_HEADER, HeaderValue::from_static(e.outcome().label()));
        // Refused before its pool was known: the gate's load (all of it, behind a router).
        self.report_load(&self.app.admission, resp.headers_mut());
        self.app
            .cors
            .apply(self.origin.as_ref(), resp.headers_mut());
        resp
    }

    /// llama-server's `/health`, from slotgate's readiness: 200 `{"status":"ok"}` while
    /// llama-server is ready and slotgate is not draining, else 503 as llama-server answers while
    /// it loads.
    pub fn health(&self) -> Response {
        let app = self.app;
        let ready = app.upstream.is_ready() && !app.admission.is_closed();
        let mut resp = match ready {
            true => respond::llama_json(200, &serde_json::json!({"status": "ok"})),
            false => respond::loading(),
        };
        app.cors.apply(self.origin.as_ref(), resp.headers_mut());
        resp
    }

    /// `GET /v1/loads` (see `loads`).
    pub async fn loads(
        &self,
        headers: &http::HeaderMap,
        addr: Option<std::net::IpAddr>,
    ) -> Response {
        let mut resp = super::loads::answer(self.app, headers, addr).await;
        self.app
            .cors
            .apply(self.origin.as_ref(), resp.headers_mut());
        resp
    }

    /// `GET /v1/slotgate/me` (see `me`).
    pub async fn me(
        &self,
        headers: &http::HeaderMap,
        peer: Option<slotgate_sdk::Peer>,
        addr: Option<std::net::IpAddr>,
    ) -> Response {
        let mut resp = super::me::answer(self.app, headers, peer, addr).await;
        self.app
            .cors
            .apply(self.origin.as_ref(), resp.headers_mut());
        resp
    }

    pub fn answer(self, mut ex: Exchange, answer: Answer) -> Response {
        let (sent, intake, headers, slot_route) = match answer {
            Answer::Upstream {
                sent,
                intake,
                headers,
                slot_route,
            } => (sent, intake, headers, slot_route),
            Answer::Preflight => {
                ex.set_status(200);
                ex.finish(Outcome::Ok);
                return self.app.cors.preflight(self.origin.as_ref());
            }
        };
        let (upstream_parts, body) = sent.response.into_parts();
        let content_type = upstream_parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let mut out = http::Response::new(());
        *out.status_mut() = upstream_parts.status;
        copy_end_to_end(&upstream_parts.headers, out.headers_mut());
        // Among them the case of llama-server's header names, which the client then reads as sent.
        *out.extensions_mut() = upstream_parts.extensions;
        // Most requests never wait: their header is a constant rather than a formatted number.
        let waited = match sent.queue_wait.as_millis() as u64 {
            0 => HeaderValue::from_static("0"),
            ms => HeaderValue::from(ms),
        };
        out.headers_mut().insert(QUEUE_WAIT_HEADER, waited);
        if self.load.is_some() {
            let pool = intake.model_pool(self.app);
            let admission = pool.as_ref().map_or(&self.app.admission, |p| &p.admission);
            self.report_load(admission, out.headers_mut());
        }
        if let Some(n) = intake.summary.prompt_tokens.filter(|_| slot_route) {
            out.headers_mut()
                .insert(PROMPT_TOKENS_HEADER, HeaderValue::from(n));
        }
        for (name, value) in headers {
            match (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                (Ok(n), Ok(v)) => {
                    out.headers_mut().insert(n, v);
                }
                _ => {
                    tracing::warn!(header = %name, "a policy asked for an invalid response header; skipped")
                }
            }
        }
        let guarded = GuardedBody::new(
            body,
            sent.slot,
            sent.inflight,
            ex,
            sent.forwarded_at,
            content_type,
            intake.dialect,
        )
        .answered(upstream_parts.status)
        .resumable(slot_route && intake.names_conversation())
        .guarded(self.watch, self.app.config.upstream_idle_timeout)
        .on_upstream_timeout(self.app.quarantine.clone())
        .traced(sent.span);
        if sent.strip_usage {
            return out.map(|()| StripUsage::new(guarded.boxed_unsync()).boxed_unsync());
        }
        out.map(|()| guarded.boxed_unsync())
    }
}
