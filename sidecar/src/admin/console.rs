//! The console: the operator's web page on the admin listener (docs/console.md). Its files are
//! compiled into the binary (`sidecar/console/`) and hold no data, so they are served without a
//! token; every figure the page shows comes from the JSON routes beside it (`/live`, `/keys`,
//! `/quotas`, `/usage`), called with the token the operator typed. Each answer carries a strict
//! Content-Security-Policy (nothing inline, nothing from elsewhere) and an ETag of its bytes.

use std::sync::OnceLock;

use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use sha2::{Digest, Sha256};

use crate::respond::{self, Body};

/// Where the page is; `/` and `/console` lead there.
pub const HOME: &str = "/console/";

/// What the browser may load and run: this listener's own files only, no inline script or
/// style, no plug-ins, no framing, no form posted anywhere.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";
const TEXT: &str = "text/plain; charset=utf-8";

struct Asset {
    /// Its path under [`HOME`].
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset {
            name: $name,
            content_type: $type,
            bytes: include_bytes!(concat!("../../console/", $name)),
        }
    };
}

/// Every file the page loads. uPlot is vendored unchanged from npm, with its licence
/// (`vendor/uplot/SOURCE.md` says from where).
const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("console.css", CSS),
    asset!("favicon.svg", SVG),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("live.js", JS),
    asset!("keys.js", JS),
    asset!("quotas.js", JS),
    asset!("usage.js", JS),
    asset!("vendor/uplot/uPlot.iife.min.js", JS),
    asset!("vendor/uplot/uPlot.min.css", CSS),
    asset!("vendor/uplot/LICENSE", TEXT),
];

/// Whether `path` is the console's: `/`, `/console` and everything under [`HOME`].
pub fn serves(path: &str) -> bool {
    path == "/" || path == "/console" || path.starts_with(HOME)
}

/// One request for the console (`serves(path)` holds).
pub fn serve(method: &Method, path: &str, headers: &HeaderMap) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        let mut resp = respond::text(405, "the console is GET only\n");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return secured(resp);
    }
    let name = match path.strip_prefix(HOME) {
        Some("") => "index.html",
        Some(name) => name,
        None => {
            let mut resp = respond::text(307, "");
            resp.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static(HOME));
            return secured(resp);
        }
    };
    let Some((i, asset)) = ASSETS.iter().enumerate().find(|(_, a)| a.name == name) else {
        return secured(respond::text(404, "no such console file\n"));
    };
    let etag = &etags()[i];
    let fresh = still_fresh(headers, etag);
    let mut resp = match (fresh, method == Method::HEAD) {
        (true, _) => {
            let mut r = Response::new(respond::full(""));
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            r
        }
        (false, true) => {
            let mut r = Response::new(respond::full(""));
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, asset.bytes.len().into());
            r
        }
        (false, false) => Response::new(respond::full(asset.bytes)),
    };
    let h = resp.headers_mut();
    h.insert(header::ETAG, etag.clone());
    // Always asked again, answered 304 while the bytes are the same: a new binary is never
    // served stale, and an unchanged page costs a round trip per file.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if !fresh {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
    }
    secured(resp)
}

/// Whether the browser's copy is this one: `If-None-Match` names `etag` (weak or strong) or `*`.
fn still_fresh(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let etag = etag.to_str().unwrap_or_default();
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == etag)
}

/// Each asset's ETag, the start of its SHA-256, computed once.
fn etags() -> &'static [HeaderValue] {
    static ETAGS: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let digest = Sha256::digest(a.bytes);
                let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
                HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a header value")
            })
            .collect()
    })
}

/// The headers every console answer carries, whatever its status.
fn secured(mut resp: Response<Body>) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_page_names_is_served() {
        for a in ASSETS.iter().filter(|a| !a.name.starts_with("vendor/")) {
            assert!(!a.bytes.is_empty(), "{} is empty", a.name);
            let text = std::str::from_utf8(a.bytes).unwrap();
            for quoted in text.split(['"', '\'', '`']) {
                let named = [".js", ".css", ".svg"].iter().any(|e| quoted.ends_with(e))
                    && !quoted.contains(char::is_whitespace);
                if named {
                    let name = quoted.trim_start_matches("./").trim_start_matches(HOME);
                    assert!(
                        ASSETS.iter().any(|a| a.name == name),
                        "{} names {quoted}, which is not served",
                        a.name
                    );
                }
            }
        }
    }

    #[test]
    fn a_copy_is_fresh_when_its_tag_is_named_weak_strong_or_star() {
        let tag = HeaderValue::from_static("\"abc\"");
        let asked = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::IF_NONE_MATCH, v.parse().unwrap());
            still_fresh(&h, &tag)
        };
        assert!(asked("\"abc\""));
        assert!(asked("W/\"abc\""));
        assert!(asked("\"x\", \"abc\""));
        assert!(asked("*"));
        assert!(!asked("\"abcd\""));
        assert!(!asked("abc"));
        assert!(!still_fresh(&HeaderMap::new(), &tag));
    }

    #[test]
    fn nothing_is_inline_or_from_elsewhere() {
        for a in ASSETS.iter().filter(|a| !a.name.starts_with("vendor/")) {
            let text = std::str::from_utf8(a.bytes).unwrap();
            for banned in ["http://", "https://", "innerHTML", "eval(", "localStorage"] {
                // The SVG's namespace is a name, not a place loaded from.
                if a.content_type == SVG && banned == "http://" {
                    continue;
                }
                assert!(!text.contains(banned), "{} has {banned}", a.name);
            }
        }
        let index = std::str::from_utf8(ASSETS[0].bytes).unwrap();
        assert!(!index.contains("<script>") && !index.contains("style="));
    }
}
