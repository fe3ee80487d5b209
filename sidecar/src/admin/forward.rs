//! llama-server's own whole-server endpoints (`/slots`, `/lora-adapters`, `POST /props`, the
//! router's `/models/*`; see `routes::Handling::Admin`), forwarded from the admin listener. A caller
//! who brought the admin token reaches llama-server with slotgate's key (the token itself never
//! leaves slotgate); any other caller with its own credentials only, so llama-server decides exactly
//! as if it were called directly. A call that changes something is audited.

use http::request::Parts;
use http::{header, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;

use super::audit::{self, Entry, Who};
use super::auth::{self, Admitted, Caller, Need};
use crate::error::GateError;
use crate::respond::{self, Body};
use crate::state::App;

pub async fn forward(
    app: &App,
    caller: &Caller,
    admitted: Admitted,
    mut parts: Parts,
    body: Incoming,
    request_id: &str,
) -> Response<Body> {
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().map(str::to_owned);
    let changes = auth::need(&parts.method, &path) == Need::Change;
    let action = audit::action(&parts.method, &path, query.as_deref());
    let limits = &app.limits;
    let body = match tokio::time::timeout(
        limits.body_timeout,
        http_body_util::Limited::new(body, limits.max_body).collect(),
    )
    .await
    {
        Ok(Ok(c)) => c.to_bytes(),
        _ => {
            let resp = respond::json(
                400,
                &json!({"error": {"code": 400, "message": "the request body could not be read within the limits", "type": "invalid_request_error"}}),
            );
            if changes {
                audit::record(&Entry {
                    action,
                    who: Some(Who::Caller(caller)),
                    method: Some(parts.method.as_str()),
                    path: Some(&path),
                    status: 400,
                    result: "bad_request",
                    request_id: Some(request_id),
                    credentials: "-",
                    ..Entry::default()
                });
            }
            return resp;
        }
    };
    let credentials = match admitted {
        Admitted::Token => {
            // The admin token is slotgate's, never llama-server's.
            parts.headers.remove(header::AUTHORIZATION);
            if app.upstream.attach_key(&mut parts.headers) {
                "slotgate_key"
            } else if parts.headers.contains_key("x-api-key") {
                "caller"
            } else {
                "none"
            }
        }
        Admitted::Anonymous => {
            if parts.headers.contains_key(header::AUTHORIZATION)
                || parts.headers.contains_key("x-api-key")
            {
                "caller"
            } else {
                "none"
            }
        }
    };
    let pending =
        changes.then(|| audit::Pending::new(caller, &parts, &body, request_id, credentials));
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let sent = app
        .upstream
        .send(&parts.method, pq, &parts.headers, body.clone(), true)
        .await;
    let (resp, reached) = match sent {
        Ok(resp) => (resp, true),
        Err(e) => (
            respond::error(&GateError::Upstream(e.to_string()), None),
            false,
        ),
    };
    if let Some(p) = pending {
        p.finish(resp.status().as_u16(), reached);
    }
    resp
}
