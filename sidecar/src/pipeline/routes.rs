//! Every route llama-server registers (`tools/server/server.cpp` of the sdist), and how slotgate
//! handles each: admitted on the slots in its API's dialect, forwarded at once outside the slots,
//! answered by slotgate itself, served on the admin listener only, or refused because it acts on
//! the host. `tests/tests/llama/routes_source.rs` parses the source's route registrations and fails on a
//! route this table does not classify, so a new llama.cpp release cannot silently 404.

use http::Method;

use crate::dialect::{self, DialectRef};
use crate::error::GateError;

/// How a route is handled.
#[derive(Clone, Copy)]
pub enum Handling {
    /// Runs on llama-server's slots: admitted through the queue, in this API's dialect.
    Slot(DialectRef),
    /// Answered by llama-server outside its slots (counts, templates, model lists, static files):
    /// forwarded at once.
    Passthrough,
    /// Answered by slotgate from its own readiness, in llama-server's shape (`/health`).
    Health,
    /// Shows or changes the whole server (slot contents, adapters, loaded models, its metrics):
    /// refused on the client listener, forwarded from the admin listener.
    Admin,
    /// Acts on the host rather than the model (llama-server's built-in tools, its CORS proxy):
    /// refused unless `--forward-host-endpoints`.
    Host,
}

impl Handling {
    /// Its name in docs and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Handling::Slot(_) => "slot",
            Handling::Passthrough => "passthrough",
            Handling::Health => "health",
            Handling::Admin => "admin",
            Handling::Host => "host",
        }
    }
}

/// One route: a method and a path (a `:name` segment matches any one segment).
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub handling: Handling,
    /// The path has a `:name` segment (worked out once, at compile time).
    param: bool,
}

const fn r(method: &'static str, path: &'static str, handling: Handling) -> Route {
    let bytes = path.as_bytes();
    let mut i = 0;
    let mut param = false;
    while i < bytes.len() {
        param |= bytes[i] == b':';
        i += 1;
    }
    Route {
        method,
        path,
        handling,
        param,
    }
}

use dialect::{
    CHAT, COMPLETION, DECISION, EMBEDDINGS, INFILL, MESSAGES, OAI_COMPLETIONS, OAI_EMBEDDINGS,
    RERANK, RESPONSES, TRANSCRIPTION,
};
use Handling::{Admin, Health, Host, Passthrough, Slot};

/// The table, in the order of llama-server's own registrations.
pub const ROUTES: &[Route] = &[
    // Router mode (`--models-dir` without `-m`): loading and unloading models.
    r("POST", "/models", Admin),
    r("POST", "/models/load", Admin),
    r("POST", "/models/unload", Admin),
    r("GET", "/models/sse", Admin),
    r("DELETE", "/models", Admin),
    r("GET", "/health", Health),
    r("GET", "/v1/health", Health),
    r("GET", "/metrics", Admin),
    r("GET", "/props", Passthrough),
    r("POST", "/props", Admin),
    r("GET", "/models", Passthrough),
    r("GET", "/v1/models", Passthrough),
    r("POST", "/completion", Slot(COMPLETION)),
    r("POST", "/completions", Slot(COMPLETION)),
    r("POST", "/v1/completions", Slot(OAI_COMPLETIONS)),
    r("POST", "/chat/completions", Slot(CHAT)),
    r("POST", "/v1/chat/completions", Slot(CHAT)),
    // Ends a running completion's reasoning: acts on a live slot, takes none.
    r("POST", "/v1/chat/completions/control", Passthrough),
    r("POST", "/v1/responses", Slot(RESPONSES)),
    r("POST", "/responses", Slot(RESPONSES)),
    r("POST", "/v1/audio/transcriptions", Slot(TRANSCRIPTION)),
    r("POST", "/audio/transcriptions", Slot(TRANSCRIPTION)),
    r("POST", "/v1/messages", Slot(MESSAGES)),
    r("POST", "/infill", Slot(INFILL)),
    r("POST", "/embedding", Slot(EMBEDDINGS)),
    r("POST", "/embeddings", Slot(EMBEDDINGS)),
    r("POST", "/v1/embeddings", Slot(OAI_EMBEDDINGS)),
    r("POST", "/rerank", Slot(RERANK)),
    r("POST", "/reranking", Slot(RERANK)),
    r("POST", "/v1/rerank", Slot(RERANK)),
    r("POST", "/v1/reranking", Slot(RERANK)),
    r("POST", "/v1/systemone", Slot(DECISION)),
    r("POST", "/tokenize", Passthrough),
    r("POST", "/detokenize", Passthrough),
    r("POST", "/apply-template", Passthrough),
    r("POST", "/chat/completions/input_tokens", Passthrough),
    r("POST", "/v1/chat/completions/input_tokens", Passthrough),
    r("POST", "/responses/input_tokens", Passthrough),
    r("POST", "/v1/responses/input_tokens", Passthrough),
    r("POST", "/v1/messages/count_tokens", Passthrough),
    r("GET", "/lora-adapters", Admin),
    r("POST", "/lora-adapters", Admin),
    r("GET", "/slots", Admin),
    r("POST", "/slots/:id_slot", Admin),
    // Resumable streams (a request with `X-Conversation-Id`): reading or cancelling a session a
    // generation request, admitted on its slot, writes into.
    r("GET", "/v1/stream", Passthrough),
    r("POST", "/v1/streams/lookup", Passthrough),
    r("DELETE", "/v1/stream", Passthrough),
    r("GET", "/cors-proxy", Host),
    r("POST", "/cors-proxy", Host),
    r("GET", "/tools", Host),
    r("POST", "/tools", Host),
];

/// How slotgate handles `method path` on the client listener: the route's handling, `Passthrough`
/// for a CORS preflight (`OPTIONS`, which llama-server answers for any path without looking at a
/// key) and for the web UI's pages (`GET /` and files), else 404 or 405.
pub fn find(method: &Method, path: &str) -> Result<Handling, GateError> {
    if method == Method::OPTIONS {
        return Ok(Passthrough);
    }
    let mut path_known = false;
    for route in ROUTES {
        let found = match route.param {
            false => route.path == path,
            true => matches(route.path, path),
        };
        if found {
            if route.method == method.as_str() {
                return Ok(route.handling);
            }
            path_known = true;
        }
    }
    if !path_known && method == Method::GET && is_ui_file(path) {
        return Ok(Passthrough);
    }
    let (method, path) = (method.to_string(), path.to_owned());
    Err(match path_known {
        true => GateError::MethodNotAllowed { method, path },
        false => GateError::NotFound { method, path },
    })
}

/// What the client listener does with a route it found: llama-server's admin routes are served
/// only on the admin listener, the host's (`/tools`, `/cors-proxy`) only when forwarded on purpose.
pub fn allowed(
    found: Result<Handling, GateError>,
    method: &Method,
    path: &str,
    forward_host: bool,
) -> Result<Handling, GateError> {
    let named = || (method.to_string(), path.to_owned());
    match found? {
        Handling::Admin => {
            let (method, path) = named();
            Err(GateError::AdminOnly { method, path })
        }
        Handling::Host if !forward_host => {
            let (method, path) = named();
            Err(GateError::HostEndpoint { method, path })
        }
        h => Ok(h),
    }
}

/// The route `method path` matches in the table, if any.
pub fn lookup(method: &str, path: &str) -> Option<&'static Route> {
    ROUTES
        .iter()
        .find(|r| r.method == method && matches(r.path, path))
}

/// `GET /` and what looks like one of the web UI's static files (`/bundle.js`, `/favicon.ico`),
/// outside the API prefixes.
fn is_ui_file(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let last = path.rsplit('/').next().unwrap_or("");
    !path.starts_with("/v1/") && last.contains('.') && !last.starts_with('.')
}

/// Whether `pattern` (segments, `:name` matching any one) matches `path`.
fn matches(pattern: &str, path: &str) -> bool {
    let (mut p, mut q) = (pattern.split('/'), path.split('/'));
    loop {
        match (p.next(), q.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a.starts_with(':') && !b.is_empty() => {}
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handling(method: Method, path: &str) -> Result<&'static str, u16> {
        find(&method, path)
            .map(|h| h.label())
            .map_err(|e| e.status())
    }

    #[test]
    fn routes_are_classified() {
        assert_eq!(handling(Method::POST, "/v1/chat/completions"), Ok("slot"));
        assert_eq!(handling(Method::POST, "/v1/messages"), Ok("slot"));
        assert_eq!(
            handling(Method::POST, "/v1/messages/count_tokens"),
            Ok("passthrough")
        );
        assert_eq!(handling(Method::GET, "/health"), Ok("health"));
        assert_eq!(handling(Method::GET, "/slots"), Ok("admin"));
        assert_eq!(handling(Method::POST, "/slots/3"), Ok("admin"));
        assert_eq!(handling(Method::POST, "/slots/"), Err(404));
        assert_eq!(handling(Method::POST, "/tools"), Ok("host"));
        assert_eq!(handling(Method::OPTIONS, "/v1/messages"), Ok("passthrough"));
        assert_eq!(handling(Method::GET, "/"), Ok("passthrough"));
        assert_eq!(handling(Method::GET, "/bundle.js"), Ok("passthrough"));
        assert_eq!(handling(Method::GET, "/v1/chat/completions"), Err(405));
        assert_eq!(handling(Method::GET, "/nope"), Err(404));
        assert_eq!(handling(Method::POST, "/bundle.js"), Err(404));
    }

    #[test]
    fn docs_endpoints_lists_every_route_as_handled() {
        let doc = include_str!("../../../docs/endpoints.md");
        let listed: Vec<(String, String, String)> = doc
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let code = |c: &str| c.strip_prefix('`')?.strip_suffix('`').map(str::to_owned);
                Some((
                    code(cells.get(1)?)?,
                    code(cells.get(2)?)?,
                    (*cells.get(3)?).to_owned(),
                ))
            })
            .collect();
        let table: Vec<(String, String, String)> = ROUTES
            .iter()
            .map(|r| {
                (
                    r.method.to_owned(),
                    r.path.to_owned(),
                    r.handling.label().to_owned(),
                )
            })
            .collect();
        assert_eq!(listed, table, "docs/endpoints.md and ROUTES differ");
    }

    #[test]
    fn every_route_is_unique() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} twice",
                    a.method,
                    a.path
                );
            }
        }
    }
}
