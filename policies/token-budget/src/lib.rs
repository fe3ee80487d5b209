//! Token budget: a token bucket per tenant (API key, else uid, else one shared anonymous bucket; or
//! a header's value, with `tenant_header`),
//! charged each request's estimated cost up front and settled against the actual usage once the
//! response has ended. An empty bucket answers 429 with Retry-After.

use std::collections::BTreeMap;

use serde::Deserialize;
use slotgate_sdk::host::{self, Level};
use slotgate_sdk::{
    check_tenant, check_tenant_header, Completion, Decision, EvaluateInput, Policy, RequestSummary,
    Verdict,
};

pub struct TokenBudget;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Tokens a full bucket holds: the largest burst, and the largest single request.
    pub capacity: u64,
    /// Tokens added back per second.
    pub refill_per_second: f64,
    /// `max_tokens` assumed for a request that sets none.
    #[serde(default = "default_max_tokens")]
    pub default_max_tokens: u64,
    /// Budgets of particular tenants, by tenant key: `sha256:<hex>`, `uid:<n>`, `anonymous`, or
    /// `header:<value>` with `tenant_header`.
    #[serde(default)]
    pub tenants: BTreeMap<String, Budget>,
    /// Key the budget by this request header when a request carries it (`header:<value>`), instead
    /// of the caller's API key or uid: for a router in front, such as LiteLLM, that calls with one
    /// key for all its callers and forwards theirs in a header. One of the headers policies see:
    /// `x-tenant`, `openai-organization`, `openai-project`. Any client that reaches slotgate can set
    /// it, so use it only when the router is the only one that does.
    #[serde(default)]
    pub tenant_header: Option<String>,
}

/// Whom a request is charged to.
fn tenant(request: &RequestSummary, s: &Settings) -> String {
    request.tenant_key(s.tenant_header.as_deref())
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub capacity: u64,
    pub refill_per_second: f64,
}

fn default_max_tokens() -> u64 {
    1024
}

impl Settings {
    fn budget(&self, tenant: &str) -> Budget {
        self.tenants.get(tenant).copied().unwrap_or(Budget {
            capacity: self.capacity,
            refill_per_second: self.refill_per_second,
        })
    }
}

impl Budget {
    fn check(&self, what: &str) -> Result<(), String> {
        if self.capacity == 0 {
            return Err(format!("{what}: capacity must be positive"));
        }
        if !(self.refill_per_second.is_finite() && self.refill_per_second >= 0.0) {
            return Err(format!(
                "{what}: refill_per_second must be a number >= 0 (0: a fixed quota)"
            ));
        }
        Ok(())
    }
}

/// What a request is charged up front: its prompt (counted exactly when slotgate could, else
/// estimated) plus the most it may generate.
fn estimate(request: &RequestSummary, settings: &Settings) -> u64 {
    let output = request.max_tokens.unwrap_or(settings.default_max_tokens);
    request.prompt_tokens_best().saturating_add(output)
}

/// What a request really used. Nothing if it never reached the upstream (rejected by the queue, timed
/// out waiting); the prompt estimate stands in when the upstream reported no prompt count.
fn usage(c: &Completion) -> u64 {
    let reached_upstream = c.prompt_tokens > 0 || c.completion_tokens > 0 || c.upstream_ms > 0;
    if !reached_upstream {
        return 0;
    }
    let prompt = match c.prompt_tokens {
        0 => c.request.prompt_tokens_best(),
        n => n,
    };
    prompt.saturating_add(c.completion_tokens)
}

impl Policy for TokenBudget {
    type Settings = Settings;

    fn validate(s: &Settings) -> Result<(), String> {
        Budget {
            capacity: s.capacity,
            refill_per_second: s.refill_per_second,
        }
        .check("the default budget")?;
        if let Some(h) = &s.tenant_header {
            check_tenant_header(h)?;
        }
        for (tenant, budget) in &s.tenants {
            check_tenant(tenant, s.tenant_header.is_some())?;
            budget.check(&format!("tenant `{tenant}`"))?;
        }
        Ok(())
    }

    fn evaluate(input: &EvaluateInput, s: &Settings) -> Decision {
        let tenant = tenant(&input.request, s);
        let budget = s.budget(&tenant);
        let cost = estimate(&input.request, s);
        if cost > budget.capacity {
            return Decision::forbidden(format!(
                "this request may use {cost} tokens, more than the budget of {} holds: lower max_tokens",
                budget.capacity
            ));
        }
        let wait = host::bucket_take(
            &tenant,
            budget.capacity as f64,
            budget.refill_per_second,
            cost as f64,
        );
        if wait > 0.0 {
            // Infinite with no refill: a spent fixed quota, when retrying will not help.
            let retry = wait.is_finite().then(|| wait.ceil().max(1.0) as u64);
            return Decision::too_many_requests("token budget exhausted", retry);
        }
        Decision {
            cost: Some(cost),
            ..Decision::allow()
        }
    }

    fn on_complete(c: &Completion, s: &Settings) {
        // slotgate calls this only for requests this policy allowed (and so charged), including
        // those a later policy in the chain denied: then nothing was used and the whole estimate
        // comes back.
        if c.decision.verdict == Verdict::Deny {
            return;
        }
        let tenant = tenant(&c.request, s);
        let budget = s.budget(&tenant);
        let charged = estimate(&c.request, s);
        if charged > budget.capacity {
            return;
        }
        // Negative when the estimate was low (no max_tokens, short default): the bucket goes into
        // debt and the tenant's next request waits for it.
        let refund = charged as f64 - usage(c) as f64;
        if refund != 0.0 {
            let level = host::bucket_refund(
                &tenant,
                budget.capacity as f64,
                budget.refill_per_second,
                refund,
            );
            host::log(
                Level::Debug,
                &format!("{tenant}: charged {charged}, settled by {refund}, level {level}"),
            );
        }
    }
}

#[cfg(not(feature = "v2"))]
slotgate_sdk::export_policy!(TokenBudget, on_complete);
#[cfg(feature = "v2")]
slotgate_sdk::export_component!(TokenBudget, on_complete);

#[cfg(test)]
mod tests {
    use super::*;
    use slotgate_sdk::testing::{self, run};

    const SETTINGS: &str = r#""settings": {"capacity": 1000, "refill_per_second": 100}"#;

    fn req(tenant: &str, prompt: u64, max_tokens: u64) -> String {
        format!(
            r#"{{"request": {{{tenant}"prompt_tokens_estimate": {prompt}, "max_tokens": {max_tokens}}}, {SETTINGS}}}"#
        )
    }

    const ALICE: &str = r#""peer": {"uid": 1000, "gid": 1000}, "#;
    const BOB: &str = r#""peer": {"uid": 1001, "gid": 1001}, "#;

    fn done(tenant: &str, prompt: u64, max_tokens: u64, used: (u64, u64)) -> String {
        format!(
            r#"{{"request": {{{tenant}"prompt_tokens_estimate": {prompt}, "max_tokens": {max_tokens}}}, {SETTINGS},
                "prompt_tokens": {}, "completion_tokens": {}, "upstream_ms": 300}}"#,
            used.0, used.1
        )
    }

    #[test]
    fn charges_the_estimate_and_refuses_with_retry_after_when_dry() {
        testing::reset();
        let d = run::<TokenBudget>(&req(ALICE, 100, 500));
        assert_eq!((d.verdict, d.cost), (Verdict::Allow, Some(600)));
        let d = run::<TokenBudget>(&req(ALICE, 100, 500));
        assert_eq!(d.status, Some(429));
        assert_eq!(d.message.as_deref(), Some("token budget exhausted"));
        // 400 left, 600 needed, 100 per second.
        assert_eq!(d.retry_after_seconds, Some(2));
        assert!(
            run::<TokenBudget>(&req(BOB, 100, 500)).is_allowed(),
            "buckets are per tenant"
        );
        testing::advance_ms(2_000);
        assert!(run::<TokenBudget>(&req(ALICE, 100, 500)).is_allowed());
    }

    #[test]
    fn the_api_key_beats_the_uid_and_no_identity_shares_one_bucket() {
        testing::reset();
        let key = format!(r#""api_key": "sha256:{}", {ALICE}"#, "ab".repeat(32));
        assert!(run::<TokenBudget>(&req(&key, 0, 1000)).is_allowed());
        assert!(
            run::<TokenBudget>(&req(ALICE, 0, 1000)).is_allowed(),
            "same uid without the key: another bucket"
        );
        assert!(run::<TokenBudget>(&req("", 0, 1000)).is_allowed());
        assert!(!run::<TokenBudget>(&req("", 0, 1)).is_allowed());
    }

    #[test]
    fn oversized_requests_are_forbidden_and_tenants_can_have_their_own_budget() {
        testing::reset();
        let d = run::<TokenBudget>(&req(ALICE, 1, 1000));
        assert_eq!(d.status, Some(403));
        assert!(d.message.unwrap().contains("lower max_tokens"));
        let big = r#"{"request": {"peer": {"uid": 1000, "gid": 1000}, "max_tokens": 5000},
                      "settings": {"capacity": 1000, "refill_per_second": 1,
                                   "tenants": {"uid:1000": {"capacity": 8000, "refill_per_second": 1}}}}"#;
        assert_eq!(run::<TokenBudget>(big).cost, Some(5000));
    }

    #[test]
    fn completion_refunds_what_was_not_used_and_charges_what_was_underestimated() {
        testing::reset();
        assert!(run::<TokenBudget>(&req(ALICE, 100, 800)).is_allowed());
        // 900 charged, 150 used: 750 back, so 850 are there now.
        testing::complete::<TokenBudget>(&done(ALICE, 100, 800, (100, 50)));
        assert!(run::<TokenBudget>(&req(ALICE, 50, 800)).is_allowed());
        assert_eq!(run::<TokenBudget>(&req(ALICE, 0, 1)).status, Some(429));

        testing::reset();
        assert!(run::<TokenBudget>(&req(BOB, 100, 100)).is_allowed());
        // 200 charged, 900 used: 700 more, leaving 100.
        testing::complete::<TokenBudget>(&done(BOB, 100, 100, (100, 800)));
        assert!(run::<TokenBudget>(&req(BOB, 0, 100)).is_allowed());
        let d = run::<TokenBudget>(&req(BOB, 0, 100));
        assert_eq!(d.retry_after_seconds, Some(1));
    }

    #[test]
    fn requests_that_never_reached_the_upstream_are_refunded_and_denials_are_not() {
        testing::reset();
        assert!(run::<TokenBudget>(&req(ALICE, 100, 900)).is_allowed());
        let queue_full = format!(
            r#"{{"request": {{{ALICE}"prompt_tokens_estimate": 100, "max_tokens": 900}}, {SETTINGS},
                "status": 429, "outcome": "queue_full"}}"#
        );
        testing::complete::<TokenBudget>(&queue_full);
        assert!(run::<TokenBudget>(&req(ALICE, 100, 900)).is_allowed());

        let denied = format!(
            r#"{{"request": {{{ALICE}"prompt_tokens_estimate": 100, "max_tokens": 900}}, {SETTINGS},
                "decision": {{"verdict": "deny", "status": 429}}, "status": 429, "outcome": "denied"}}"#
        );
        testing::complete::<TokenBudget>(&denied);
        assert!(!run::<TokenBudget>(&req(ALICE, 0, 1)).is_allowed());
    }

    #[test]
    fn a_fixed_quota_has_no_retry_after() {
        testing::reset();
        let quota = r#"{"request": {"max_tokens": 10}, "settings": {"capacity": 10, "refill_per_second": 0}}"#;
        assert!(run::<TokenBudget>(quota).is_allowed());
        let d = run::<TokenBudget>(quota);
        assert_eq!((d.status, d.retry_after_seconds), (Some(429), None));
    }

    #[test]
    fn a_tenant_header_keys_the_budget_when_present_and_can_have_its_own() {
        testing::reset();
        let settings = r#""settings": {"capacity": 1000, "refill_per_second": 0,
            "tenant_header": "x-tenant",
            "tenants": {"header:big": {"capacity": 3000, "refill_per_second": 0}}}"#;
        let from = |team: &str, max_tokens: u64| {
            format!(
                r#"{{"request": {{"api_key": "sha256:{}", "headers": {{"x-tenant": "{team}"}},
                    "max_tokens": {max_tokens}}}, {settings}}}"#,
                "cd".repeat(32)
            )
        };
        // One router key, two callers behind it: two budgets.
        assert!(run::<TokenBudget>(&from("team-a", 1000)).is_allowed());
        assert!(
            !run::<TokenBudget>(&from("team-a", 1)).is_allowed(),
            "team-a is dry"
        );
        assert!(run::<TokenBudget>(&from("team-b", 1000)).is_allowed());
        // A tenant named by its header value gets its own budget.
        assert!(run::<TokenBudget>(&from("big", 1000)).is_allowed());
        assert!(run::<TokenBudget>(&from("big", 1000)).is_allowed());
        // No header: the router's key, as without the setting.
        let keyed = format!(
            r#"{{"request": {{"api_key": "sha256:{}", "max_tokens": 1000}}, {settings}}}"#,
            "cd".repeat(32)
        );
        assert!(run::<TokenBudget>(&keyed).is_allowed());
        assert!(!run::<TokenBudget>(&keyed).is_allowed());
        assert_eq!(
            testing::validate::<TokenBudget>(
                r#"{"capacity": 10, "refill_per_second": 1, "tenant_header": "x-tenant",
                    "tenants": {"header:big": {"capacity": 1, "refill_per_second": 1}}}"#
            ),
            slotgate_sdk::SettingsValidation::ok()
        );
    }

    #[test]
    fn settings_are_validated() {
        let example = include_str!("../settings.example.json");
        assert_eq!(
            testing::validate::<TokenBudget>(example),
            slotgate_sdk::SettingsValidation::ok()
        );
        for bad in [
            "null",
            r#"{"capacity": 0, "refill_per_second": 1}"#,
            r#"{"capacity": 10, "refill_per_second": -1}"#,
            r#"{"capacity": 10, "refill_per_second": 1, "tenants": {"sk-raw-key": {"capacity": 1, "refill_per_second": 1}}}"#,
            r#"{"capacity": 10, "refill_per_second": 1, "tenants": {"uid:7": {"capacity": 0, "refill_per_second": 1}}}"#,
            r#"{"capacity": 10, "refill_per_second": 1, "burst": 3}"#,
            r#"{"capacity": 10, "refill_per_second": 1, "tenant_header": "authorization"}"#,
            r#"{"capacity": 10, "refill_per_second": 1, "tenants": {"header:team-a": {"capacity": 1, "refill_per_second": 1}}}"#,
        ] {
            let v = testing::validate::<TokenBudget>(bad);
            assert!(!v.valid, "{bad} passed");
            assert!(v.message.is_some());
        }
    }

    #[test]
    fn fixtures() {
        testing::run_fixtures::<TokenBudget>(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"));
    }
}
