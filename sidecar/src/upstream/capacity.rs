//! What llama-server can hold: how many slots, each slot's context, whether the slots share one KV
//! pool and its size, and the server's default output bound. Read from `GET /props` (`total_slots`,
//! `default_generation_settings.n_ctx`) whenever llama-server becomes ready. `/props` does not say
//! whether the pool is shared (llama-server's default without `-np`, where each slot reports the
//! whole pool as its `n_ctx`), so that comes from llama-server's command line: the one `slotgate
//! wrap` runs, or the one of the process behind the upstream socket on this host. When neither can
//! be seen slotgate assumes a shared pool of one slot's context (a wrong guess then queues, never
//! fails), and says so. `--kv-pool` overrides what was learned, with a warning where they differ.

use std::sync::Mutex;
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};

use crate::admission::SlotContext;
use crate::config::launch::{KvLayout, Launch};
use crate::config::KvPool;
use crate::upstream::process;
use crate::upstream::Upstream;

/// Longest wait for `/props`.
const PROPS_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the pool layout in force comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Setting,
    Wrapped,
    Process(u32),
    Assumed,
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Setting => "--kv-pool".into(),
            Source::Wrapped => "the command line slotgate wrap runs".into(),
            Source::Process(pid) => format!("llama-server's command line (pid {pid})"),
            Source::Assumed => {
                "assumed: llama-server's command line is not visible from here; set --kv-pool"
                    .into()
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Learned {
    total_slots: Option<usize>,
    n_ctx: Option<u64>,
    default_n_predict: Option<u64>,
    /// In force, and where from.
    layout: Option<(KvLayout, Source)>,
    /// What llama-server's command line says, when it could be read (for a mismatch warning).
    seen: Option<(KvLayout, Source)>,
    /// The pool in force last time (a change is logged once).
    logged: Option<Option<u64>>,
    /// The model it serves (`model_alias` in `/props`: its `--alias`, else its file's name).
    model: Option<String>,
}

pub struct Capacity {
    upstream: Upstream,
    /// llama-server's router mode, when `/props` says so, and its models.
    pub router: std::sync::Arc<crate::router::Router>,
    setting: KvPool,
    /// The command line of the llama-server `slotgate wrap` runs.
    wrapped: Option<Launch>,
    learned: Mutex<Learned>,
}

impl Capacity {
    pub fn new(upstream: Upstream, setting: KvPool, wrapped: Option<Launch>) -> Self {
        Capacity {
            router: Default::default(),
            upstream,
            setting,
            wrapped,
            learned: Mutex::new(Learned::default()),
        }
    }

    /// The slot context, once `/props` has answered.
    pub fn slot_context(&self) -> Option<SlotContext> {
        self.now().0
    }

    /// The slot context and llama-server's slot count, as known now (one look, for a request).
    pub fn now(&self) -> (Option<SlotContext>, Option<usize>) {
        let l = self.lock();
        let ctx = l.n_ctx.map(|n_ctx| SlotContext {
            n_ctx,
            default_n_predict: l.default_n_predict,
            pool: pool_of(&l),
        });
        (ctx, l.total_slots)
    }

    /// How many slots llama-server has (`total_slots` in `/props`), once it has said.
    pub fn upstream_slots(&self) -> Option<usize> {
        self.lock().total_slots
    }

    /// Reads `/props` and how the pool is laid out. Cheap; after every readiness change.
    pub async fn refresh(&self) {
        let props = match self
            .upstream
            .json(Method::GET, "/props", None, PROPS_TIMEOUT)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "GET /props failed; slot context unknown");
                return;
            }
        };
        self.router.learn_props(&props);
        self.router.refresh(&self.upstream).await;
        let settings = &props["default_generation_settings"];
        let n_ctx = settings["n_ctx"].as_u64().filter(|&n| n > 0);
        let n_predict = settings["params"]["n_predict"]
            .as_i64()
            .filter(|&n| n > 0)
            .map(|n| n as u64);
        let model = props["model_alias"]
            .as_str()
            .filter(|m| !m.is_empty())
            .map(str::to_owned);
        let total_slots = props["total_slots"]
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize);
        let line = self.command_line().await;
        // `/props` reports a request's defaults, not the server's `-n` (its `params` are a fresh
        // task's, n_predict -1): the command line, when it can be read, says it.
        let n_predict = n_predict.or(line.as_ref().and_then(|(_, _, n)| *n));
        let seen = line.map(|(layout, source, _)| (layout, source));
        let mut l = self.lock();
        l.model = model;
        if l.n_ctx != n_ctx {
            tracing::info!(
                n_ctx_slot = n_ctx,
                default_n_predict = n_predict,
                "upstream slot context"
            );
        }
        l.n_ctx = n_ctx;
        l.default_n_predict = n_predict;
        l.total_slots = total_slots;
        l.layout = Some(match (self.setting, &seen) {
            (KvPool::PerSlot, _) => (KvLayout::PerSlot, Source::Setting),
            (KvPool::Tokens(n), _) => (KvLayout::Shared(n), Source::Setting),
            (KvPool::Auto, Some(seen)) => seen.clone(),
            (KvPool::Auto, None) => (KvLayout::SharedAsSlot, Source::Assumed),
        });
        l.seen = seen;
        let pool = pool_of(&l);
        if l.logged != Some(pool) {
            l.logged = Some(pool);
            let source = l
                .layout
                .as_ref()
                .map(|(_, s)| s.describe())
                .unwrap_or_default();
            match pool {
                Some(tokens) => tracing::info!(
                    kv_pool_tokens = tokens,
                    source = %source,
                    "llama-server's slots share one KV pool: requests are admitted while their reservations fit it"
                ),
                None => {
                    tracing::info!(source = %source, "each llama-server slot has a context of its own")
                }
            }
            if let Some(why) = mismatch(&l) {
                tracing::warn!("--kv-pool differs from llama-server's command line: {why}");
            }
            if l.layout
                .as_ref()
                .is_some_and(|(_, s)| *s == Source::Assumed)
            {
                tracing::warn!(
                    "cannot see llama-server's command line (another host or container): assuming its slots share one KV pool of one slot's context ({} tokens); if it runs with -np N and no --kv-unified, set --kv-pool per-slot",
                    n_ctx.unwrap_or(0)
                );
            }
        }
    }

    /// The pool layout llama-server's own command line gives, where it can be read.
    async fn command_line(&self) -> Option<(KvLayout, Source, Option<u64>)> {
        if let Some(l) = &self.wrapped {
            return Some((l.kv_layout(), Source::Wrapped, l.predict()));
        }
        let process = process::find(self.upstream.target()).await?;
        if !process.is_llama_server() {
            return None;
        }
        let env = process.env.clone().unwrap_or_default();
        let launch = Launch::parse(&process.argv, |k| env.get(k).cloned());
        Some((
            launch.kv_layout(),
            Source::Process(process.pid),
            launch.predict(),
        ))
    }

    /// For `/status`.
    pub fn status(&self, reserved: u64) -> Value {
        let l = self.lock();
        let layout = l.layout.as_ref();
        json!({
            "configured": self.setting.to_string(),
            "shared": layout.map(|(k, _)| *k != KvLayout::PerSlot),
            "tokens": pool_of(&l),
            "n_ctx_slot": l.n_ctx,
            "default_n_predict": l.default_n_predict,
            "source": layout.map(|(_, s)| s.describe()),
            "mismatch": mismatch(&l),
            "reserved_tokens": reserved,
        })
    }

    /// The model llama-server serves (not a router), once `/props` has said.
    pub fn served_model(&self) -> Option<String> {
        self.lock().model.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The pool in force, in tokens: `None` for a context per slot (or before `/props`).
fn pool_of(l: &Learned) -> Option<u64> {
    match l.layout.as_ref()?.0 {
        KvLayout::PerSlot => None,
        KvLayout::Shared(n) => Some(n),
        KvLayout::SharedAsSlot => l.n_ctx,
    }
}

/// How a `--kv-pool` setting differs from what llama-server's command line says.
fn mismatch(l: &Learned) -> Option<String> {
    let ((set, Source::Setting), Some((seen, source))) = (l.layout.as_ref()?, l.seen.as_ref())
    else {
        return None;
    };
    let tokens = |k: &KvLayout| match k {
        KvLayout::PerSlot => None,
        KvLayout::Shared(n) => Some(*n),
        KvLayout::SharedAsSlot => l.n_ctx,
    };
    let (a, b) = (tokens(set), tokens(seen));
    let say = |t: Option<u64>| {
        t.map_or("a context per slot".to_owned(), |n| {
            format!("one pool of {n} tokens")
        })
    };
    (a != b).then(|| {
        format!(
            "slotgate admits by {}, {} says {}{}",
            say(a),
            source.describe(),
            say(b),
            match (a, b) {
                (None, Some(_)) => ": requests may together exhaust the shared pool, and llama-server then fails them all",
                _ => "",
            }
        )
    })
}
