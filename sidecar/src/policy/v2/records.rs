//! The contract's records and the host's types, each way: the request, what earlier policies
//! decided, an allowing decision and a completion out; a decision in, checked as every decision is.

use std::collections::BTreeMap;

use slotgate_sdk::{
    Completion, Decision, Earlier, Mutations, RateLimit, RateLimits, RequestSummary, Verdict,
    CALLER_HEADER,
};

use super::t;
use crate::policy::error::EvalError;
use crate::policy::sandbox::check_decision;

/// The request as the contract carries it, the caller's identity among the host's headers.
pub fn request_of(r: &RequestSummary) -> t::Request {
    t::Request {
        method: r.method.clone(),
        path: r.path.clone(),
        dialect: r.dialect.clone(),
        model: r.model.clone(),
        stream: r.stream,
        max_tokens: r.max_tokens,
        prompt_chars: r.prompt_chars,
        prompt_tokens_estimate: r.prompt_tokens_estimate,
        prompt_tokens: r.prompt_tokens,
        reserved_tokens: r.reserved_tokens,
        body_bytes: r.body_bytes,
        priority_hint: r.priority_hint,
        deadline_ms: r.deadline_ms,
        peer: r.peer.map(|p| t::Peer {
            uid: p.uid,
            gid: p.gid,
            pid: p.pid,
        }),
        api_key: r.api_key.clone(),
        headers: r
            .headers
            .iter()
            .filter(|(k, _)| *k != CALLER_HEADER)
            .map(|(k, v)| (k.clone(), v.clone()))
            // Contract 2.0.0 has no field for it: the host's header gives it, always.
            .chain([(CALLER_HEADER.to_owned(), r.identity().to_string())])
            .collect(),
        session_id: r.session_id.clone(),
        conversation_id: r.conversation_id.clone(),
        queue: t::QueueState {
            depth: sat32(r.queue.depth),
            capacity: sat32(r.queue.capacity),
            in_flight: sat32(r.queue.in_flight),
            estimated_wait_seconds: r.queue.estimated_wait_seconds,
        },
    }
}

fn sat32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What earlier policies decided, as the contract carries it.
pub fn earlier_of(e: &Earlier) -> t::Earlier {
    t::Earlier {
        policies: e.policies,
        tenant: e.tenant.clone(),
        priority: e.priority,
        cost: e.cost,
    }
}

fn rate_limits_of(r: &RateLimits) -> t::RateLimits {
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

fn rate_limits_from(r: t::RateLimits) -> RateLimits {
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

/// An allowing decision as the contract carries it (a completion's `decision`).
pub fn allow_of(d: &Decision) -> t::Allow {
    t::Allow {
        tenant: d.tenant.clone(),
        cost: d.cost,
        weight: d.weight,
        priority: d.priority,
        deadline_ms: d.deadline_ms,
        max_in_service: d.max_in_service,
        max_waiting: d.max_waiting,
        cap_max_tokens: d.mutations.cap_max_tokens,
        disable_prompt_cache: d.mutations.disable_prompt_cache,
        strip_id_slot: d.mutations.strip_id_slot,
        response_headers: d
            .mutations
            .response_headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        rate_limits: rate_limits_of(&d.rate_limits),
    }
}

/// How a request ended, for a component that allowed it with `mine`; `c.decision` is the chain's
/// (as [`crate::policy::complete::CompletionHook`] fires it).
pub fn completion_of(c: &Completion, mine: &Decision) -> t::Completion {
    let mut request = request_of(&c.request);
    // Contract 2.0.0's record has no fields for them: a header of the host's lists them.
    if c.cached_tokens > 0 || c.cached_weight.is_some() || c.cost.is_some() {
        let more = serde_json::json!({
            "cached_tokens": c.cached_tokens,
            "cached_weight": c.cached_weight,
            "cost": c.cost,
        });
        request
            .headers
            .push((slotgate_sdk::USAGE_HEADER.to_owned(), more.to_string()));
    }
    t::Completion {
        request,
        decision: allow_of(mine),
        chain_allowed: c.decision.verdict == Verdict::Allow,
        status: c.status,
        outcome: c.outcome.clone(),
        prompt_tokens: c.prompt_tokens,
        completion_tokens: c.completion_tokens,
        queue_wait_ms: c.queue_wait_ms,
        upstream_ms: c.upstream_ms,
        evaluated_unix_ms: c.evaluated_unix_ms,
    }
}

/// A component's decision as the host's, checked as a v1 decision is: over `max_output` bytes of
/// text in all is refused, as a v1 answer of that size is.
pub fn decision_of(d: t::Decision, max_output: usize) -> Result<Decision, EvalError> {
    let headers = |h: &[(String, String)]| h.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let size = match &d {
        t::Decision::Allow(a) => text(&a.tenant) + headers(&a.response_headers),
        t::Decision::Deny(x) => x.message.len() + text(&x.reason),
    };
    if size > max_output {
        return Err(EvalError::InvalidOutput(format!(
            "decision of {size} bytes of text is over the {max_output}-byte limit"
        )));
    }
    let decision = match d {
        t::Decision::Allow(a) => Decision {
            verdict: Verdict::Allow,
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
                response_headers: a.response_headers.into_iter().collect::<BTreeMap<_, _>>(),
            },
            rate_limits: rate_limits_from(a.rate_limits),
            ..Decision::default()
        },
        t::Decision::Deny(x) => Decision {
            verdict: Verdict::Deny,
            status: Some(x.status),
            reason: x.reason,
            message: Some(x.message),
            retry_after_seconds: x.retry_after_seconds,
            should_retry: x.should_retry,
            rate_limits: rate_limits_from(x.rate_limits),
            ..Decision::default()
        },
    };
    check_decision(decision)
}

pub(super) fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
