//! What a request asks of the scheduler: whose it is (tenant), what it is expected to cost in tokens,
//! its tenant's weight, its priority, and what it holds while it runs (slots, KV pool tokens). Built
//! once per request, after the policy chain.

use std::sync::Arc;

use slotgate_sdk::{Decision, RequestSummary};

use super::cap::TenantCap;

/// Completion tokens assumed for a request that sets no bound (llama-server's own default is larger,
/// but most answers are short; the charge is corrected to the real count when the response ends).
pub const DEFAULT_MAX_TOKENS: u64 = 256;

/// One request's claim on a slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The tenant whose fair share the request is served from.
    pub tenant: Arc<str>,
    /// Tokens charged to the tenant when the request is admitted.
    pub cost: u64,
    /// The tenant's weight: its counter grows by `cost / weight`. Positive.
    pub weight: f64,
    /// Lower is served earlier.
    pub priority: i64,
    /// Slots it runs on at once.
    pub slots: usize,
    /// Tokens of the shared KV pool it holds while it runs.
    pub kv: u64,
    /// Who it is in the live view (`live::Request::key`), so a waiter can be named; 0: untagged.
    pub tag: u64,
    /// Its own deadline (the client's `X-Slotgate-Deadline-Ms` or a policy's `deadline_ms`), when
    /// it set one shorter than the queue timeout: it must start by then. Within a priority level
    /// the earliest deadline is served first, while its tenant is within its fair share.
    pub deadline: Option<tokio::time::Instant>,
    /// Its overload band (see `admission::bands`), set by the queue when it arrives.
    pub band: Option<usize>,
    /// Times it was shed before its first byte and went back to the queue (see `admission::shed`).
    pub shed: u32,
    /// When it was last shed (the guard time runs from then).
    pub shed_at: Option<tokio::time::Instant>,
    /// Never shed, whatever its priority: its answer outlives its connection (a conversation), so
    /// closing the connection would not stop llama-server.
    pub keeps_slot: bool,
    /// Its cap on its tenant's requests in service and waiting: its policies' and the operator's,
    /// the stricter (see `admission::cap`).
    pub cap: TenantCap,
    /// Its tenant's team and the team's cap on its requests in service (`[teams."NAME"]`), when
    /// one is set: held back like a tenant at its cap while the team's requests reach it.
    pub team_cap: Option<(Arc<str>, usize)>,
    /// Its request's body: with its tenant, how a client told to come back is known when it does
    /// (see `queue::returns`). Shared, not copied.
    pub body: bytes::Bytes,
}

impl Claim {
    /// The claim of `request`: the policies' tenant, cost and weight where the chain set them
    /// (`decision`), else the caller's identity, `charge` (see `cost::Demand`) and 1. It holds one
    /// slot and no pool tokens until [`Claim::holding`] says more.
    pub fn new(
        request: &RequestSummary,
        decision: Option<&Decision>,
        priority: i64,
        charge: u64,
    ) -> Claim {
        let tenant = match decision.and_then(|d| d.tenant.as_deref()) {
            Some(t) => Arc::from(t),
            None => Arc::from(request.identity().to_string()),
        };
        let weight = decision
            .and_then(|d| d.weight)
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(1.0);
        let cost = Claim::cost_of(decision, charge);
        Claim::fresh(tenant, cost, weight, priority, Claim::cap_of(decision))
    }

    /// A claim on one slot, not yet queued, shed or given a deadline, band or body.
    fn fresh(tenant: Arc<str>, cost: u64, weight: f64, priority: i64, cap: TenantCap) -> Claim {
        Claim {
            tenant,
            cost,
            weight,
            priority,
            slots: 1,
            kv: 0,
            tag: 0,
            deadline: None,
            band: None,
            shed: 0,
            shed_at: None,
            keeps_slot: false,
            cap,
            team_cap: None,
            body: bytes::Bytes::new(),
        }
    }

    /// The tenant cap its policies' decision sets.
    fn cap_of(decision: Option<&Decision>) -> TenantCap {
        let as_usize = |n: Option<u32>| n.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        TenantCap {
            in_service: as_usize(decision.and_then(|d| d.max_in_service)),
            waiting: as_usize(decision.and_then(|d| d.max_waiting)),
        }
    }

    /// Capped by `cap` too (the operator's setting for its tenant): the stricter of each limit.
    pub fn capped(mut self, cap: TenantCap) -> Claim {
        self.cap = self.cap.tightened(cap);
        self
    }

    /// Held to its team's cap too: at most `cap` of `team`'s requests in service.
    pub fn team_capped(mut self, team: Option<(Arc<str>, usize)>) -> Claim {
        self.team_cap = team.map(|(t, n)| (t, n.max(1)));
        self
    }

    /// Never shed (see [`Claim::keeps_slot`]) when `keeps` holds.
    pub fn keeping_slot(mut self, keeps: bool) -> Claim {
        self.keeps_slot = keeps;
        self
    }

    /// Due by `deadline` (its own, shorter than the queue timeout).
    pub fn due(mut self, deadline: Option<tokio::time::Instant>) -> Claim {
        self.deadline = deadline;
        self
    }

    /// Sent with `body`: known by it (and its tenant) when its client comes back.
    pub fn with_body(mut self, body: bytes::Bytes) -> Claim {
        self.body = body;
        self
    }

    /// Named `tag` in the live view.
    pub fn tagged(mut self, tag: u64) -> Claim {
        self.tag = tag;
        self
    }

    /// What the request holds while it runs.
    pub fn holding(mut self, slots: usize, kv: u64) -> Claim {
        self.slots = slots.max(1);
        self.kv = kv;
        self
    }

    /// The tokens charged up front: the cost the chain set, else `charge`.
    pub fn cost_of(decision: Option<&Decision>, charge: u64) -> u64 {
        decision.and_then(|d| d.cost).unwrap_or(charge)
    }

    /// What the tenant's counter grows by when the request is admitted.
    pub fn charge(&self) -> f64 {
        self.cost as f64 / self.weight
    }

    /// A claim with weight 1 and cost 1, for tests of the queue.
    #[cfg(test)]
    pub fn test(tenant: &str, priority: i64) -> Claim {
        Claim::fresh(Arc::from(tenant), 1, 1.0, priority, TenantCap::default())
    }
}

/// The tokens a request is charged at admission when no policy names a cost: its reservation (the
/// exact prompt plus the most it may generate within its slot, see `cost::reservation`), else its
/// prompt (exact when counted, else estimated) plus `max_tokens` or a default.
pub fn estimated_cost(request: &RequestSummary) -> u64 {
    request.reserved_tokens.unwrap_or_else(|| {
        request
            .prompt_tokens_best()
            .saturating_add(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS))
    })
}

#[cfg(test)]
mod tests {
    use slotgate_sdk::Peer;

    use super::*;

    #[test]
    fn policy_values_win_over_identity_and_estimate() {
        let mut r = RequestSummary {
            prompt_tokens_estimate: 40,
            max_tokens: Some(100),
            peer: Some(Peer {
                uid: 7,
                gid: 7,
                pid: None,
            }),
            ..RequestSummary::default()
        };
        r.caller = Some(r.name_caller());
        let c = Claim::new(&r, None, 3, estimated_cost(&r));
        assert_eq!(
            (&*c.tenant, c.cost, c.weight, c.priority),
            ("uid:7", 140, 1.0, 3)
        );
        r.max_tokens = None;
        r.api_key = Some("sha256:ab".into());
        r.caller = Some(r.name_caller());
        let c = Claim::new(&r, Some(&Decision::allow()), 0, estimated_cost(&r));
        assert_eq!((&*c.tenant, c.cost), ("sha256:ab", 40 + DEFAULT_MAX_TOKENS));
        let d = Decision {
            tenant: Some("team-a".into()),
            cost: Some(9),
            weight: Some(2.5),
            ..Decision::allow()
        };
        let c = Claim::new(&r, Some(&d), 0, estimated_cost(&r));
        assert_eq!((&*c.tenant, c.cost, c.weight), ("team-a", 9, 2.5));
        let d = Decision {
            max_in_service: Some(3),
            max_waiting: Some(1),
            ..Decision::allow()
        };
        let setting = TenantCap {
            in_service: Some(2),
            waiting: None,
        };
        let c = Claim::new(&r, Some(&d), 0, 1).capped(setting);
        assert_eq!((c.cap.in_service, c.cap.waiting), (Some(2), Some(1)));
    }
}
