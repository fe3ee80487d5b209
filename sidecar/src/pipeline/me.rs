//! The caller's own view (docs/keys.md#what-a-caller-sees): `GET /v1/slotgate/me` on the client
//! listener answers, to the caller and about the caller only, who slotgate takes it for (tenant,
//! team, key id, models, expiry) and each calendar quota it is charged to: its limit, what is used
//! and left, and when it is whole again.
//!
//! Let in as any request is (`--client-auth`): a caller slotgate or llama-server would refuse gets
//! that refusal. Answered by slotgate itself, like `/health`: no policy judges it, nothing is
//! counted or queued, llama-server is not asked. The quotas are read from the windows the policies
//! keep, as they stand: a request in flight is counted at its up-front estimate until it settles,
//! so `remaining` may rise a little when it does. The rate-limit headers of an answer show the same
//! windows at the moment that request was decided.

use http::HeaderMap;
use serde_json::{json, Value};
use slotgate_sdk::Peer;

use super::caller::{self, Named};
use crate::error::GateError;
use crate::respond;
use crate::state::App;

type Response = http::Response<crate::respond::Body>;

/// Its path (not one of llama-server's routes).
pub const PATH: &str = "/v1/slotgate/me";

pub async fn answer(
    app: &App,
    headers: &HeaderMap,
    peer: Option<Peer>,
    addr: Option<std::net::IpAddr>,
) -> Response {
    match caller::held(who(app, headers, peer, addr).await, addr, peer).await {
        Ok((name, named)) => respond::json(200, &view(app, &name, named.as_ref())),
        Err(e) => respond::error(&e, None),
    }
}

/// The caller as policies name it: the tenant slotgate named, else the key's hash, else the Unix
/// peer's uid, else anonymous (`slotgate_sdk::Identity`).
async fn who(
    app: &App,
    headers: &HeaderMap,
    peer: Option<Peer>,
    addr: Option<std::net::IpAddr>,
) -> Result<(String, Option<Named>), GateError> {
    caller::check_source(&app.config.allow_from, addr)?;
    let credential = caller::credential(headers)?;
    let digest = credential.as_ref().map(caller::Credential::digest);
    let named = caller::let_in(app, credential.as_ref(), digest, peer, addr).await?;
    let name = match (&named, digest, peer) {
        (Some(n), _, _) => n.tenant.to_string(),
        (None, Some(d), _) => format!("sha256:{}", crate::keys::secret::hex(&d)),
        (None, None, Some(p)) => format!("uid:{}", p.uid),
        (None, None, None) => "anonymous".to_owned(),
    };
    Ok((name, named))
}

fn view(app: &App, name: &str, named: Option<&Named>) -> Value {
    let (levels, _) = app.policies.shared().quota_levels(usize::MAX);
    let record = named.and_then(|n| n.key.as_ref()).map(|k| &k.record);
    let team = record
        .and_then(|r| r.team.as_deref())
        .map(|t| format!("team:{t}"));
    let key = record.map(|r| format!("key:{}", r.id));
    let quotas: Vec<Value> = levels
        .into_iter()
        .filter(|q| {
            let charged = &q.quota.key;
            charged_to(charged, name)
                || team.as_deref().is_some_and(|t| charged_to(charged, t))
                || key.as_deref().is_some_and(|k| charged_to(charged, k))
        })
        .map(|q| {
            let mut row = json!({
                "policy": &*q.quota.policy,
                "key": q.quota.key,
                "period": q.quota.period,
                "limit": q.limit,
                "used": q.limit.map(|l| (l - q.left).max(0.0)),
                "remaining": q.left.max(0.0),
                "resets": crate::keys::rfc3339(q.window_end_ms),
            });
            if let Some(c) = app.config.prices.quota_currency(&q.quota.key) {
                row["currency"] = json!(c);
            }
            row
        })
        .collect();
    json!({
        "tenant": name,
        "team": record.and_then(|r| r.team.as_deref()),
        "key_id": record.map(|r| r.id.as_str()),
        "models": record.map(|r| &r.models),
        "expires": record.and_then(|r| r.expires_ms).map(crate::keys::rfc3339),
        "quotas": quotas,
    })
}

/// Whether a quota key (`tokens:alice`, `requests:alice\u{1f}model-a`, `tokens:team:research`) is
/// `name`'s: the policies' keys are a kind, then whose, then maybe a model after a unit separator.
fn charged_to(key: &str, name: &str) -> bool {
    key.split_once(':').is_some_and(|(_, rest)| {
        rest == name
            || rest
                .strip_prefix(name)
                .is_some_and(|more| more.starts_with('\u{1f}'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_is_the_callers_by_its_key() {
        assert!(charged_to("tokens:alice", "alice"));
        assert!(charged_to("requests:alice\u{1f}model-a", "alice"));
        assert!(charged_to("tokens:team:research", "team:research"));
        assert!(!charged_to("tokens:team:research", "research"));
        assert!(!charged_to("tokens:alicia", "alice"));
        assert!(!charged_to("tokens:bob", "alice"));
        assert!(charged_to("tokens:uid:1000", "uid:1000"));
        assert!(!charged_to("alice", "alice"));
    }
}
