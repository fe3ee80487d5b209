//! llama-server's router mode, in one room: the router's model list (`catalog`), a pool per model
//! with its loads and evictions (`models`), and the turns the models take while their threads
//! oversubscribe the CPUs (`turns`).
//!
//! The pipeline uses it through [`Models`] (a request's model's [`Pool`], waiting for it to be
//! loaded) and [`Router`] (whether a name is served, [`Known`]); the upstream keeps the [`Router`]
//! current from `/props` and `/models`. It reaches llama-server only through [`Control`], which
//! the upstream's client implements, so it imports neither the pipeline nor the upstream.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::Method;
use serde_json::Value;

mod catalog;
mod models;
mod turns;

pub use catalog::{Known, Model, Router};
pub use models::{Defaults, Models, Pool};
pub use turns::Turns;

/// A JSON answer from llama-server, or why there is none.
pub type Answer<'a> = Pin<Box<dyn Future<Output = Result<Value, String>> + Send + 'a>>;

/// What router mode says to llama-server: `GET /models`, `GET /props?model=`, `POST
/// /models/load` and `/models/unload`, each a JSON exchange with slotgate's own key.
pub trait Control: Send + Sync + 'static {
    /// Sends `body` (if any) to `path` and reads the answer as JSON, within `timeout`.
    fn json<'a>(
        &'a self,
        method: Method,
        path: &'a str,
        body: Option<&'a Value>,
        timeout: Duration,
    ) -> Answer<'a>;
}
