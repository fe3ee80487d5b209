//! The admin listener: Prometheus scrape, liveness, readiness, the operator's JSON (`/status`,
//! `/live`), quotas, usage and keys, its OpenAPI document (`openapi`), and llama-server's own
//! whole-server endpoints forwarded (`forward`). Its own routes are one table (`routes`). Every
//! request is first checked (`auth`: the uid allow-list, then the admin token) and every call that
//! changes something is audited (`audit`). docs/security.md is this room for operators.

pub mod audit;
pub mod auth;
mod console;
mod forward;
mod keys;
mod live;
mod openapi;
mod quotas;
mod routes;
mod scrape;
mod status;
mod usage;

use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::json;
use slotgate_sdk::Peer;

use crate::pipeline;
use crate::pipeline::request_id::{self, REQUEST_ID};
use crate::respond::{self, Body};
use crate::server::conn::ClientAddr;
use crate::state::App;
use auth::{Caller, Need};
pub use live::live;
use routes::{Found, Serve};
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
    let found = routes::find(req.method(), path);
    let forwarded = matches!(found, Found::None)
        && !console::serves(path)
        && pipeline::routes::lookup(req.method().as_str(), path)
            .is_some_and(|r| matches!(r.handling, pipeline::routes::Handling::Admin));
    let (need, audited) = match &found {
        Found::Route(r, _) => (r.need, r.serve.audited()),
        _ => (auth::need(req.method(), path), forwarded),
    };
    let admitted = match auth::check(app, caller, need, path, req.headers()) {
        Ok(a) => a,
        Err(refusal) => {
            if audited && need == Need::Change {
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
    let (route, param) = match found {
        Found::Route(route, param) => (route, param.unwrap_or_default().to_owned()),
        Found::OtherMethod(allowed) => return method_not_allowed(path, &allowed),
        // As before the table: what no route has is GET only.
        Found::None if req.method() != Method::GET && req.method() != Method::HEAD => {
            return respond::json(
                405,
                &json!({"error": {"message": "admin endpoints are GET only", "type": "invalid_request_error", "code": "method_not_allowed"}}),
            )
        }
        Found::None => {
            return respond::json(
                404,
                &json!({"error": {"message": format!("no admin endpoint {path}"), "type": "not_found_error", "code": "not_found"}}),
            )
        }
    };
    own(app, caller, req, route.serve, &param, id).await
}

/// One of the admin listener's own routes, its caller let in; `param` its `{name}` segment's value.
async fn own(
    app: &App,
    caller: &Caller,
    req: Request<Incoming>,
    serve: Serve,
    param: &str,
    id: &str,
) -> Response<Body> {
    match serve {
        Serve::Metrics => {
            let mut resp = Response::new(respond::full(scrape::metrics_text(app).await));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        Serve::Livez => respond::text(200, "ok\n"),
        Serve::Readyz => {
            if app.upstream.is_ready() && !app.admission.is_closed() {
                respond::text(200, "ready\n")
            } else {
                respond::text(503, "not ready\n")
            }
        }
        Serve::Status => respond::json(200, &status(app)),
        Serve::Live => respond::json(200, &serde_json::json!(live(app))),
        Serve::Usage => usage::usage(app, req.uri().query(), req.headers()),
        Serve::Quotas => quotas::list(app, req.uri().query()),
        Serve::QuotaChange => quota_change(app, caller, req, id).await,
        Serve::Keys => keys::list(app),
        Serve::Key => keys::show(app, param),
        Serve::KeyCreate | Serve::KeyRevoke | Serve::KeyRotate => {
            key_change(app, caller, req, serve, param, id).await
        }
        Serve::OpenApi => openapi::answer(),
    }
}

/// 405 for a path served with other methods, naming them (`Allow`).
fn method_not_allowed(path: &str, allowed: &[&str]) -> Response<Body> {
    let allowed = allowed.join(", ");
    let mut resp = respond::json(
        405,
        &json!({"error": {"message": format!("{path} takes {allowed}"), "type": "invalid_request_error", "code": "method_not_allowed"}}),
    );
    if let Ok(v) = http::HeaderValue::from_str(&allowed) {
        resp.headers_mut().insert(http::header::ALLOW, v);
    }
    resp
}

/// A change of the keys: its body read within the limits, then the change (audited there).
async fn key_change(
    app: &App,
    caller: &Caller,
    req: Request<Incoming>,
    serve: Serve,
    key: &str,
    id: &str,
) -> Response<Body> {
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
    let call = (&parts.method, parts.uri.path());
    keys::change(app, caller, serve, key, call, &body, id)
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
