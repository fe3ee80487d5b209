//! What `slotgate top` reads: the admin listener's `GET /live` (`live::schema`, the one type the
//! admin listener writes too; docs/live.md) and llama-server's own `GET /slots`, forwarded there.
//! Every field has a default, so a slotgate a version apart (a field added or gone) still shows
//! what both know.

use serde::Deserialize;

pub use crate::live::schema::{Live, ModelPool, Request, Tenant, Waiter};

/// Where a model behind the router stands: `loaded`, what its load is doing (`loading 2.1s`,
/// `waiting for room`), `failed` (retried in so long), or `unloaded`.
pub fn model_state(m: &ModelPool) -> String {
    let l = &m.load;
    if let Some(doing) = &l.doing {
        return match l.for_seconds {
            Some(s) => format!("{doing} {}", super::view::dur(s)),
            None => doing.clone(),
        };
    }
    if let (Some(_), Some(retry)) = (&l.error, l.retry_in_seconds) {
        return format!("failed, retry in {}", super::view::dur(retry));
    }
    match (m.admitting, l.error.is_some()) {
        (true, _) => "loaded".into(),
        (false, true) => "failed".into(),
        (false, false) => "unloaded".into(),
    }
}

/// One of llama-server's slots, as its `GET /slots` describes it (tools/server/server-context.cpp,
/// `server_slot::to_json`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct LlamaSlot {
    pub id: u64,
    pub n_ctx: u64,
    pub is_processing: bool,
    pub id_task: Option<i64>,
    pub n_prompt_tokens: Option<u64>,
    pub next_token: Vec<NextToken>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct NextToken {
    pub n_decoded: u64,
}

impl LlamaSlot {
    pub fn decoded(&self) -> u64 {
        self.next_token.first().map_or(0, |t| t.n_decoded)
    }
}

/// What one refresh brought.
#[derive(Debug, Clone)]
pub struct Picture {
    pub live: Live,
    /// llama-server's `/slots`, or why it could not be read (not ready, `--no-slots`, an older
    /// slotgate).
    pub llama_slots: Result<Vec<LlamaSlot>, String>,
}
