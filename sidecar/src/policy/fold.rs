//! Folding the decisions of a policy chain into one: the first enforced deny wins; monitor-mode
//! policies are evaluated and counted but never change a request's fate.
//!
//! How allowed decisions combine (every rule errs on the side of the stricter policy):
//! - `cost`: the largest any policy set;
//! - `priority`: the largest (least urgent) any policy set, so no policy can lift a request above what
//!   another allows;
//! - `tenant`: the first policy that names one (put the identity policy first);
//! - `weight`: the smallest any policy set, so no policy can give a tenant more than another allows;
//! - `deadline_ms`: the smallest any policy set (the client's own header may cut it further);
//! - `max_in_service`, `max_waiting`: the smallest any policy set (the operator's per-tenant caps
//!   may cut them further), so no policy can give a tenant more room than another allows;
//! - mutations: the smallest `cap_max_tokens`; `disable_prompt_cache` and `strip_id_slot` if any
//!   policy asks; response headers merged, a later policy winning a name both set.

use slotgate_sdk::{Decision, RateLimit, RateLimits, Verdict};

use super::error::EvalError;

/// Whether a policy's decision counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    Monitor,
}

/// What a failed evaluation means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Fail closed: the request is refused with 503.
    Deny,
    /// Fail open: as if the policy had allowed with no changes.
    Allow,
}

/// One policy's result, in chain order.
pub struct Step<'a> {
    pub policy: &'a str,
    pub mode: Mode,
    pub on_error: OnError,
    pub result: Result<Decision, EvalError>,
}

/// The chain's verdict.
#[derive(Debug, PartialEq)]
pub enum ChainOutcome {
    /// Admit with the combined decision.
    Allow(Decision),
    /// A policy denied.
    Deny { policy: String, decision: Decision },
    /// A policy failed and fails closed.
    Failed { policy: String, error: EvalError },
}

impl ChainOutcome {
    /// The chain's decision as policies' `on_complete` see it: the combined allow, the deny, or (for
    /// a policy failing closed) a deny with status 503.
    pub fn decision(&self) -> Decision {
        match self {
            ChainOutcome::Allow(d) | ChainOutcome::Deny { decision: d, .. } => d.clone(),
            ChainOutcome::Failed { policy, error } => {
                Decision::deny(503, format!("policy `{policy}` failed ({})", error.kind()))
            }
        }
    }
}

pub fn fold<'a>(steps: impl IntoIterator<Item = Step<'a>>) -> ChainOutcome {
    let mut combined = Decision::allow();
    let mut tenant_set = false;
    for step in steps {
        if step.mode == Mode::Monitor {
            continue;
        }
        let decision = match step.result {
            Ok(d) => d,
            Err(error) => match step.on_error {
                OnError::Deny => {
                    return ChainOutcome::Failed {
                        policy: step.policy.to_owned(),
                        error,
                    }
                }
                OnError::Allow => continue,
            },
        };
        if decision.verdict == Verdict::Deny {
            let mut decision = decision;
            decision.rate_limits = tighter(&combined.rate_limits, decision.rate_limits);
            return ChainOutcome::Deny {
                policy: step.policy.to_owned(),
                decision,
            };
        }
        combined.rate_limits = tighter(&combined.rate_limits, decision.rate_limits);
        combined.cost = max_opt(combined.cost, decision.cost);
        combined.priority = max_opt(combined.priority, decision.priority);
        combined.weight = match (combined.weight, decision.weight) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // 0 is no deadline (ignored), not the smallest one.
        let deadline_ms = decision.deadline_ms.filter(|ms| *ms > 0);
        combined.deadline_ms = match (combined.deadline_ms, deadline_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        combined.max_in_service = min_opt(combined.max_in_service, decision.max_in_service);
        combined.max_waiting = min_opt(combined.max_waiting, decision.max_waiting);
        if !tenant_set && decision.tenant.is_some() {
            combined.tenant = decision.tenant;
            tenant_set = true;
        }
        let (m, add) = (&mut combined.mutations, decision.mutations);
        m.cap_max_tokens = match (m.cap_max_tokens, add.cap_max_tokens) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        m.disable_prompt_cache |= add.disable_prompt_cache;
        m.strip_id_slot |= add.strip_id_slot;
        m.response_headers.extend(add.response_headers);
    }
    ChainOutcome::Allow(combined)
}

/// Of two policies' allowances, for requests and for tokens each, the one with less left: the
/// one that binds.
fn tighter(a: &RateLimits, b: RateLimits) -> RateLimits {
    let pick = |a: Option<RateLimit>, b: Option<RateLimit>| match (a, b) {
        (Some(a), Some(b)) if b.remaining < a.remaining => Some(b),
        (a, b) => a.or(b),
    };
    RateLimits {
        requests: pick(a.requests, b.requests),
        tokens: pick(a.tokens, b.tokens),
    }
}

fn max_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use slotgate_sdk::Mutations;

    use super::*;

    fn allow(
        cost: u64,
        prio: i64,
        tenant: Option<&str>,
        cap: Option<u64>,
    ) -> Result<Decision, EvalError> {
        Ok(Decision {
            cost: Some(cost),
            priority: Some(prio),
            tenant: tenant.map(str::to_owned),
            mutations: Mutations {
                cap_max_tokens: cap,
                ..Mutations::default()
            },
            ..Decision::allow()
        })
    }

    fn step(
        policy: &str,
        mode: Mode,
        on_error: OnError,
        result: Result<Decision, EvalError>,
    ) -> Step<'_> {
        Step {
            policy,
            mode,
            on_error,
            result,
        }
    }

    #[test]
    fn allowed_decisions_combine_strictly() {
        let out = fold([
            step(
                "a",
                Mode::Enforce,
                OnError::Deny,
                allow(10, 1, Some("team-a"), Some(512)),
            ),
            step(
                "b",
                Mode::Enforce,
                OnError::Deny,
                allow(30, 0, Some("team-b"), Some(128)),
            ),
            step(
                "m",
                Mode::Monitor,
                OnError::Deny,
                allow(999, 9, Some("x"), Some(1)),
            ),
        ]);
        let ChainOutcome::Allow(d) = out else {
            panic!("{out:?}")
        };
        assert_eq!(
            (d.cost, d.priority, d.tenant.as_deref()),
            (Some(30), Some(1), Some("team-a"))
        );
        assert_eq!(d.mutations.cap_max_tokens, Some(128));
    }

    #[test]
    fn the_smallest_weight_wins() {
        let weighted = |w: Option<f64>| {
            Ok(Decision {
                weight: w,
                ..Decision::allow()
            })
        };
        let out = fold([
            step("a", Mode::Enforce, OnError::Deny, weighted(Some(4.0))),
            step("b", Mode::Enforce, OnError::Deny, weighted(None)),
            step("c", Mode::Enforce, OnError::Deny, weighted(Some(2.0))),
            step("m", Mode::Monitor, OnError::Deny, weighted(Some(0.5))),
        ]);
        let ChainOutcome::Allow(d) = out else {
            panic!("{out:?}")
        };
        assert_eq!(d.weight, Some(2.0));
    }

    #[test]
    fn the_smallest_tenant_caps_win() {
        let capped = |in_service: Option<u32>, waiting: Option<u32>| {
            Ok(Decision {
                max_in_service: in_service,
                max_waiting: waiting,
                ..Decision::allow()
            })
        };
        let out = fold([
            step("a", Mode::Enforce, OnError::Deny, capped(Some(4), None)),
            step("b", Mode::Enforce, OnError::Deny, capped(None, Some(3))),
            step("c", Mode::Enforce, OnError::Deny, capped(Some(2), Some(5))),
            step("m", Mode::Monitor, OnError::Deny, capped(Some(1), Some(0))),
        ]);
        let ChainOutcome::Allow(d) = out else {
            panic!("{out:?}")
        };
        assert_eq!((d.max_in_service, d.max_waiting), (Some(2), Some(3)));
    }

    #[test]
    fn the_shortest_deadline_wins() {
        let due = |ms: Option<u64>| {
            Ok(Decision {
                deadline_ms: ms,
                ..Decision::allow()
            })
        };
        let out = fold([
            step("a", Mode::Enforce, OnError::Deny, due(Some(30_000))),
            step("b", Mode::Enforce, OnError::Deny, due(None)),
            step("c", Mode::Enforce, OnError::Deny, due(Some(2_000))),
            // 0 is no deadline: it does not wipe out the others'.
            step("z", Mode::Enforce, OnError::Deny, due(Some(0))),
            step("m", Mode::Monitor, OnError::Deny, due(Some(5))),
        ]);
        let ChainOutcome::Allow(d) = out else {
            panic!("{out:?}")
        };
        assert_eq!(d.deadline_ms, Some(2_000));
    }

    #[test]
    fn first_enforced_deny_wins_and_monitor_never_decides() {
        let deny = Ok(Decision {
            verdict: Verdict::Deny,
            status: Some(429),
            ..Decision::allow()
        });
        let out = fold([
            step("watch", Mode::Monitor, OnError::Deny, deny.clone()),
            step(
                "broken-monitor",
                Mode::Monitor,
                OnError::Deny,
                Err(EvalError::Timeout),
            ),
            step("ok", Mode::Enforce, OnError::Deny, allow(1, 0, None, None)),
            step("budget", Mode::Enforce, OnError::Deny, deny),
            step("never", Mode::Enforce, OnError::Deny, Err(EvalError::Fuel)),
        ]);
        assert!(
            matches!(out, ChainOutcome::Deny { ref policy, .. } if policy == "budget"),
            "{out:?}"
        );
    }

    #[test]
    fn errors_fail_closed_or_open_as_configured() {
        let closed = fold([step(
            "p",
            Mode::Enforce,
            OnError::Deny,
            Err(EvalError::Memory),
        )]);
        assert!(matches!(
            closed,
            ChainOutcome::Failed {
                error: EvalError::Memory,
                ..
            }
        ));
        let open = fold([step(
            "p",
            Mode::Enforce,
            OnError::Allow,
            Err(EvalError::Memory),
        )]);
        assert_eq!(open, ChainOutcome::Allow(Decision::allow()));
    }
}
