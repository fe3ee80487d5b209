//! Who is asking: the one credential llama-server will check, read out of the request by its rules,
//! and whether llama-server takes it, known before the request is charged, counted or queued.
//!
//! llama-server (`server-http.cpp`, `middleware_validate_api_key`) reads the first `Authorization`
//! value, else (when it is absent or empty) the first `X-Api-Key`; it drops a leading `Bearer `
//! (that spelling only) and compares the rest with its keys exactly. slotgate reads the same bytes
//! the same way, so the tenant it charges is the key llama-server checks. A request that could be
//! read two ways is refused with 400 before anything is charged: two `Authorization` or two
//! `X-Api-Key` headers, both headers with different keys, or a `Connection` header naming one
//! (a proxy would drop it, and llama-server would check the other).
//!
//! When llama-server checks keys, a caller it would refuse is refused with its answer before it is
//! charged (`upstream::verdicts`): a made-up key takes no queue place, no policy state, no ledger
//! row and no exact count (which would use slotgate's key).

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use std::net::IpAddr;
use std::sync::Arc;

use slotgate_sdk::Peer;

use crate::config::{ClientAuth, Networks, UidTenants};
use crate::error::{GateError, KeyProblem};
use crate::keys::{Key, Keys, Refused};
use crate::upstream::verdicts::Shown;

/// The Messages API's key header.
pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The two headers a credential comes in, as statics (a credential borrows its header's name).
static AUTH_HEADER: HeaderName = AUTHORIZATION;
static KEY_HEADER: HeaderName = X_API_KEY;

/// The prefix llama-server drops, in its one spelling.
const BEARER: &[u8] = b"Bearer ";

/// The credential of a request: the header it came in and the key llama-server compares.
#[derive(Debug, Clone, Copy)]
pub struct Credential<'a> {
    pub header: &'static HeaderName,
    pub value: &'a HeaderValue,
    /// The value without llama-server's `Bearer ` prefix.
    pub key: &'a [u8],
}

impl Credential<'_> {
    /// The key's SHA-256 digest.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.key).into()
    }

    /// As llama-server is shown it, for its verdict, with its key's `digest`.
    pub fn shown(&self, digest: [u8; 32]) -> Shown<'_> {
        Shown {
            header: self.header,
            value: self.value,
            digest,
        }
    }
}

/// The request's one credential, read as llama-server reads it; 400 when it could be read two ways.
pub fn credential(headers: &HeaderMap) -> Result<Option<Credential<'_>>, GateError> {
    let one = |name: &'static HeaderName| -> Result<Option<&HeaderValue>, GateError> {
        let mut all = headers.get_all(name).iter();
        let first = all.next();
        if all.next().is_some() {
            return Err(ambiguous(format!(
                "the request carries more than one `{name}` header; send one credential"
            )));
        }
        Ok(first.filter(|v| !v.is_empty()))
    };
    let auth = one(&AUTH_HEADER)?;
    let api_key = one(&KEY_HEADER)?;
    for token in crate::upstream::connection_tokens(headers) {
        if token.eq_ignore_ascii_case("authorization") || token.eq_ignore_ascii_case("x-api-key") {
            return Err(ambiguous(format!(
                "the `Connection` header names `{token}`: a credential cannot be hop-by-hop; send it as an ordinary header"
            )));
        }
    }
    let chosen = match (auth, api_key) {
        (Some(a), Some(k)) => {
            let from_auth = without_bearer(a.as_bytes());
            if from_auth != without_bearer(k.as_bytes()) && from_auth != k.as_bytes() {
                return Err(ambiguous(
                    "the request carries two different keys, in `Authorization` and in `X-Api-Key`; send one".into(),
                ));
            }
            Some((&AUTH_HEADER, a))
        }
        (Some(a), None) => Some((&AUTH_HEADER, a)),
        (None, Some(k)) => Some((&KEY_HEADER, k)),
        (None, None) => None,
    };
    Ok(chosen.map(|(name, value)| Credential {
        header: name,
        value,
        key: without_bearer(value.as_bytes()),
    }))
}

/// Who slotgate says the caller is (`--client-auth keys`): the tenant, and the key that named it (a
/// mapped Unix peer has none). It names the request everywhere: policies, queue, quotas, ledger,
/// logs and headers.
#[derive(Debug, Clone)]
pub struct Named {
    pub tenant: Arc<str>,
    pub key: Option<Arc<Key>>,
}

impl Named {
    pub fn team(&self) -> Option<&str> {
        self.key.as_ref()?.record.team.as_deref()
    }

    pub fn key_id(&self) -> Option<&str> {
        self.key.as_ref().map(|k| k.record.id.as_str())
    }

    /// Whether its key may use `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.key
            .as_ref()
            .is_none_or(|k| k.record.allows_model(model))
    }
}

/// Lets the caller in by `--client-auth`, before anything is counted or kept: under `keys` a key
/// slotgate issued (which names it), under `upstream` one llama-server would take (asked once, see
/// `upstream::verdicts`), under `open` anyone. `digest` is the credential's, hashed once.
pub async fn let_in(
    app: &crate::state::App,
    credential: Option<&Credential<'_>>,
    digest: Option<[u8; 32]>,
    peer: Option<Peer>,
    addr: Option<IpAddr>,
) -> Result<Option<Named>, GateError> {
    match app.config.client_auth {
        ClientAuth::Open => Ok(None),
        ClientAuth::Upstream => {
            let shown = credential.zip(digest).map(|(c, d)| c.shown(d));
            app.verdicts.check(&app.upstream, shown).await?;
            Ok(None)
        }
        ClientAuth::Keys => named_by_key(
            ClientAuth::Keys,
            &app.keys,
            &app.config.client_auth_uids,
            credential,
            peer,
            addr,
            crate::budgets::wall_ms(),
        ),
    }
}

/// `result`, its refusal of the caller held back first when the caller's peer is refused too often
/// (`server::tarpit`); the one place every route that lets callers in goes through.
pub async fn held<T>(
    result: Result<T, GateError>,
    addr: Option<IpAddr>,
    peer: Option<Peer>,
) -> Result<T, GateError> {
    if let Err(e) = &result {
        if e.refuses_caller() {
            crate::server::tarpit::hold(crate::server::capacity::PeerKey::of(addr, peer)).await;
        }
    }
    result
}

/// `--allow-from`: a TCP peer outside the networks the listeners take, refused before anything
/// else; a Unix-socket peer (no address) is local and passes.
pub fn check_source(networks: &Networks, addr: Option<IpAddr>) -> Result<(), GateError> {
    match addr.filter(|a| !networks.allows(Some(*a))) {
        None => Ok(()),
        Some(addr) => {
            crate::metrics::caller_refused("source_network");
            Err(GateError::SourceNotAllowed {
                addr,
                by_key: false,
            })
        }
    }
}

/// `--client-auth keys`: the caller a key slotgate issued names (or a Unix peer's mapped uid), else
/// a 401 in the API's shape, before anything is counted or kept; each refusal is counted by reason.
pub fn named_by_key(
    mode: ClientAuth,
    keys: &Keys,
    uids: &UidTenants,
    credential: Option<&Credential<'_>>,
    peer: Option<Peer>,
    addr: Option<IpAddr>,
    now_ms: i64,
) -> Result<Option<Named>, GateError> {
    if mode != ClientAuth::Keys {
        return Ok(None);
    }
    let Some(c) = credential else {
        return match peer.and_then(|p| uids.0.get(&p.uid)) {
            Some(tenant) => Ok(Some(Named {
                tenant: Arc::from(tenant.as_str()),
                key: None,
            })),
            None => {
                crate::metrics::caller_refused("no_key");
                Err(GateError::Unauthorized(KeyProblem::Missing))
            }
        };
    };
    match keys.check(c.key, now_ms) {
        // A key that may be used only from some networks: refused elsewhere, as 403, since the
        // caller holds a good key.
        Ok(key) if !key.record.allow_from.allows(addr) => {
            crate::metrics::caller_refused("source_network");
            Err(GateError::SourceNotAllowed {
                addr: addr.expect("a refused source has an address"),
                by_key: true,
            })
        }
        Ok(key) => Ok(Some(Named {
            tenant: Arc::from(key.tenant()),
            key: Some(key),
        })),
        Err(refused) => {
            crate::metrics::caller_refused(refused.reason());
            Err(GateError::Unauthorized(match refused {
                Refused::Unknown => KeyProblem::Unknown,
                Refused::Revoked => KeyProblem::Revoked,
                Refused::Expired => KeyProblem::Expired,
            }))
        }
    }
}

/// llama-server's reading: a leading `Bearer ` dropped, nothing else changed.
fn without_bearer(value: &[u8]) -> &[u8] {
    value.strip_prefix(BEARER).unwrap_or(value)
}

fn ambiguous(message: String) -> GateError {
    GateError::AmbiguousCredentials(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Caller;
    use slotgate_sdk::Peer;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn key(pairs: &[(&str, &str)]) -> Result<Option<Vec<u8>>, String> {
        let h = headers(pairs);
        credential(&h)
            .map(|c| c.map(|c| c.key.to_vec()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_key_is_read_as_llama_server_reads_it() {
        assert_eq!(
            key(&[("authorization", "Bearer k1")]),
            Ok(Some(b"k1".to_vec()))
        );
        // No `Bearer `: llama-server compares the whole value.
        assert_eq!(key(&[("authorization", "k1")]), Ok(Some(b"k1".to_vec())));
        // Another spelling is not its prefix.
        assert_eq!(
            key(&[("authorization", "bearer k1")]),
            Ok(Some(b"bearer k1".to_vec()))
        );
        assert_eq!(key(&[("x-api-key", "k2")]), Ok(Some(b"k2".to_vec())));
        // An empty `Authorization` defers to `X-Api-Key`.
        assert_eq!(
            key(&[("authorization", ""), ("x-api-key", "k2")]),
            Ok(Some(b"k2".to_vec()))
        );
        assert_eq!(key(&[]), Ok(None));
        // The same key in both is one caller.
        assert_eq!(
            key(&[("authorization", "Bearer k"), ("x-api-key", "k")]),
            Ok(Some(b"k".to_vec()))
        );
    }

    #[test]
    fn a_request_read_two_ways_is_refused() {
        for pairs in [
            &[("authorization", "k1"), ("x-api-key", "k2")][..],
            &[("authorization", "Bearer k1"), ("x-api-key", "k2")],
            &[("authorization", "Bearer a"), ("authorization", "Bearer b")],
            &[("x-api-key", "a"), ("x-api-key", "a")],
            &[
                ("authorization", "Bearer r"),
                ("connection", "authorization"),
                ("x-api-key", "k"),
            ],
            &[("x-api-key", "k"), ("connection", "keep-alive, X-Api-Key")],
        ] {
            let err = key(pairs).expect_err(&format!("{pairs:?} is ambiguous"));
            assert!(!err.contains("k1") && !err.contains("k2"), "{err}");
        }
    }

    #[test]
    fn a_caller_is_its_key_else_its_uid() {
        let h = headers(&[("x-api-key", "k")]);
        let c = credential(&h).unwrap();
        let peer = Peer {
            uid: 7,
            gid: 7,
            pid: None,
        };
        let digest = c.as_ref().map(Credential::digest);
        assert!(matches!(Caller::of(digest, Some(peer)), Caller::Key(_)));
        assert_eq!(Caller::of(None, Some(peer)), Caller::Uid(7));
        assert_eq!(Caller::of(None, None), Caller::Anyone);
    }

    #[test]
    fn under_keys_only_an_issued_key_or_a_mapped_uid_is_named() {
        let keys = Keys::none();
        let (_, secret) = keys
            .create(
                crate::keys::NewKey {
                    tenant: "alice".into(),
                    ..Default::default()
                },
                0,
            )
            .unwrap();
        let uids: UidTenants = "7=svc".parse().unwrap();
        let peer = |uid| {
            Some(Peer {
                uid,
                gid: uid,
                pid: None,
            })
        };
        let named = |pairs: &[(&str, &str)], p: Option<Peer>, mode| {
            let h = headers(pairs);
            let c = credential(&h).unwrap();
            named_by_key(mode, &keys, &uids, c.as_ref(), p, None, 1)
                .map(|n| n.map(|n| n.tenant.to_string()))
                .map_err(|e| e.to_string())
        };
        let bearer = format!("Bearer {secret}");
        assert_eq!(
            named(&[("authorization", &bearer)], None, ClientAuth::Keys),
            Ok(Some("alice".into()))
        );
        assert_eq!(
            named(&[("x-api-key", &secret)], peer(7), ClientAuth::Keys),
            Ok(Some("alice".into()))
        );
        assert_eq!(
            named(&[], peer(7), ClientAuth::Keys),
            Ok(Some("svc".into()))
        );
        assert!(named(&[], peer(8), ClientAuth::Keys).is_err());
        assert!(named(&[], None, ClientAuth::Keys).is_err());
        let made_up = named(&[("x-api-key", "sk-made-up")], None, ClientAuth::Keys).unwrap_err();
        assert!(made_up.starts_with("Incorrect API key"), "{made_up}");
        assert_eq!(named(&[], None, ClientAuth::Open), Ok(None));
        assert_eq!(
            named(&[("x-api-key", "x")], None, ClientAuth::Upstream),
            Ok(None)
        );
    }
}
