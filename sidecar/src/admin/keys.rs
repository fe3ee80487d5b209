//! The keys admin API (docs/keys.md#the-admin-api), admin token only, every change audited:
//! `GET /keys` and `GET /keys/{id}` (never a secret), `POST /keys` (a new key: its secret is in this
//! one answer and nowhere else), `POST /keys/{id}/revoke` and `POST /keys/{id}/rotate` (a new
//! secret; the old one works for `grace` more).

use http::{Method, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::audit::{self, Entry, Who};
use super::auth::Caller;
use super::routes::Serve;
use crate::keys::KeyError;
use crate::respond::{self, Body};
use crate::state::App;

/// `GET /keys`: every key, never a secret.
pub fn list(app: &App) -> Response<Body> {
    let now = crate::budgets::wall_ms();
    let all: Vec<Value> = app.keys.list().iter().map(|r| r.shown(now)).collect();
    respond::json(200, &json!({"count": all.len(), "keys": all}))
}

/// `GET /keys/{id}`.
pub fn show(app: &App, id: &str) -> Response<Body> {
    match app.keys.get(id) {
        Some(r) => respond::json(200, &r.shown(crate::budgets::wall_ms())),
        None => not_found(id),
    }
}

/// A change (`serve`: create, revoke or rotate the key `id`) with its body (already read,
/// bounded), audited.
pub fn change(
    app: &App,
    caller: &Caller,
    serve: Serve,
    id: &str,
    (method, path): (&Method, &str),
    body: &[u8],
    request_id: &str,
) -> Response<Body> {
    let now = crate::budgets::wall_ms();
    let keys = &app.keys;
    let action = match serve {
        Serve::KeyCreate => "key_create",
        Serve::KeyRevoke => "key_revoke",
        _ => "key_rotate",
    };
    let done = match action {
        "key_create" => match serde_json::from_slice::<crate::keys::NewKey>(body) {
            Ok(new) => keys.create(new, now).map(|(r, s)| (r, Some(s))),
            Err(e) => Err(KeyError::Invalid(format!(
                "expected {{\"tenant\", \"team\"?, \"models\"?, \"expires\"?, \"priority\"?, \"max_in_service\"?, \"labels\"?}}: {e}"
            ))),
        },
        "key_revoke" => keys.revoke(id, now).map(|r| (r, None)),
        _ => match grace_of(body) {
            Ok(grace) => keys.rotate(id, grace, now).map(|(r, s)| (r, Some(s))),
            Err(e) => Err(KeyError::Invalid(e)),
        },
    };
    let (status, result, detail, resp) = match done {
        Ok((record, secret)) => {
            let mut shown = record.shown(now);
            if let Some(s) = secret {
                shown["secret"] = json!(s);
            }
            let status = if action == "key_create" { 201 } else { 200 };
            let detail = format!("id={} tenant={}", record.id, record.tenant);
            (status, "ok", detail, respond::json(status, &shown))
        }
        Err(e) => {
            let (status, result, code) = match &e {
                KeyError::Invalid(_) => (400, "bad_request", "invalid_request"),
                KeyError::NotFound(_) => (404, "bad_request", "not_found"),
                KeyError::Store(_) => (500, "error", "state_error"),
            };
            let detail = match id {
                "" => "-".to_owned(),
                id => format!("id={}", crate::log::shown::shown(id)),
            };
            (status, result, detail, bad(status, code, &e.to_string()))
        }
    };
    audit::record(&Entry {
        action,
        who: Some(Who::Caller(caller)),
        method: Some(method.as_str()),
        path: Some(path),
        status,
        result,
        request_id: Some(request_id),
        credentials: "-",
        detail: Some(detail),
        ..Entry::default()
    });
    resp
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Rotate {
    /// How long the old secret keeps working: `1h`, `0s`.
    #[serde(default)]
    grace: Option<String>,
}

/// The rotation's grace (none: 0, the old secret stops at once).
fn grace_of(body: &[u8]) -> Result<std::time::Duration, String> {
    let r: Rotate = if body.iter().all(u8::is_ascii_whitespace) {
        Rotate::default()
    } else {
        serde_json::from_slice(body).map_err(|e| format!("expected {{\"grace\": \"1h\"}}: {e}"))?
    };
    match r.grace {
        None => Ok(std::time::Duration::ZERO),
        Some(g) => humantime::parse_duration(&g)
            .map_err(|e| format!("grace `{g}` is not a duration (1h, 30m, 0s): {e}")),
    }
}

fn not_found(id: &str) -> Response<Body> {
    bad(
        404,
        "not_found",
        &format!(
            "no key {} (`slotgate key list` shows them)",
            crate::log::shown::shown(id)
        ),
    )
}

fn bad(status: u16, code: &str, message: &str) -> Response<Body> {
    respond::json(
        status,
        &json!({"error": {"code": code, "message": message, "type": "invalid_request_error"}}),
    )
}
