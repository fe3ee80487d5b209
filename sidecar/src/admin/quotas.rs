//! The quota admin API (docs/quotas.md#the-admin-api): every calendar quota of this sidecar with
//! what is left (`GET /quotas`), and an operator's changes, each audited: `POST /quotas/set` (a
//! limit that replaces the policy's, kept on disk; `null` gives it back), `/quotas/top-up` (gives
//! back up to `amount` of what the current window used), `/quotas/reset` (all of it) and
//! `/quotas/grant` (`amount` above the limit, for the current window only).

use http::{Method, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::respond::{self, Body};
use crate::state::App;

/// `GET /quotas[?policy=P][&key=K]`: the quotas in their current windows, the emptiest first.
pub fn list(app: &App, query: Option<&str>) -> Response<Body> {
    let param = |name: &str| {
        form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let (policy, key) = (param("policy"), param("key"));
    let (levels, _) = app.policies.shared().quota_levels(usize::MAX);
    let quotas: Vec<Value> = levels
        .into_iter()
        .filter(|q| policy.as_ref().is_none_or(|p| **p == *q.quota.policy))
        .filter(|q| key.as_ref().is_none_or(|k| *k == q.quota.key))
        .map(|q| {
            let quota = &q.quota;
            let currency = app.config.prices.quota_currency(&quota.key);
            let mut row = json!({
                "policy": &*quota.policy,
                "key": quota.key,
                "period": quota.period,
                "window_start": super::status::rfc3339(q.window_start_ms),
                "window_end": super::status::rfc3339(q.window_end_ms),
                "limit": q.limit,
                "used": q.limit.map(|l| l - q.left),
                "left": q.left,
                "limit_set_by": if app.policies.shared().has_quota_limit(&quota.policy, &quota.key, &quota.period) { "operator" } else { "policy" },
            });
            if let Some(c) = currency {
                row["currency"] = json!(c);
            }
            row
        })
        .collect();
    respond::json(200, &json!({ "count": quotas.len(), "quotas": quotas }))
}

/// The body of a change.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    policy: String,
    key: String,
    period: String,
    /// `set`: the new limit (`null`: the policy's again).
    #[serde(default)]
    limit: Option<f64>,
    /// `top-up`: how much of what was used to give back.
    #[serde(default)]
    amount: Option<f64>,
}

/// `POST /quotas/{set,top-up,reset}`: the change, and the quota after it.
pub async fn change(app: &App, method: &Method, path: &str, body: &[u8]) -> Response<Body> {
    if method != Method::POST {
        return bad(405, "method_not_allowed", "quota changes are POST");
    }
    let c: Change = match serde_json::from_slice(body) {
        Ok(c) => c,
        Err(e) => {
            return bad(
                400,
                "invalid_request",
                &format!("expected {{\"policy\", \"key\", \"period\", ...}}: {e}"),
            )
        }
    };
    // The zone too: an unknown one is the caller's mistake, not the state's.
    let known = slotgate_sdk::calendar::Period::parse(&c.period)
        .and_then(|p| slotgate_sdk::calendar::window(&p, crate::budgets::wall_ms()).map(drop));
    if let Err(e) = known {
        return bad(400, "invalid_period", &e);
    }
    let shared = app.policies.shared();
    // A quota no policy keeps would be changed in name only: refused, with those that exist.
    if let Err(known) = shared.quota_known(&c.policy, &c.key, &c.period) {
        let hint = match known.is_empty() {
            true => "no quota of this policy or key is known yet (`slotgate quota list` shows those in use)".to_owned(),
            false => format!("quotas that exist: {}", known.join("; ")),
        };
        return bad(
            404,
            "unknown_quota",
            &format!(
                "no quota `{}` `{}` `{}` is kept by a policy: check --policy, --key and --period; {hint}",
                crate::log::shown::shown(&c.policy),
                crate::log::shown::shown(&c.key),
                crate::log::shown::shown(&c.period)
            ),
        );
    }
    let done = match path {
        "/quotas/set" => match c.limit {
            Some(l) if !(l.is_finite() && l >= 0.0) => {
                return bad(400, "invalid_limit", "limit must be a number >= 0, or null")
            }
            // On a fleet, on its store: every sidecar's takes read it there.
            limit => match shared.fleet() {
                Some(fleet) => match shared.quota_window_now(&c.policy, &c.key, &c.period) {
                    Ok(window) => fleet.set_limit(&window, limit).await,
                    Err(e) => Err(e),
                },
                None => shared
                    .set_quota_limit(&c.policy, &c.key, &c.period, limit)
                    .map(|left| (!left.is_nan()).then_some(left)),
            },
        },
        "/quotas/top-up" => match c.amount {
            Some(a) if a.is_finite() && a > 0.0 => {
                shared.quota_give_back(&c.policy, &c.key, &c.period, Some(a))
            }
            _ => return bad(400, "invalid_amount", "amount must be a number > 0"),
        },
        "/quotas/reset" => shared.quota_give_back(&c.policy, &c.key, &c.period, None),
        "/quotas/grant" => match c.amount {
            Some(a) if a.is_finite() && a > 0.0 => {
                match shared.grant_quota(&c.policy, &c.key, &c.period, a) {
                    Err(e) if shared.fleet().is_some() => return bad(400, "not_on_a_fleet", &e),
                    done => done,
                }
            }
            _ => return bad(400, "invalid_amount", "amount must be a number > 0"),
        },
        _ => return bad(404, "not_found", &format!("no admin endpoint {path}")),
    };
    match done {
        Ok(left) => respond::json(
            200,
            &json!({
                "policy": c.policy,
                "key": c.key,
                "period": c.period,
                // null: the window is not in use here yet; it starts whole.
                "left": left,
                "limit": shared.quota_limit_of(&c.policy, &c.key, &c.period),
            }),
        ),
        Err(e) => bad(500, "state_error", &e),
    }
}

fn bad(status: u16, code: &str, message: &str) -> Response<Body> {
    respond::json(
        status,
        &json!({"error": {"code": code, "message": message, "type": "invalid_request_error"}}),
    )
}
