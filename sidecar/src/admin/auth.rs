//! Who is asking, and what they may do: the caller (uid and pid from the kernel on a Unix socket,
//! the address on TCP), the uid allow-list, and the admin tokens. One decision per request, taken
//! before its body is read or anything is forwarded; a refusal is in llama-server's own error shape
//! (`{"error": {"code": 401, "message", "type": "authentication_error"}}`).

use std::net::SocketAddr;

use http::{header, HeaderMap, Method};
use serde_json::json;
use slotgate_sdk::Peer;

use crate::config::Grant;
use crate::respond::{self, Body};
use crate::state::App;

/// Who is on the other end of the admin connection.
#[derive(Debug, Clone, Copy)]
pub enum Caller {
    /// A Unix socket peer, as the kernel reports it (`SO_PEERCRED`).
    Unix(Peer),
    Tcp(SocketAddr),
    /// A Unix socket whose peer could not be read.
    Unknown,
}

impl Caller {
    pub fn of(peer: Option<Peer>, addr: Option<SocketAddr>) -> Caller {
        match (peer, addr) {
            (Some(p), _) => Caller::Unix(p),
            (None, Some(a)) => Caller::Tcp(a),
            (None, None) => Caller::Unknown,
        }
    }

    /// Who it is for the per-peer tables (the connection cap, the tarpit).
    pub fn peer_key(&self) -> crate::server::capacity::PeerKey {
        use crate::server::capacity::PeerKey;
        match self {
            Caller::Unix(p) => PeerKey::Uid(p.uid),
            Caller::Tcp(a) => PeerKey::ip(a.ip()),
            Caller::Unknown => PeerKey::Unknown,
        }
    }

    /// `uid=1000 pid=4242`, or `127.0.0.1:50000`: for messages.
    pub fn describe(&self) -> String {
        match self {
            Caller::Unix(p) => format!("uid={} pid={}", p.uid, p.pid.unwrap_or(0)),
            Caller::Tcp(a) => a.to_string(),
            Caller::Unknown => "unknown peer".into(),
        }
    }
}

/// What a route asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `/livez` and `/readyz`: probes carry no credentials; the console's files hold no data.
    Open,
    /// Reads, changes nothing (`GET`, `HEAD`).
    Read,
    /// Changes the server: the admin token's alone.
    Change,
}

/// What a route the admin table (`routes::ROUTES`) does not have asks: llama-server's forwarded
/// routes, and a path unknown or called with another method (answered 404 or 405 once let in).
pub fn need(method: &Method, path: &str) -> Need {
    let read = method == Method::GET || method == Method::HEAD;
    if matches!(path, "/livez" | "/readyz") {
        Need::Open
    } else if read && super::console::serves(path) {
        // The console's files hold no data: what it shows, it reads with the caller's token.
        Need::Open
    } else if path == "/keys" || path.starts_with("/keys/") {
        // Who holds which key is the admin token's alone to see.
        Need::Change
    } else if read {
        Need::Read
    } else {
        Need::Change
    }
}

/// A caller let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// With an admin token: slotgate's upstream key goes with what it forwards.
    Token,
    /// No token is configured (or the route needs none): the caller's own credentials only.
    Anonymous,
}

/// A caller turned away: the answer, and the audit's result label.
pub struct Refusal {
    pub response: Box<http::Response<Body>>,
    pub result: &'static str,
}

/// Decides whether `caller` may make this request, which asks `need`.
pub fn check(
    app: &App,
    caller: &Caller,
    need: Need,
    path: &str,
    headers: &HeaderMap,
) -> Result<Admitted, Refusal> {
    let admin = &app.config.admin;
    if !admin.allow_uids.is_empty() {
        let allowed = match caller {
            Caller::Unix(p) => {
                p.uid == rustix::process::geteuid().as_raw() || admin.allow_uids.contains(&p.uid)
            }
            _ => false,
        };
        if !allowed {
            return Err(forbidden(format!(
                "{} may not use this admin socket: it admits slotgate's own uid and those of \
                 admin-allow-uids",
                caller.describe()
            )));
        }
    }
    let tokens = app.admin_tokens();
    if need == Need::Open || !tokens.required() {
        return Ok(Admitted::Anonymous);
    }
    if need == Need::Read && path == "/metrics" && admin.open_metrics {
        return Ok(Admitted::Anonymous);
    }
    let Some(presented) = bearer(headers) else {
        return Err(unauthorized(
            "this admin endpoint needs the admin token: send `Authorization: Bearer <token>`",
        ));
    };
    match tokens.grant(presented) {
        Grant::Full => Ok(Admitted::Token),
        Grant::Read if need == Need::Read => Ok(Admitted::Token),
        Grant::Read => Err(forbidden(
            "the read-only admin token cannot change anything: use the admin token".into(),
        )),
        Grant::Nothing => Err(unauthorized("Invalid admin token")),
    }
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case), if there is one.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

fn unauthorized(message: &str) -> Refusal {
    let mut response = respond::json(
        401,
        &json!({"error": {"code": 401, "message": message, "type": "authentication_error"}}),
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer realm=\"slotgate admin\""),
    );
    Refusal {
        response: Box::new(response),
        result: "unauthenticated",
    }
}

fn forbidden(message: String) -> Refusal {
    Refusal {
        response: Box::new(respond::json(
            403,
            &json!({"error": {"code": 403, "message": message, "type": "permission_error"}}),
        )),
        result: "forbidden",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_open_reads_are_gets_the_rest_changes() {
        assert_eq!(need(&Method::GET, "/livez"), Need::Open);
        assert_eq!(need(&Method::GET, "/readyz"), Need::Open);
        assert_eq!(need(&Method::GET, "/console/app.js"), Need::Open);
        assert_eq!(need(&Method::POST, "/console/"), Need::Change);
        assert_eq!(need(&Method::GET, "/slots"), Need::Read);
        assert_eq!(need(&Method::HEAD, "/metrics"), Need::Read);
        assert_eq!(need(&Method::POST, "/slots/0"), Need::Change);
        assert_eq!(need(&Method::DELETE, "/models"), Need::Change);
    }

    #[test]
    fn the_bearer_is_read_in_any_case_and_nothing_else_counts() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(bearer(&with("Bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(&with("bearer  abc ")), Some(&b"abc"[..]));
        assert_eq!(bearer(&with("Bearer ")), Some(&b""[..]));
        assert_eq!(bearer(&with("Basic abc")), None);
        assert_eq!(bearer(&with("abc")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
