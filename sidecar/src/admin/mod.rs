//! The admin listener: Prometheus scrape, liveness, readiness, the operator's JSON (`/status`,
//! `/live`), and llama-server's own whole-server endpoints forwarded (`forward`). Every request is
//! first checked (`auth`: the uid allow-list, then the admin token) and every call that changes
//! something is audited (`audit`). docs/security.md is this room for operators.

pub mod audit;
pub mod auth;
mod console;
mod forward;
mod keys;
mod live;
mod quotas;
mod scrape;
mod status;
mod usage;

use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::json;
use slotgate_sdk::Peer;

use crate::pipeline::request_id::{self, REQUEST_ID};
use crate::pipeline::routes;
use crate::respond::{self, Body};
use crate::server::conn::ClientAddr;
use crate::state::App;
use auth::{Caller, Need};
pub use live::live;
pub use status::status;

pub async fn handle(
    app: Arc<App>,
    mut req: Request<Incoming>,
    peer: Option<Peer>,
) -> Response<Body> {
    // What the answer shows (a request counted, say) is in the log before it.
    crate::log::flush();
    let caller = Caller::of(peer, req.extensions().get::<ClientAddr>().map(|a| a.0));
    let id = request_id::assign(req.headers_mut());
    let mut resp = serve(&app, &caller, req, id.to_str().unwrap_or("-")).await;
    resp.headers_mut().insert(REQUEST_ID, id);
    resp
}

async fn serve(app: &App, caller: &Caller, req: Request<Incoming>, id: &str) -> Response<Body> {
    let path = req.uri().path();
    let own = matches!(
        path,
        "/metrics" | "/livez" | "/readyz" | "/status" | "/live" | "/usage" | "/quotas"
    ) || path.starts_with("/quotas/")
        || keys::is_keys_path(path)
        || console::serves(path);
    let forwarded = !own
        && routes::lookup(req.method().as_str(), path)
            .is_some_and(|r| matches!(r.handling, routes::Handling::Admin));
    let admitted = match auth::check(app, caller, req.method(), path, req.headers()) {
        Ok(a) => a,
        Err(refusal) => {
            let changes = forwarded
                || path.starts_with("/quotas/")
                || keys::is_keys_path(path) && req.method() == Method::POST;
            if changes && auth::need(req.method(), path) == Need::Change {
                audit::Pending::new(caller, req.method(), req.uri(), b"", id, "-")
                    .refused(refusal.response.status().as_u16(), refusal.result);
            }
            // A peer guessing tokens is answered more slowly once past its burst.
            if refusal.response.status() == http::StatusCode::UNAUTHORIZED {
                crate::server::tarpit::hold(caller.peer_key()).await;
            }
            return *refusal.response;
        }
    };
    if console::serves(path) {
        return console::serve(req.method(), path, req.headers());
    }
    if forwarded {
        let (parts, body) = req.into_parts();
        return forward::forward(app, caller, admitted, parts, body, id).await;
    }
    if path.starts_with("/quotas/") {
        return quota_change(app, caller, req, id).await;
    }
    if keys::is_keys_path(path) {
        return key_call(app, caller, req, id).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond::json(
            405,
            &json!({"error": {"message": "admin endpoints are GET only", "type": "invalid_request_error", "code": "method_not_allowed"}}),
        );
    }
    match path {
        "/metrics" => {
            let mut resp = Response::new(respond::full(scrape::metrics_text(app).await));
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
        "/status" => respond::json(200, &status(app)),
        "/live" => respond::json(200, &serde_json::json!(live(app))),
        "/usage" => usage::usage(app, req.uri().query(), req.headers()),
        "/quotas" => quotas::list(app, req.uri().query()),
        _ => respond::json(
            404,
            &json!({"error": {"message": format!("no admin endpoint {path}"), "type": "not_found_error", "code": "not_found"}}),
        ),
    }
}

/// A call on the keys: its body read within the limits, then the call (each change audited there).
async fn key_call(app: &App, caller: &Caller, req: Request<Incoming>, id: &str) -> Response<Body> {
    use http_body_util::BodyExt;
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(
        app.limits.body_timeout,
        http_body_util::Limited::new(body, 64 << 10).collect(),
    )
    .await;
    let Ok(Ok(body)) = read.map(|r| r.map(|c| c.to_bytes())) else {
        return respond::json(
            400,
            &json!({"error": {"code": "invalid_request", "message": "the request body could not be read within the limits", "type": "invalid_request_error"}}),
        );
    };
    // A change is one durable commit of a few rows, as a quota change is.
    keys::call(app, caller, &parts.method, parts.uri.path(), &body, id)
}

/// A quota change: its body read within the limits, the change made, and one audit line.
async fn quota_change(
    app: &App,
    caller: &Caller,
    req: Request<Incoming>,
    id: &str,
) -> Response<Body> {
    use http_body_util::BodyExt;
    let (parts, body) = req.into_parts();
    let limits = &app.limits;
    let read = tokio::time::timeout(
        limits.body_timeout,
        http_body_util::Limited::new(body, 64 << 10).collect(),
    )
    .await;
    let Ok(Ok(body)) = read.map(|r| r.map(|c| c.to_bytes())) else {
        audit::Pending::new(caller, &parts.method, &parts.uri, b"", id, "-")
            .refused(400, "bad_request");
        return respond::json(
            400,
            &json!({"error": {"code": "invalid_request", "message": "the request body could not be read within the limits", "type": "invalid_request_error"}}),
        );
    };
    let pending = audit::Pending::new(caller, &parts.method, &parts.uri, &body, id, "-");
    let resp = quotas::change(app, &parts.method, parts.uri.path(), &body).await;
    let status = resp.status().as_u16();
    match status {
        200 => pending.refused(200, "ok"),
        400..=499 => pending.refused(status, "bad_request"),
        _ => pending.refused(status, "error"),
    }
    resp
}
