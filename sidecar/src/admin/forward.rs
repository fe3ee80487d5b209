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

use super::audit;
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
    let changes = auth::need(&parts.method, parts.uri.path()) == Need::Change;
    let limits = &app.limits;
    let body = match tokio::time::timeout(
        limits.body_timeout,
        http_body_util::Limited::new(body, limits.max_body).collect(),
    )
    .await
    {
        Ok(Ok(c)) => c.to_bytes(),
        _ => {
            if changes {
                audit::Pending::new(caller, &parts.method, &parts.uri, b"", request_id, "-")
                    .refused(400, "bad_request");
            }
            return respond::json(
                400,
                &json!({"error": {"code": 400, "message": "the request body could not be read within the limits", "type": "invalid_request_error"}}),
            );
        }
    };
    // The admin token is slotgate's, never llama-server's: with it, slotgate's key goes instead.
    let lent = admitted == Admitted::Token && {
        parts.headers.remove(header::AUTHORIZATION);
        app.upstream.attach_key(&mut parts.headers)
    };
    let credentials = if lent {
        "slotgate_key"
    } else if parts.headers.contains_key(header::AUTHORIZATION)
        || parts.headers.contains_key("x-api-key")
    {
        "caller"
    } else {
        "none"
    };
    let pending = changes.then(|| {
        audit::Pending::new(
            caller,
            &parts.method,
            &parts.uri,
            &body,
            request_id,
            credentials,
        )
    });
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let sent = app
        .upstream
        .send(&parts.method, pq, &parts.headers, body, true)
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
