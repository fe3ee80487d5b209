//! The admin listener's own routes, one row each: method, path (`{name}` matches one segment),
//! what the route asks of its caller, and what serves it. The dispatcher (`admin::serve`) and the
//! token check read this table, and docs/openapi.json is held equal to it (`openapi`'s tests),
//! so a route added here is one line and cannot go undocumented. llama-server's whole-server
//! routes, forwarded, are not here: they are `pipeline::routes::ROUTES`'s `Admin` rows.

use http::Method;

use super::auth::Need;

/// What serves a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    Metrics,
    Livez,
    Readyz,
    Status,
    Live,
    Usage,
    Quotas,
    /// `POST /quotas/{set,top-up,reset,grant}`: `quotas::change` reads which from the path.
    QuotaChange,
    Keys,
    Key,
    KeyCreate,
    KeyRevoke,
    KeyRotate,
    OpenApi,
}

impl Serve {
    /// Whether its calls change something, and so are audited (refusals included).
    pub fn audited(self) -> bool {
        matches!(
            self,
            Serve::QuotaChange | Serve::KeyCreate | Serve::KeyRevoke | Serve::KeyRotate
        )
    }
}

pub struct Route {
    /// `GET` routes answer `HEAD` too.
    pub method: &'static str,
    pub path: &'static str,
    pub need: Need,
    pub serve: Serve,
}

const fn r(method: &'static str, path: &'static str, need: Need, serve: Serve) -> Route {
    Route {
        method,
        path,
        need,
        serve,
    }
}

use Need::{Change, Open, Read};

pub const ROUTES: &[Route] = &[
    r("GET", "/metrics", Read, Serve::Metrics),
    r("GET", "/livez", Open, Serve::Livez),
    r("GET", "/readyz", Open, Serve::Readyz),
    r("GET", "/status", Read, Serve::Status),
    r("GET", "/live", Read, Serve::Live),
    r("GET", "/usage", Read, Serve::Usage),
    r("GET", "/quotas", Read, Serve::Quotas),
    r("POST", "/quotas/set", Change, Serve::QuotaChange),
    r("POST", "/quotas/top-up", Change, Serve::QuotaChange),
    r("POST", "/quotas/reset", Change, Serve::QuotaChange),
    r("POST", "/quotas/grant", Change, Serve::QuotaChange),
    // Who holds which key is the admin token's alone to see: reading them is `Change` too.
    r("GET", "/keys", Change, Serve::Keys),
    r("POST", "/keys", Change, Serve::KeyCreate),
    r("GET", "/keys/{id}", Change, Serve::Key),
    r("POST", "/keys/{id}/revoke", Change, Serve::KeyRevoke),
    r("POST", "/keys/{id}/rotate", Change, Serve::KeyRotate),
    r("GET", "/openapi.json", Read, Serve::OpenApi),
];

/// What the table says of `method path`.
pub enum Found<'p> {
    /// The route, and the value of its `{name}` segment if it has one.
    Route(&'static Route, Option<&'p str>),
    /// A route's path, with another method: what the path's routes take (for `Allow`).
    OtherMethod(Vec<&'static str>),
    None,
}

pub fn find<'p>(method: &Method, path: &'p str) -> Found<'p> {
    let method = match *method {
        Method::HEAD => "GET",
        ref m => m.as_str(),
    };
    let mut allowed = Vec::new();
    for route in ROUTES {
        if let Some(param) = matches(route.path, path) {
            if route.method == method {
                return Found::Route(route, param);
            }
            allowed.push(route.method);
        }
    }
    match allowed.is_empty() {
        true => Found::None,
        false => Found::OtherMethod(allowed),
    }
}

/// Whether `pattern` matches `path`: `Some` with its `{name}` segment's value (never empty).
fn matches<'p>(pattern: &str, path: &'p str) -> Option<Option<&'p str>> {
    let (mut p, mut q) = (pattern.split('/'), path.split('/'));
    let mut param = None;
    loop {
        match (p.next(), q.next()) {
            (None, None) => return Some(param),
            (Some(a), Some(b)) if a.starts_with('{') && !b.is_empty() => param = Some(b),
            (Some(a), Some(b)) if a == b => {}
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(method: Method, path: &str) -> Option<(Serve, Option<&str>)> {
        match find(&method, path) {
            Found::Route(r, p) => Some((r.serve, p)),
            _ => None,
        }
    }

    #[test]
    fn paths_and_their_one_parameter_are_found() {
        assert_eq!(found(Method::GET, "/status"), Some((Serve::Status, None)));
        assert_eq!(
            found(Method::HEAD, "/metrics"),
            Some((Serve::Metrics, None))
        );
        assert_eq!(found(Method::GET, "/keys"), Some((Serve::Keys, None)));
        assert_eq!(found(Method::POST, "/keys"), Some((Serve::KeyCreate, None)));
        assert_eq!(
            found(Method::GET, "/keys/3f9c0a1b2c4d"),
            Some((Serve::Key, Some("3f9c0a1b2c4d")))
        );
        assert_eq!(
            found(Method::POST, "/keys/3f9c/rotate"),
            Some((Serve::KeyRotate, Some("3f9c")))
        );
        assert_eq!(found(Method::GET, "/keys/"), None);
        assert_eq!(found(Method::POST, "/keys/a/b/c"), None);
        assert_eq!(found(Method::POST, "/quotas/nope"), None);
        assert!(matches!(
            find(&Method::POST, "/status"),
            Found::OtherMethod(m) if m == ["GET"]
        ));
        assert!(matches!(
            find(&Method::DELETE, "/keys"),
            Found::OtherMethod(m) if m == ["GET", "POST"]
        ));
        assert!(matches!(find(&Method::GET, "/slots"), Found::None));
    }

    #[test]
    fn every_route_is_unique_and_probes_alone_are_open() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} twice",
                    a.method,
                    a.path
                );
            }
            // A change never rides on a read's need.
            assert!(
                a.method == "GET" || a.need == Change,
                "{} {}",
                a.method,
                a.path
            );
            assert_eq!(
                a.need == Open,
                matches!(a.serve, Serve::Livez | Serve::Readyz),
                "{}",
                a.path
            );
        }
    }
}
