//! Every route llama-server registers (`tools/server/server.cpp` of the sdist), and how slotgate
//! handles each: admitted on the slots in its API's dialect, forwarded at once outside the slots,
//! answered by slotgate itself, served on the admin listener only, or refused because it acts on
//! the host. `tests/tests/llama/routes_source.rs` parses the source's route registrations and fails on a
//! route this table does not classify, so a new llama.cpp release cannot silently 404.

use http::Method;

use crate::config::{AdminRoutes, Config};
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
    /// Answered by slotgate from its own queue: its load, in the schema routers poll
    /// ([`LOADS_PATH`]). Not one of llama-server's routes.
    Loads,
    /// Answered by slotgate: the caller's own tenant, key and quotas ([`ME_PATH`]). Not one of
    /// llama-server's routes.
    Me,
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
            Handling::Loads => "loads",
            Handling::Me => "me",
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
    PREDICT, RERANK, RESPONSES, TRANSCRIPTION,
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

/// Vertex AI's routes, which llama-server registers beside the table's when its environment has
/// `AIP_MODE=PREDICTION` (`register_gcp_compat` in `server-http.cpp`): `POST` on
/// `AIP_PREDICT_ROUTE` (`/predict` unless set) runs a batch of requests to other routes on the
/// slots; `AIP_HEALTH_ROUTE`, when set, is `/health` under another name. slotgate reads the same
/// variables: Vertex sets them for the container, and a wrapped llama-server inherits slotgate's.
#[derive(Debug, PartialEq)]
pub struct Vertex {
    predict: String,
    health: Option<String>,
}

/// `GET` slotgate's load in the engine-native schema SGLang serves and SMG (the Shepherd Model
/// Gateway) polls for its load-aware policies (`pipeline::loads`,
/// docs/observability.md#load-polled-by-routers-v1loads).
pub use super::loads::PATH as LOADS_PATH;
/// `GET` the caller's own tenant, key and quotas (`pipeline::me`, docs/keys.md#what-a-caller-sees).
pub use super::me::PATH as ME_PATH;

/// slotgate's own routes on the client listener, none of them llama-server's; looked up before
/// [`ROUTES`], and described in docs/openapi.json (a test holds the two equal).
pub const OWN: &[Route] = &[
    r("GET", ME_PATH, Handling::Me),
    r("GET", LOADS_PATH, Handling::Loads),
];

/// The predict route's path when `AIP_PREDICT_ROUTE` is unset, as `server-http.cpp` has it.
pub const VERTEX_PREDICT_DEFAULT: &str = "/predict";

impl Vertex {
    /// The routes of slotgate's own environment, read once.
    pub fn get() -> Option<&'static Vertex> {
        static VERTEX: std::sync::OnceLock<Option<Vertex>> = std::sync::OnceLock::new();
        VERTEX
            .get_or_init(|| Vertex::from_env(|k| std::env::var(k).ok()))
            .as_ref()
    }

    /// As llama-server reads them: an empty variable is unset, a path gets its leading `/`.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Option<Vertex> {
        let var = |k: &str| {
            env(k)
                .filter(|v| !v.is_empty())
                .map(|v| match v.starts_with('/') {
                    true => v,
                    false => format!("/{v}"),
                })
        };
        (env("AIP_MODE").as_deref() == Some("PREDICTION")).then(|| Vertex {
            predict: var("AIP_PREDICT_ROUTE").unwrap_or_else(|| VERTEX_PREDICT_DEFAULT.into()),
            health: var("AIP_HEALTH_ROUTE"),
        })
    }

    /// How `method path` is handled, when the path is one of these routes.
    fn find(&self, method: &Method, path: &str) -> Option<Result<Handling, GateError>> {
        let (want, handling) = match path {
            p if p == self.predict => (Method::POST, Slot(PREDICT)),
            p if self.health.as_deref() == Some(p) => (Method::GET, Health),
            _ => return None,
        };
        Some(match *method == want {
            true => Ok(handling),
            false => Err(GateError::MethodNotAllowed {
                method: method.to_string(),
                path: path.to_owned(),
            }),
        })
    }
}

/// How slotgate handles `method path` on the client listener: the route's handling, `Passthrough`
/// for a CORS preflight (`OPTIONS`, which llama-server answers for any path without looking at a
/// key) and for the web UI's pages (`GET /` and files), else 404 or 405.
pub fn find(method: &Method, path: &str) -> Result<Handling, GateError> {
    if method == Method::OPTIONS {
        return Ok(Passthrough);
    }
    if let Some(found) = Vertex::get().and_then(|v| v.find(method, path)) {
        return found;
    }
    if let Some(own) = OWN.iter().find(|r| r.path == path) {
        return match own.method == method.as_str() {
            true => Ok(own.handling),
            false => Err(GateError::MethodNotAllowed {
                method: method.to_string(),
                path: path.to_owned(),
            }),
        };
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
/// only on the admin listener unless their group is in `client-admin-routes`, the host's (`/tools`,
/// `/cors-proxy`) only when forwarded on purpose (`forward-host-endpoints`); either, forwarded,
/// is a passthrough.
pub fn allowed(
    found: Result<Handling, GateError>,
    method: &Method,
    path: &str,
    config: &Config,
) -> Result<Handling, GateError> {
    let named = || (method.to_string(), path.to_owned());
    match found? {
        Handling::Admin
            if forwarded(
                config.client_admin_routes.as_deref().unwrap_or_default(),
                admin_group(path),
            ) =>
        {
            Ok(Handling::Passthrough)
        }
        Handling::Admin => {
            let (method, path) = named();
            Err(GateError::AdminOnly { method, path })
        }
        Handling::Host if !config.forward_host_endpoints => {
            let (method, path) = named();
            Err(GateError::HostEndpoint { method, path })
        }
        h => Ok(h),
    }
}

/// One of the router's own model routes (load, unload, download, delete, their events): it names
/// the model it acts on, not one it runs on.
pub fn manages_models(method: &Method, path: &str) -> bool {
    lookup(method.as_str(), path).is_some_and(|r| matches!(r.handling, Handling::Admin))
        && admin_group(path) == AdminRoutes::Models
}

/// Which group of `client-admin-routes` an admin route's `path` is in.
pub fn admin_group(path: &str) -> AdminRoutes {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    match first {
        "slots" => AdminRoutes::Slots,
        "metrics" => AdminRoutes::Metrics,
        "models" => AdminRoutes::Models,
        "lora-adapters" => AdminRoutes::LoraAdapters,
        "props" => AdminRoutes::Props,
        // An admin route of no group (none today): only `all` forwards it.
        _ => AdminRoutes::All,
    }
}

fn forwarded(groups: &[AdminRoutes], group: AdminRoutes) -> bool {
    groups.iter().any(|g| *g == AdminRoutes::All || *g == group)
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
        assert_eq!(handling(Method::GET, "/v1/loads"), Ok("loads"));
        assert_eq!(handling(Method::POST, "/v1/loads"), Err(405));
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
    fn vertex_routes_follow_llama_servers_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(Vertex::from_env(env(&[("AIP_PREDICT_ROUTE", "/p")])), None);
        let v = Vertex::from_env(env(&[("AIP_MODE", "PREDICTION")])).unwrap();
        let label = |m: Method, p: &str| {
            v.find(&m, p)
                .map(|f| f.map(|h| h.label()).map_err(|e| e.status()))
        };
        assert_eq!(label(Method::POST, "/predict"), Some(Ok("slot")));
        assert_eq!(label(Method::GET, "/predict"), Some(Err(405)));
        assert_eq!(label(Method::GET, "/health"), None);
        let v = Vertex::from_env(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_PREDICT_ROUTE", "v1/endpoints/e:predict"),
            ("AIP_HEALTH_ROUTE", "/ping"),
        ]))
        .unwrap();
        assert_eq!(v.predict, "/v1/endpoints/e:predict");
        assert_eq!(
            v.find(&Method::GET, "/ping").unwrap().unwrap().label(),
            "health"
        );
    }

    #[test]
    fn client_admin_routes_lift_one_group_each() {
        let config = |groups: &str| {
            let s = crate::config::Settings {
                client_admin_routes: Some(
                    groups
                        .split(',')
                        .filter(|g| !g.is_empty())
                        .map(|g| g.parse().unwrap())
                        .collect(),
                ),
                ..Default::default()
            };
            Config::from_settings(s).unwrap()
        };
        let label = |c: &Config, m: Method, p: &str| {
            allowed(find(&m, p), &m, p, c)
                .map(|h| h.label())
                .map_err(|e| e.status())
        };
        let none = config("");
        assert_eq!(label(&none, Method::GET, "/slots"), Err(403));
        assert_eq!(label(&none, Method::GET, "/metrics"), Err(403));
        let slots = config("slots");
        assert_eq!(label(&slots, Method::GET, "/slots"), Ok("passthrough"));
        assert_eq!(label(&slots, Method::POST, "/slots/0"), Ok("passthrough"));
        assert_eq!(label(&slots, Method::GET, "/metrics"), Err(403));
        assert_eq!(label(&slots, Method::POST, "/tools"), Err(403));
        let all = config("all");
        for r in ROUTES.iter().filter(|r| matches!(r.handling, Admin)) {
            let path = r.path.replace(":id_slot", "0");
            assert_ne!(
                admin_group(&path),
                AdminRoutes::All,
                "{} has no group",
                r.path
            );
            let m = Method::from_bytes(r.method.as_bytes()).unwrap();
            assert_eq!(
                label(&all, m, &path),
                Ok("passthrough"),
                "{} {}",
                r.method,
                r.path
            );
        }
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
