//! llama-server's router mode (started without `-m`, with `--models-dir` or `--models-preset`): one
//! child llama-server per model, each request routed by its body's `model`. Known from `/props`
//! (`"role": "router"`); its models, their aliases and states (`unloaded`, `loading`, `loaded`,
//! `sleeping`, `failed`) from `GET /models`, read whenever the router is probed healthy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};

use super::Control;

/// Longest wait for `/models`.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);

/// One model the router can serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub id: String,
    pub aliases: Vec<String>,
    /// `unloaded`, `loading`, `loaded`, `sleeping`, `downloading`, ...
    pub status: String,
    /// Its last load failed (with this exit code, when the router says).
    pub failed: bool,
    pub exit_code: Option<i64>,
    /// What its own `/props` says once it is loaded: its slots and each slot's context.
    pub slots: Option<u64>,
    pub n_ctx: Option<u64>,
    /// The command line the router starts its child with (`status.args`, the binary first).
    pub args: Vec<String>,
}

impl Model {
    fn from_json(v: &Value) -> Option<Model> {
        let status = &v["status"];
        Some(Model {
            id: v["id"].as_str()?.to_owned(),
            aliases: strings(&v["aliases"]),
            status: status["value"].as_str().unwrap_or("unknown").to_owned(),
            failed: status["failed"].as_bool().unwrap_or(false),
            exit_code: status["exit_code"].as_i64(),
            slots: None,
            n_ctx: None,
            args: strings(&status["args"]),
        })
    }

    /// Its child runs (or is starting): what counts against `--models-max`.
    pub fn is_running(&self) -> bool {
        matches!(self.status.as_str(), "loaded" | "loading" | "sleeping")
    }

    /// Its child takes requests (a sleeping one wakes for the next).
    pub fn is_ready(&self) -> bool {
        matches!(self.status.as_str(), "loaded" | "sleeping")
    }

    /// The threads its child decodes with (`-t`), when its command line says.
    pub fn threads(&self) -> Option<u64> {
        let at = self
            .args
            .iter()
            .position(|a| a == "-t" || a == "--threads")?;
        self.args.get(at + 1)?.parse().ok()
    }

    fn answers_to(&self, name: &str) -> bool {
        self.id == name || self.aliases.iter().any(|a| a == name)
    }
}

#[derive(Default)]
pub struct Router {
    /// `/props` said `"role": "router"`.
    on: AtomicBool,
    state: Mutex<RouterState>,
}

#[derive(Default)]
struct RouterState {
    /// `max_instances` in `/props` (`--models-max`; 0: no limit).
    max_instances: Option<u64>,
    /// `models_autoload` in `/props` is false (`--no-models-autoload`): the router loads a model
    /// only when asked to, never for a request.
    no_autoload: bool,
    /// `None` until `/models` has been read.
    models: Option<Vec<Model>>,
}

/// Whether a request's model is one the router serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    Yes,
    /// Not among these (the router's ids).
    No(Vec<String>),
    /// The list has not been read: the router decides.
    Unknown,
}

impl Router {
    /// Whether the upstream is a router.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RouterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What `/props` says: a router or not, and its `max_instances`.
    pub fn learn_props(&self, props: &Value) {
        let router = props["role"].as_str() == Some("router");
        if router != self.on.swap(router, Ordering::Relaxed) {
            match router {
                true => tracing::info!(
                    max_instances = props["max_instances"].as_u64(),
                    "llama-server runs in router mode: requests are routed by their model"
                ),
                false => tracing::info!("llama-server serves one model (not a router)"),
            }
        }
        let mut st = self.lock();
        st.max_instances = props["max_instances"].as_u64();
        st.no_autoload = props["models_autoload"].as_bool() == Some(false);
        if !router {
            st.models = None;
        }
    }

    /// Reads the router's `/models`. Keeps the last list when it cannot.
    pub async fn refresh(&self, server: &dyn Control) {
        if !self.is_on() {
            return;
        }
        let listed = match server
            .json(Method::GET, "/models", None, MODELS_TIMEOUT)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "GET /models failed; the router's model list is unchanged");
                return;
            }
        };
        let Some(data) = listed["data"].as_array() else {
            return;
        };
        let mut models: Vec<Model> = data.iter().filter_map(Model::from_json).collect();
        // A loaded model's slots and context, from its own `/props`: kept while it stays loaded,
        // read once when it is newly so. Only for a loaded one: `/props?model=` loads a model that
        // is not.
        let before = self.lock().models.clone().unwrap_or_default();
        for m in models.iter_mut().filter(|m| m.status == "loaded") {
            if let Some(old) = before.iter().find(|o| o.id == m.id && o.slots.is_some()) {
                (m.slots, m.n_ctx) = (old.slots, old.n_ctx);
                continue;
            }
            let path = format!("/props?model={}&autoload=false", query_escape(&m.id));
            if let Ok(props) = server.json(Method::GET, &path, None, MODELS_TIMEOUT).await {
                m.slots = props["total_slots"].as_u64().filter(|n| *n > 0);
                m.n_ctx = props["default_generation_settings"]["n_ctx"]
                    .as_u64()
                    .filter(|n| *n > 0);
                tracing::info!(model = %m.id, slots = m.slots, n_ctx_slot = m.n_ctx, "router model loaded");
            }
        }
        self.lock().models = Some(models);
    }

    /// Whether the router serves `name` (an id or an alias), by the list last read.
    pub fn knows(&self, name: &str) -> Known {
        let st = self.lock();
        match &st.models {
            None => Known::Unknown,
            Some(models) if models.iter().any(|m| m.answers_to(name)) => Known::Yes,
            Some(models) => Known::No(models.iter().map(|m| m.id.clone()).collect()),
        }
    }

    /// The id of the model `name` names (an id or an alias), by the list last read.
    pub fn resolve(&self, name: &str) -> Option<String> {
        let st = self.lock();
        let models = st.models.as_ref()?;
        models
            .iter()
            .find(|m| m.id == name)
            .or_else(|| models.iter().find(|m| m.answers_to(name)))
            .map(|m| m.id.clone())
    }

    /// The model `id`, as last read.
    pub fn model(&self, id: &str) -> Option<Model> {
        let st = self.lock();
        st.models.as_ref()?.iter().find(|m| m.id == id).cloned()
    }

    /// Every model, as last read.
    pub fn models(&self) -> Vec<Model> {
        self.lock().models.clone().unwrap_or_default()
    }

    /// Whether the router loads a request's model for it: as the request's `?autoload=` asks,
    /// else by its `--models-autoload` (on by default).
    pub fn autoloads(&self, asked: Option<bool>) -> bool {
        asked.unwrap_or_else(|| !self.lock().no_autoload)
    }

    /// `--models-max` (`None` or 0: no limit).
    pub fn max_instances(&self) -> Option<u64> {
        self.lock().max_instances.filter(|n| *n > 0)
    }

    /// For `/status` and `/live`: the models and their states; `null` when not a router.
    pub fn status(&self) -> Value {
        if !self.is_on() {
            return Value::Null;
        }
        let st = self.lock();
        let models: Vec<Value> = st
            .models
            .iter()
            .flatten()
            .map(|m| {
                json!({
                    "id": m.id,
                    "aliases": m.aliases,
                    "status": m.status,
                    "failed": m.failed,
                    "exit_code": m.exit_code,
                    "slots": m.slots,
                    "n_ctx_slot": m.n_ctx,
                })
            })
            .collect();
        json!({ "max_instances": st.max_instances, "models": models })
    }
}

/// The strings of a JSON array (none when it is not one).
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `s` as a URL query value: everything but RFC 3986's unreserved characters percent-encoded.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routers_models_are_read_with_their_aliases_and_states() {
        let r = Router::default();
        assert_eq!(r.knows("a"), Known::Unknown);
        assert_eq!(r.status(), Value::Null);
        r.learn_props(&json!({"role": "router", "max_instances": 2}));
        assert!(r.is_on());
        let listed = json!({"data": [
            {"id": "alpha", "aliases": ["a"], "status": {"value": "loaded"}},
            {"id": "beta", "status": {"value": "unloaded", "failed": true, "exit_code": 1}}
        ]});
        let models: Vec<Model> = listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Model::from_json)
            .collect();
        r.lock().models = Some(models);
        assert_eq!(r.knows("alpha"), Known::Yes);
        assert_eq!(r.knows("a"), Known::Yes);
        assert_eq!(
            r.knows("gamma"),
            Known::No(vec!["alpha".into(), "beta".into()])
        );
        let s = r.status();
        assert_eq!(s["max_instances"], 2);
        assert_eq!(s["models"][1]["failed"], true);
        assert_eq!(s["models"][1]["exit_code"], 1);
        assert_eq!(
            query_escape("ggml-org/gemma-3:Q4_K_M"),
            "ggml-org%2Fgemma-3%3AQ4_K_M"
        );
        // A server that is no router again: nothing is known of models.
        r.learn_props(&json!({"total_slots": 2}));
        assert_eq!((r.is_on(), r.knows("alpha")), (false, Known::Unknown));
    }
}
