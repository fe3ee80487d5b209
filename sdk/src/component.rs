//! The wasm32 glue of a v2 policy (feature `v2`): the bindings wit-bindgen generates from
//! `wit/policy.wit`, and the conversions between the contract's records and this crate's types, so
//! one [`Policy`] implementation builds as a v1 module or as a v2 component unchanged. Compiled on
//! wasm32 with the `v2` feature only; [`export_component!`](crate::export_component) uses it.
//!
//! An instance may serve several calls of one caller (docs/policies.md, "Isolation"): the settings
//! are parsed on an instance's first call and kept (pinned, see `bump.rs`) for the next ones, which
//! compare the text and parse again only if it differs; everything else a call allocates is given
//! back once the host has its answer.

use std::collections::BTreeMap;

use crate::dispatch;
use crate::policy::Policy;
use crate::types::{
    Completion, Decision, Earlier, EvaluateInput, Mutations, Peer, QueueSnapshot, RateLimit,
    RateLimits, RequestSummary, Verdict, ABI_VERSION,
};

/// What wit-bindgen generates from the contract.
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "__export_policy_world",
        default_bindings_module: "slotgate_sdk::__component::bindings",
    });
}

use bindings::slotgate::policy::types as t;
pub use bindings::Guest;
pub use t::{Completion as WitCompletion, Decision as WitDecision, Evaluation, SettingsVerdict};

/// `validate-settings`: the settings parsed and checked; whether on-complete is wanted.
pub fn validate_settings<P: Policy>(
    settings: String,
    wants_completions: bool,
) -> Result<SettingsVerdict, String> {
    let s = parse::<P>(&settings)?;
    P::validate(&s)?;
    Ok(SettingsVerdict {
        needs_prompt_tokens: P::needs_prompt_tokens(&s),
        wants_completions,
    })
}

/// `evaluate`: the policy's decision, or (its settings no longer parsing, which validation
/// rules out) a trap.
pub fn evaluate<P: Policy>(settings: String, input: Evaluation) -> WitDecision
where
    P::Settings: 'static,
{
    with_settings::<P, _>(&settings, |s| evaluate_with::<P>(s, input))
}

fn evaluate_with<P: Policy>(s: &P::Settings, input: Evaluation) -> WitDecision {
    let input = EvaluateInput {
        abi: ABI_VERSION,
        request: request(input.request),
        settings: serde_json::Value::Null,
        now_unix_ms: input.now_unix_ms,
        earlier: Earlier {
            policies: input.earlier.policies,
            tenant: input.earlier.tenant,
            priority: input.earlier.priority,
            cost: input.earlier.cost,
        },
    };
    decision(P::evaluate(&input, s))
}

/// `on-complete`.
pub fn on_complete<P: Policy>(settings: String, c: WitCompletion)
where
    P::Settings: 'static,
{
    with_settings::<P, _>(&settings, |s| on_complete_with::<P>(s, c))
}

fn on_complete_with<P: Policy>(s: &P::Settings, c: WitCompletion) {
    let allowed = if c.chain_allowed {
        Decision::allow()
    } else {
        Decision::deny(403, "")
    };
    // Contract 2.0.0's record has no fields for them: the host lists them in a header.
    #[derive(serde::Deserialize, Default)]
    struct More {
        #[serde(default)]
        cached_tokens: u64,
        cached_weight: Option<f64>,
        cost: Option<f64>,
    }
    let more: More = header(&c.request.headers, crate::identity::USAGE_HEADER)
        .and_then(|json| serde_json::from_str(&json).ok())
        .unwrap_or_default();
    let completion = Completion {
        abi: ABI_VERSION,
        request: request(c.request),
        decision: allow_decision(c.decision),
        chain_decision: allowed,
        settings: serde_json::Value::Null,
        status: c.status,
        outcome: c.outcome,
        prompt_tokens: c.prompt_tokens,
        completion_tokens: c.completion_tokens,
        cached_tokens: more.cached_tokens,
        cached_weight: more.cached_weight,
        cost: more.cost,
        queue_wait_ms: c.queue_wait_ms,
        upstream_ms: c.upstream_ms,
        evaluated_unix_ms: c.evaluated_unix_ms,
    };
    P::on_complete(&completion, s);
}

std::thread_local! {
    /// The settings this instance parsed, and their text.
    static SETTINGS: std::cell::RefCell<Option<(String, Box<dyn std::any::Any>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `text` parsed: kept from an earlier call of this instance when the text is the
/// same, else parsed now (pinned) and kept. Settings that no longer parse (validation rules that
/// out) trap.
fn with_settings<P: Policy, R>(text: &str, f: impl FnOnce(&P::Settings) -> R) -> R
where
    P::Settings: 'static,
{
    SETTINGS.with(|cell| {
        let hit = matches!(&*cell.borrow(), Some((t, s)) if t == text && s.is::<P::Settings>());
        if !hit {
            let kept = crate::bump::pinned(|| match parse::<P>(text) {
                Ok(s) => (text.to_owned(), Box::new(s) as Box<dyn std::any::Any>),
                Err(e) => panic!("{e}"),
            });
            *cell.borrow_mut() = Some(kept);
        }
        let kept = cell.borrow();
        match kept
            .as_ref()
            .and_then(|(_, s)| s.downcast_ref::<P::Settings>())
        {
            Some(s) => f(s),
            None => unreachable!("settings kept just now"),
        }
    })
}

fn parse<P: Policy>(text: &str) -> Result<P::Settings, String> {
    if text.is_empty() || text == "null" {
        return dispatch::settings::<P::Settings>(&serde_json::Value::Null);
    }
    serde_json::from_str::<P::Settings>(text).map_err(|e| format!("invalid settings: {e}"))
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

fn request(r: t::Request) -> RequestSummary {
    RequestSummary {
        method: r.method,
        path: r.path,
        model: r.model,
        stream: r.stream,
        max_tokens: r.max_tokens,
        prompt_chars: r.prompt_chars,
        prompt_tokens_estimate: r.prompt_tokens_estimate,
        prompt_tokens: r.prompt_tokens,
        reserved_tokens: r.reserved_tokens,
        priority_hint: r.priority_hint,
        deadline_ms: r.deadline_ms,
        peer: r.peer.map(|p| Peer {
            uid: p.uid,
            gid: p.gid,
            pid: p.pid,
        }),
        api_key: r.api_key,
        // Contract 2.0.0 has no fields for them: the host lists them among the headers, by
        // their generic names (docs/sessions.md).
        agent_id: header(&r.headers, "x-agent-id"),
        parent_agent_id: header(&r.headers, "x-parent-agent-id"),
        tenant: header(&r.headers, crate::identity::TENANT_NAMED_HEADER),
        caller: header(&r.headers, crate::identity::CALLER_HEADER),
        team: header(&r.headers, crate::identity::TEAM_NAMED_HEADER),
        key_id: header(&r.headers, crate::identity::KEY_ID_HEADER),
        key_labels: header(&r.headers, crate::identity::KEY_LABELS_HEADER)
            .and_then(|json| serde_json::from_str(&json).ok())
            .unwrap_or_default(),
        price: header(&r.headers, crate::identity::PRICE_HEADER)
            .and_then(|json| serde_json::from_str(&json).ok()),
        headers: r.headers.into_iter().collect::<BTreeMap<_, _>>(),
        queue: QueueSnapshot {
            depth: r.queue.depth as usize,
            capacity: r.queue.capacity as usize,
            in_flight: r.queue.in_flight as usize,
            estimated_wait_seconds: r.queue.estimated_wait_seconds,
        },
        dialect: r.dialect,
        body_bytes: r.body_bytes,
        session_id: r.session_id,
        conversation_id: r.conversation_id,
    }
}

fn rate_limits(r: &RateLimits) -> t::RateLimits {
    let one = |l: &Option<RateLimit>| {
        l.map(|l| t::RateLimit {
            limit: l.limit,
            remaining: l.remaining,
            reset_unix_ms: l.reset_unix_ms,
        })
    };
    t::RateLimits {
        requests: one(&r.requests),
        tokens: one(&r.tokens),
    }
}

fn rate_limits_back(r: t::RateLimits) -> RateLimits {
    let one = |l: Option<t::RateLimit>| {
        l.map(|l| RateLimit {
            limit: l.limit,
            remaining: l.remaining,
            reset_unix_ms: l.reset_unix_ms,
        })
    };
    RateLimits {
        requests: one(r.requests),
        tokens: one(r.tokens),
    }
}

fn decision(d: Decision) -> WitDecision {
    let limits = rate_limits(&d.rate_limits);
    match d.verdict {
        Verdict::Deny => WitDecision::Deny(t::Deny {
            status: d.status.unwrap_or(403),
            reason: d.reason,
            message: d.message.unwrap_or_default(),
            retry_after_seconds: d.retry_after_seconds,
            should_retry: d.should_retry,
            rate_limits: limits,
        }),
        Verdict::Allow => WitDecision::Allow(t::Allow {
            tenant: d.tenant,
            cost: d.cost,
            weight: d.weight,
            priority: d.priority,
            deadline_ms: d.deadline_ms,
            max_in_service: d.max_in_service,
            max_waiting: d.max_waiting,
            cap_max_tokens: d.mutations.cap_max_tokens,
            disable_prompt_cache: d.mutations.disable_prompt_cache,
            strip_id_slot: d.mutations.strip_id_slot,
            response_headers: d.mutations.response_headers.into_iter().collect(),
            rate_limits: limits,
        }),
    }
}

fn allow_decision(a: t::Allow) -> Decision {
    Decision {
        tenant: a.tenant,
        cost: a.cost,
        weight: a.weight,
        priority: a.priority,
        deadline_ms: a.deadline_ms,
        max_in_service: a.max_in_service,
        max_waiting: a.max_waiting,
        mutations: Mutations {
            cap_max_tokens: a.cap_max_tokens,
            disable_prompt_cache: a.disable_prompt_cache,
            strip_id_slot: a.strip_id_slot,
            response_headers: a.response_headers.into_iter().collect(),
        },
        rate_limits: rate_limits_back(a.rate_limits),
        ..Decision::allow()
    }
}
