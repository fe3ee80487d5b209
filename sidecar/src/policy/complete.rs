//! `on_complete`: once a request is over, every policy that allowed it hears how it ended (status,
//! outcome, usage, cost), so what it took from a budget can be settled or given back.

use std::sync::Arc;

use slotgate_sdk::{Completion, Decision, RequestSummary, ABI_VERSION};

use super::{Chain, PolicySet};
use crate::dialect::usage::Usage;
use crate::error::Outcome;

/// What the policies' `on_complete` needs once the request is over.
pub struct CompletionHook {
    /// The chain version that decided the request.
    pub chain: Arc<Chain>,
    /// Each policy's own decision, in chain order.
    pub own: Vec<Option<Decision>>,
    /// For a turn to run policy code.
    pub policies: PolicySet,
    pub request: RequestSummary,
    pub decision: Decision,
    /// The evaluation's `now_unix_ms`.
    pub evaluated_unix_ms: u64,
    /// `--cached-token-weight`, when it is not 1.
    pub cached_weight: Option<f64>,
}

impl CompletionHook {
    /// Runs the `on_complete` of every policy that allowed the request, in a task of its own, with
    /// how the request ended: on the async worker as the evaluation was (see `pipeline::decide`), or
    /// on the blocking pool for a chain that was moved there.
    pub fn fire(
        self,
        status: u16,
        outcome: Outcome,
        usage: Usage,
        cost_nanos: Option<u64>,
        queue_wait_ms: u64,
        upstream_ms: u64,
    ) {
        let completion = Completion {
            abi: ABI_VERSION,
            request: self.request,
            decision: self.decision,
            chain_decision: Decision::default(),
            settings: serde_json::Value::Null,
            status,
            outcome: outcome.label().to_owned(),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cached_tokens: usage.cached_tokens,
            cached_weight: self.cached_weight,
            cost: cost_nanos.map(crate::config::prices::from_nanos),
            queue_wait_ms,
            upstream_ms,
            evaluated_unix_ms: self.evaluated_unix_ms,
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (chain, policies, own) = (self.chain, self.policies, self.own);
        let pending = policies.completion_started();
        rt.spawn(async move {
            let _pending = pending;
            let turn = policies.turn().await;
            if chain.runs_inline() {
                // Boxed, so this task stays small: tokio copies a task's future as it moves it
                // in and out, and the wasm calls' state is most of it.
                Box::pin(chain.complete_async(&completion, &own)).await;
            } else {
                let complete = move || {
                    let _turn = turn;
                    chain.complete(&completion, &own);
                };
                let _ = tokio::task::spawn_blocking(complete).await;
            }
        });
    }
}
