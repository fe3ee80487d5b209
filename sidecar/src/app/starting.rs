//! The start while the policies compile (a Python or JavaScript policy takes seconds): the
//! listeners are bound and served at once, and until the `App` exists every client request is
//! answered 503 `starting` with Retry-After in its API's shape, `/health` as llama-server answers
//! while it loads, and the admin listener's `/readyz` says not ready. A client sees a server
//! starting up, not a refused connection.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use http::{HeaderValue, Method, Request, Response};
use hyper::body::Incoming;

use crate::error::GateError;
use crate::pipeline::routes::{self, Handling};
use crate::respond::{self, Body};
use crate::state::App;

/// The `App` once the start is done, and until then what the start is doing.
#[derive(Default)]
pub struct Starting {
    app: OnceLock<Arc<App>>,
    doing: Mutex<String>,
}

impl Starting {
    pub fn new() -> Arc<Starting> {
        let s = Arc::new(Starting::default());
        s.doing("reading its state");
        s
    }

    /// What the start is doing now, as the answers say it ("compiling policy `guard`").
    pub fn doing(&self, what: &str) {
        *self.doing.lock().unwrap_or_else(PoisonError::into_inner) = what.to_owned();
    }

    /// The start is done: every request from now on is served by `app`.
    pub fn ready(&self, app: Arc<App>) {
        let _ = self.app.set(app);
    }

    fn refusal(&self) -> GateError {
        GateError::Starting {
            doing: self
                .doing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    /// The `App`, once the start is done. One atomic load: what each request pays for this.
    pub fn app(&self) -> Option<&Arc<App>> {
        self.app.get()
    }

    /// A client request before the start is done: `/health` as llama-server answers while it
    /// loads, anything else 503 `starting` in the shape of the route's API.
    pub fn client_answer(&self, req: &Request<Incoming>) -> Response<Body> {
        let found = routes::find(req.method(), req.uri().path());
        if let Ok(Handling::Health) = found {
            return respond::loading();
        }
        let dialect = match found {
            Ok(Handling::Slot(d)) => Some(d),
            _ => None,
        };
        let mut resp = respond::error(&self.refusal(), dialect);
        resp.headers_mut().insert(
            crate::pipeline::REASON_HEADER,
            HeaderValue::from_static("starting"),
        );
        resp
    }

    /// An admin request before the start is done: `/livez` is live, `/readyz` not ready,
    /// anything else 503 `starting`.
    pub fn admin_answer(&self, req: &Request<Incoming>) -> Response<Body> {
        match (req.method(), req.uri().path()) {
            (&Method::GET, "/livez") => respond::text(200, "ok\n"),
            (&Method::GET, "/readyz") => respond::text(503, "not ready: starting\n"),
            _ => respond::error(&self.refusal(), None),
        }
    }
}
