//! Quota: calendar quotas of tokens, of requests and of money per tenant (and per tenant and
//! model, team or key), over an hour, a day, a week or a month in a time zone, whole again at the
//! window's end. Each request is
//! charged its estimate up front and settled against its real usage once it has ended. A spent
//! quota answers 429 `quota_exceeded` with `Retry-After` at the window's end and `x-should-retry:
//! false`; a share of a quota spent (`soft_limit`) is counted and logged once per window. Every
//! answer carries the tenant's allowance as rate-limit headers.

use std::collections::BTreeMap;

use serde::Deserialize;
use slotgate_sdk::calendar::{Period, Span};
use slotgate_sdk::host::{self, Level};
use slotgate_sdk::{
    check_tenant, check_tenant_header, Completion, Decision, EvaluateInput, Policy, RateLimit,
    RateLimits, RequestSummary, Verdict,
};

pub struct Quota;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// `hour`, `day`, `week` or `month`, optionally `@` an IANA time zone (`day@Europe/Paris`);
    /// UTC without one.
    pub period: String,
    /// Tokens (prompt and output) each tenant may use per period. Absent: no token quota.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// Requests each tenant may make per period. Absent: no request quota.
    #[serde(default)]
    pub requests: Option<u64>,
    /// Money each tenant may spend per period, in the currency of the operator's `[prices]`
    /// (docs/spend.md). Absent: no money quota.
    #[serde(default)]
    pub cost: Option<f64>,
    /// The share of a quota at which the tenant is warned about (logged, and counted as the event
    /// `soft_limit`) when a charge crosses it. Absent: 0.8; 1 turns it off.
    #[serde(default = "default_soft_limit")]
    pub soft_limit: f64,
    /// `max_tokens` assumed for a request that sets none.
    #[serde(default = "default_max_tokens")]
    pub default_max_tokens: u64,
    /// Quotas of particular tenants (`sha256:<hex>`, `uid:<n>`, `anonymous`, `header:<value>`),
    /// in place of `tokens` and `requests`.
    #[serde(default)]
    pub tenants: BTreeMap<String, Limits>,
    /// Quotas of each tenant on particular models (the request's `model`), on top of its own.
    #[serde(default)]
    pub models: BTreeMap<String, Limits>,
    /// Quotas of particular teams (the team of the key slotgate let a caller in with,
    /// `--client-auth keys`), on top of each tenant's own: every key of the team draws from one.
    #[serde(default)]
    pub teams: BTreeMap<String, Limits>,
    /// Quotas of particular keys slotgate issued (by key id), on top of their tenant's.
    #[serde(default)]
    pub keys: BTreeMap<String, Limits>,
    /// Key the quota by this request header when a request carries it (`header:<value>`), for a
    /// router in front that calls with one key for all its callers: `x-tenant`,
    /// `openai-organization` or `openai-project`.
    #[serde(default)]
    pub tenant_header: Option<String>,
}

/// A quota of tokens, one of requests and one of money, each optional.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default)]
    pub tokens: Option<u64>,
    #[serde(default)]
    pub requests: Option<u64>,
    #[serde(default)]
    pub cost: Option<f64>,
}

impl Limits {
    fn any(&self) -> bool {
        self.tokens.is_some() || self.requests.is_some() || self.cost.is_some()
    }
}

fn default_soft_limit() -> f64 {
    0.8
}

fn default_max_tokens() -> u64 {
    1024
}

/// One quota a request is charged to.
struct Charge {
    /// The host's key: the tenant, and the model for a model's quota.
    key: String,
    kind: Kind,
    limit: f64,
    /// What this request takes from it.
    amount: f64,
    /// Said in messages: `tenant uid:1000`, `tenant uid:1000 on model m`, `team research`.
    whose: String,
    /// Whose quota it is, in the `x-slotgate-quota-scope` header of its refusal: `tenant`,
    /// `model` (a tenant's on one model), `team` or `key`.
    scope: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tokens,
    Requests,
    /// Money, in the price's currency.
    Cost,
}

impl Kind {
    /// The first part of its host key: `tokens:alice`, `cost:team:research`.
    fn key(self) -> &'static str {
        match self {
            Kind::Tokens => "tokens",
            Kind::Requests => "requests",
            Kind::Cost => "cost",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Tokens => "token",
            Kind::Requests => "request",
            Kind::Cost => "cost",
        }
    }

    /// `amount` of it, for a message: `300 tokens`, `1 request`, `0.25 EUR`.
    fn amount(self, amount: f64, currency: &str) -> String {
        match self {
            Kind::Cost => money(amount, currency),
            _ => format!("{amount:.0} {}s", self.name()),
        }
    }

    /// A limit of it: `300`, `5.00 EUR`.
    fn limit(self, limit: f64, currency: &str) -> String {
        match self {
            Kind::Cost => money(limit, currency),
            _ => format!("{limit:.0}"),
        }
    }
}

/// `0.000516 EUR`, `5.00 EUR`: to the millionth, at least to the cent.
fn money(amount: f64, currency: &str) -> String {
    let text = format!("{amount:.6}");
    let text = text.trim_end_matches('0');
    let text = match text.split_once('.') {
        Some((_, cents)) if cents.len() < 2 => format!("{text}{}", "0".repeat(2 - cents.len())),
        _ => text.to_owned(),
    };
    format!("{text} {currency}")
}

/// Whom a request is charged to.
fn tenant(request: &RequestSummary, s: &Settings) -> String {
    request.tenant_key(s.tenant_header.as_deref())
}

/// What a request is charged up front: its prompt (exact when slotgate counted it, else estimated)
/// plus the most it may generate.
fn estimate(request: &RequestSummary, s: &Settings) -> u64 {
    let output = request.max_tokens.unwrap_or(s.default_max_tokens);
    request.prompt_tokens_best().saturating_add(output)
}

/// What a request may cost up front, in its price's currency: its prompt as if none of it were
/// cached, and the most it may generate. Nothing for a model without a price.
fn estimate_cost(request: &RequestSummary, s: &Settings) -> Option<f64> {
    let output = request.max_tokens.unwrap_or(s.default_max_tokens);
    let price = request.price.as_ref()?;
    Some(price.most(request.prompt_tokens_best(), output))
}

/// Whether a request reached llama-server: otherwise it used nothing.
fn reached(c: &Completion) -> bool {
    c.prompt_tokens > 0 || c.completion_tokens > 0 || c.upstream_ms > 0
}

/// The tokens a request really counts for (its cached prompt tokens at the operator's weight);
/// nothing if it never reached llama-server.
fn usage(c: &Completion) -> Option<u64> {
    if !reached(c) {
        return None;
    }
    let prompt = match c.prompt_tokens {
        0 => c.request.prompt_tokens_best(),
        n => n,
    };
    Some(c.counted_tokens(prompt))
}

/// The quotas `request` is charged to, tenant's first.
fn charges(request: &RequestSummary, s: &Settings) -> Vec<Charge> {
    let tenant = tenant(request, s);
    let own = s.tenants.get(&tenant).copied().unwrap_or(Limits {
        tokens: s.tokens,
        requests: s.requests,
        cost: s.cost,
    });
    let tokens = estimate(request, s) as f64;
    let money = estimate_cost(request, s);
    let mut out = Vec::with_capacity(4);
    // An operator's limit (the quota admin API) replaces the configured one.
    let in_force = |key: &str, limit: f64| host::quota_limit(key, &s.period, limit);
    let mut add = |key: &str, limits: Limits, whose: String, scope: &'static str| {
        // A model without a price costs nothing: its requests are not charged to money quotas.
        let kinds = [
            (Kind::Tokens, limits.tokens.map(|l| l as f64), Some(tokens)),
            (Kind::Requests, limits.requests.map(|l| l as f64), Some(1.0)),
            (Kind::Cost, limits.cost, money),
        ];
        for (kind, limit, amount) in kinds {
            let (Some(limit), Some(amount)) = (limit, amount) else {
                continue;
            };
            let key = format!("{}:{key}", kind.key());
            out.push(Charge {
                limit: in_force(&key, limit),
                key,
                kind,
                amount,
                whose: whose.clone(),
                scope,
            });
        }
    };
    add(&tenant, own, format!("tenant {tenant}"), "tenant");
    if let Some((model, limits)) = request
        .model
        .as_ref()
        .and_then(|m| s.models.get_key_value(m))
    {
        add(
            &format!("{tenant}\u{1f}{model}"),
            *limits,
            format!("tenant {tenant} on model {model}"),
            "model",
        );
    }
    if let Some((team, limits)) = request.team.as_ref().and_then(|t| s.teams.get_key_value(t)) {
        add(
            &format!("team:{team}"),
            *limits,
            format!("team {team}"),
            "team",
        );
    }
    if let Some((id, limits)) = request
        .key_id
        .as_ref()
        .and_then(|k| s.keys.get_key_value(k))
    {
        add(&format!("key:{id}"), *limits, format!("key {id}"), "key");
    }
    out
}

/// "daily" for `day`, ...
fn adjective(period: &str) -> &'static str {
    match Period::parse(period).map(|p| p.span) {
        Ok(Span::Hour) => "hourly",
        Ok(Span::Day) => "daily",
        Ok(Span::Week) => "weekly",
        _ => "monthly",
    }
}

/// The allowance left after this request, for the rate-limit headers: of each kind, the quota
/// with the least left.
fn allowance(charges: &[Charge], period: &str, reset_ms: i64) -> RateLimits {
    let mut limits = RateLimits::default();
    for c in charges {
        let left = host::quota_level(&c.key, period, c.limit).max(0.0) as u64;
        let this = RateLimit {
            limit: c.limit as u64,
            remaining: left,
            reset_unix_ms: reset_ms.max(0) as u64,
        };
        // Neither OpenAI's nor Anthropic's headers have a name for money.
        let slot = match c.kind {
            Kind::Tokens => &mut limits.tokens,
            Kind::Requests => &mut limits.requests,
            Kind::Cost => continue,
        };
        if slot.is_none_or(|s| left < s.remaining) {
            *slot = Some(this);
        }
    }
    limits
}

/// A Unix time as `YYYY-MM-DDTHH:MM:SSZ` (days to civil dates: Howard Hinnant's algorithm).
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl Policy for Quota {
    type Settings = Settings;

    fn validate(s: &Settings) -> Result<(), String> {
        Period::parse(&s.period)?;
        if !(0.0..=1.0).contains(&s.soft_limit) {
            return Err("soft_limit must be a share between 0 and 1".into());
        }
        if let Some(h) = &s.tenant_header {
            check_tenant_header(h)?;
        }
        for tenant in s.tenants.keys() {
            check_tenant(tenant, s.tenant_header.is_some())?;
        }
        for team in s.teams.keys() {
            if !slotgate_sdk::is_tenant_name(team) {
                return Err(format!(
                    "team `{team}` is not a team's name (1 to 64 of A-Z a-z 0-9 . _ @ -)"
                ));
            }
        }
        for id in s.keys.keys() {
            let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
            if id.len() != 12 || !id.bytes().all(hex) {
                return Err(format!(
                    "key `{id}` is not a key id (12 hex digits, as `slotgate key list` shows it)"
                ));
            }
        }
        let everyone = Limits {
            tokens: s.tokens,
            requests: s.requests,
            cost: s.cost,
        };
        let all = || {
            std::iter::once(&everyone)
                .chain(s.tenants.values())
                .chain(s.models.values())
                .chain(s.teams.values())
                .chain(s.keys.values())
        };
        if let Some(bad) = all()
            .filter_map(|l| l.cost)
            .find(|c| !(c.is_finite() && *c >= 0.0))
        {
            return Err(format!(
                "cost {bad} is not an amount of money (0 or more, in the currency of [prices])"
            ));
        }
        if !all().any(Limits::any) {
            return Err(
                "no quota: set tokens, requests or cost (for everyone, a tenant or a model)".into(),
            );
        }
        Ok(())
    }

    fn evaluate(input: &EvaluateInput, s: &Settings) -> Decision {
        let charges = charges(&input.request, s);
        let period = s.period.as_str();
        let reset = host::quota_reset_ms(period);
        let currency = input.request.price.as_ref().map_or("", |p| &p.currency);
        for c in &charges {
            // A limit an operator set to 0 is a spent quota, not a request too large for it.
            if c.amount > c.limit && c.limit > 0.0 {
                let what = match c.kind {
                    Kind::Cost => "cost",
                    _ => "use",
                };
                return Decision::forbidden(format!(
                    "this request may {what} {}, more than the {} {} quota of {} of {}: \
                     lower max_tokens",
                    Kind::amount(c.kind, c.amount, currency),
                    adjective(period),
                    c.kind.name(),
                    c.kind.limit(c.limit, currency),
                    c.whose
                ));
            }
        }
        for (i, c) in charges.iter().enumerate() {
            let before = host::quota_level(&c.key, period, c.limit);
            let wait = host::quota_take(&c.key, period, c.limit, c.amount);
            if wait > 0.0 {
                // Nothing is taken unless everything is: what the earlier quotas gave goes back.
                for taken in &charges[..i] {
                    host::quota_refund(&taken.key, period, taken.limit, taken.amount, 0);
                }
                // Something is left, only less than this request may use: a smaller one passes.
                let some_left = match c.kind {
                    Kind::Cost => before > 0.0,
                    _ => before >= 1.0,
                };
                let short = some_left && c.amount <= c.limit;
                let left = match c.kind {
                    Kind::Cost => money(before, currency),
                    _ => format!("{:.0}", before.floor()),
                };
                let message = match short {
                    true => format!(
                        "this request may use {}, more than the {left} left of the {} {} quota \
                         of {} of {}: ask for fewer (lower max_tokens); it is whole again at {}",
                        c.kind.amount(c.amount, currency),
                        adjective(period),
                        c.kind.name(),
                        c.kind.limit(c.limit, currency),
                        c.whose,
                        utc(reset)
                    ),
                    false => format!(
                        "the {} {} quota of {} of {} is spent; it is whole again at {}",
                        adjective(period),
                        c.kind.name(),
                        c.kind.limit(c.limit, currency),
                        c.whose,
                        utc(reset)
                    ),
                };
                let mut d = Decision::quota_exceeded(
                    message,
                    // The window's end (also when `wait` is infinite: a limit of 0).
                    ((reset - host::wall_ms()).max(0) as f64 / 1000.0)
                        .ceil()
                        .max(1.0) as u64,
                );
                if short {
                    d.reason = Some("quota_insufficient".into());
                }
                d.mutations
                    .response_headers
                    .insert("x-slotgate-quota-scope".into(), c.scope.into());
                d.rate_limits = allowance(&charges, period, reset);
                return d;
            }
            let soft = s.soft_limit * c.limit;
            let used_before = c.limit - before;
            if s.soft_limit < 1.0 && used_before < soft && used_before + c.amount >= soft {
                host::event("soft_limit");
                host::log(
                    Level::Warn,
                    &format!(
                        "{} has used {:.0}% of its {} {} quota of {}",
                        c.whose,
                        s.soft_limit * 100.0,
                        adjective(period),
                        c.kind.name(),
                        c.kind.limit(c.limit, currency)
                    ),
                );
            }
        }
        Decision {
            cost: Some(estimate(&input.request, s)),
            tenant: Some(tenant(&input.request, s)),
            rate_limits: allowance(&charges, period, reset),
            ..Decision::allow()
        }
    }

    fn on_complete(c: &Completion, s: &Settings) {
        if c.decision.verdict == Verdict::Deny {
            return;
        }
        let at = c.evaluated_unix_ms as i64;
        let used = usage(c);
        for q in charges(&c.request, s) {
            // The estimate less the usage (negative: more was used, and is charged); a request that
            // never reached llama-server gives back everything, its place among the requests too.
            // Money is settled by the cost the usage ledger booked (cached tokens at their price).
            let back = match (q.kind, used) {
                (Kind::Tokens, Some(n)) => q.amount - n as f64,
                (Kind::Requests, Some(_)) => 0.0,
                (Kind::Cost, Some(_)) => q.amount - c.cost.unwrap_or(0.0),
                (_, None) => q.amount,
            };
            if back != 0.0 {
                host::quota_refund(&q.key, &s.period, q.limit, back, at);
            }
        }
    }
}

#[cfg(not(feature = "v2"))]
slotgate_sdk::export_policy!(Quota, on_complete);
#[cfg(feature = "v2")]
slotgate_sdk::export_component!(Quota, on_complete);

#[cfg(test)]
mod tests {
    use super::*;
    use slotgate_sdk::testing::{self, run};

    /// 2027-01-15T08:00:00Z, a Friday: the default input's time.
    const NOW: i64 = 1_800_000_000_000;
    const ALICE: &str = r#""peer": {"uid": 1000, "gid": 1000}"#;
    const BOB: &str = r#""peer": {"uid": 1001, "gid": 1001}"#;

    fn req(who: &str, prompt: u64, max_tokens: u64, settings: &str) -> String {
        format!(
            r#"{{"request": {{{who}, "model": "m", "prompt_tokens_estimate": {prompt}, "max_tokens": {max_tokens}}},
                "settings": {settings}}}"#
        )
    }

    fn done(who: &str, prompt: u64, max_tokens: u64, used: u64, settings: &str) -> String {
        format!(
            r#"{{"request": {{{who}, "model": "m", "prompt_tokens_estimate": {prompt}, "max_tokens": {max_tokens}}},
                "settings": {settings}, "prompt_tokens": {used}, "completion_tokens": 0,
                "upstream_ms": 10, "evaluated_unix_ms": {}}}"#,
            host::wall_ms()
        )
    }

    const DAY: &str = r#"{"period": "day", "tokens": 1000, "requests": 3}"#;

    #[test]
    fn a_spent_quota_is_refused_until_the_day_ends_and_not_retried() {
        testing::reset();
        let d = run::<Quota>(&req(ALICE, 100, 500, DAY));
        assert!(d.is_allowed());
        let tokens = d.rate_limits.tokens.unwrap();
        assert_eq!((tokens.limit, tokens.remaining), (1000, 400));
        assert_eq!(d.rate_limits.requests.unwrap().remaining, 2);
        // Midnight UTC after 2027-01-15T08:00:00Z.
        let midnight = (NOW / 86_400_000 + 1) * 86_400_000;
        assert_eq!(tokens.reset_unix_ms, midnight as u64);
        // 600 asked, 400 left: told both, and that a smaller request passes; not "spent".
        let d = run::<Quota>(&req(ALICE, 100, 500, DAY));
        assert_eq!(d.status, Some(429));
        assert_eq!(d.reason.as_deref(), Some("quota_insufficient"));
        let said = d.message.clone().unwrap();
        assert!(
            said.contains("600 tokens") && said.contains("400 left") && !said.contains("spent"),
            "{said}"
        );
        assert!(run::<Quota>(&req(ALICE, 100, 300, DAY)).is_allowed());
        // Now spent.
        let d = run::<Quota>(&req(ALICE, 100, 500, DAY));
        assert_eq!(d.status, Some(429));
        assert_eq!(d.reason.as_deref(), Some("quota_exceeded"));
        assert_eq!(d.should_retry, Some(false));
        assert_eq!(d.retry_after_seconds, Some(16 * 3600));
        assert!(
            d.message
                .as_deref()
                .unwrap()
                .contains("2027-01-16T00:00:00Z"),
            "{:?}",
            d.message
        );
        assert_eq!(d.rate_limits.tokens.unwrap().remaining, 0);
        assert_eq!(
            d.rate_limits.requests.unwrap().remaining,
            1,
            "a refused request takes nothing"
        );
        assert!(
            run::<Quota>(&req(BOB, 100, 500, DAY)).is_allowed(),
            "quotas are per tenant"
        );
        testing::set_wall_ms(midnight);
        assert!(run::<Quota>(&req(ALICE, 100, 500, DAY)).is_allowed());
    }

    #[test]
    fn usage_settles_the_estimate_in_the_window_it_was_taken_from() {
        testing::reset();
        assert!(run::<Quota>(&req(ALICE, 100, 800, DAY)).is_allowed());
        testing::complete::<Quota>(&done(ALICE, 100, 800, 150, DAY));
        let d = run::<Quota>(&req(ALICE, 100, 700, DAY));
        assert!(d.is_allowed(), "750 came back");
        assert_eq!(d.rate_limits.tokens.unwrap().remaining, 50);
    }

    #[test]
    fn requests_and_model_quotas_bind_too() {
        testing::reset();
        let s = r#"{"period": "hour", "requests": 2, "models": {"m": {"tokens": 300}}}"#;
        assert!(run::<Quota>(&req(ALICE, 50, 150, s)).is_allowed());
        let d = run::<Quota>(&req(ALICE, 50, 150, s));
        assert_eq!(d.status, Some(429), "the model's 300 tokens are spent");
        assert!(d.message.unwrap().contains("on model m"));
        let d = run::<Quota>(&req(ALICE, 10, 10, s));
        assert!(d.is_allowed());
        assert_eq!(d.rate_limits.requests.unwrap().remaining, 0);
        let d = run::<Quota>(&req(ALICE, 1, 1, s));
        assert!(d.message.unwrap().contains("hourly request quota of 2"));
    }

    #[test]
    fn an_operators_limit_replaces_the_configured_one() {
        testing::reset();
        let s = r#"{"period": "day", "requests": 1}"#;
        assert!(run::<Quota>(&req(ALICE, 1, 1, s)).is_allowed());
        assert!(!run::<Quota>(&req(ALICE, 1, 1, s)).is_allowed());
        testing::set_quota_limit("requests:uid:1000", "day", Some(3.0));
        let d = run::<Quota>(&req(ALICE, 1, 1, s));
        assert!(d.is_allowed());
        let r = d.rate_limits.requests.unwrap();
        assert_eq!((r.limit, r.remaining), (3, 1), "one used before, one now");
    }

    #[test]
    fn an_operators_limit_of_zero_is_a_spent_quota_until_the_window_ends() {
        testing::reset();
        let s = r#"{"period": "hour", "requests": 5}"#;
        testing::set_quota_limit("requests:uid:1000", "hour", Some(0.0));
        let d = run::<Quota>(&req(ALICE, 1, 1, s));
        assert_eq!(d.status, Some(429));
        assert_eq!(d.reason.as_deref(), Some("quota_exceeded"));
        // 08:00 on the hour: a whole hour to go.
        assert_eq!(d.retry_after_seconds, Some(3600));
    }

    #[test]
    fn the_soft_limit_warns_once_per_window() {
        testing::reset();
        testing::take_events();
        let s = r#"{"period": "day", "tokens": 1000, "soft_limit": 0.5}"#;
        assert!(run::<Quota>(&req(ALICE, 0, 400, s)).is_allowed());
        assert!(testing::take_events().is_empty());
        assert!(run::<Quota>(&req(ALICE, 0, 200, s)).is_allowed());
        assert_eq!(testing::take_events(), ["soft_limit"]);
        assert!(testing::take_logs()
            .iter()
            .any(|(l, m)| *l == Level::Warn && m.contains("50%")));
        assert!(run::<Quota>(&req(ALICE, 0, 200, s)).is_allowed());
        assert!(testing::take_events().is_empty(), "once");
    }

    #[test]
    fn a_request_over_the_whole_quota_is_forbidden_and_bad_settings_are_refused() {
        testing::reset();
        let d = run::<Quota>(&req(ALICE, 100, 5000, DAY));
        assert_eq!(d.status, Some(403));
        assert!(testing::validate::<Quota>(DAY).valid);
        for bad in [
            r#"{"period": "fortnight", "tokens": 1}"#,
            r#"{"period": "day"}"#,
            r#"{"period": "day", "tokens": 1, "soft_limit": 2}"#,
            r#"{"period": "day", "tokens": 1, "tenants": {"bob:x": {}}}"#,
        ] {
            assert!(!testing::validate::<Quota>(bad).valid, "{bad}");
        }
    }

    #[test]
    fn a_team_quota_is_shared_by_its_tenants_and_its_refusal_names_the_team() {
        testing::reset();
        let settings =
            r#"{"period": "day", "requests": 10, "teams": {"research": {"requests": 3}}}"#;
        let who = |tenant: &str| format!(r#""tenant": "{tenant}", "team": "research""#);
        for tenant in ["alice", "alice", "bob"] {
            assert!(run::<Quota>(&req(&who(tenant), 10, 10, settings)).is_allowed());
        }
        let d = run::<Quota>(&req(&who("bob"), 10, 10, settings));
        assert_eq!(d.status, Some(429));
        let said = d.message.clone().unwrap();
        assert!(said.contains("of team research is spent"), "{said}");
        assert_eq!(
            d.mutations
                .response_headers
                .get("x-slotgate-quota-scope")
                .map(String::as_str),
            Some("team")
        );
        // Another team's tenant, and a tenant of none, are not held by it.
        let other = r#""tenant": "carol", "team": "ops""#;
        assert!(run::<Quota>(&req(other, 10, 10, settings)).is_allowed());
        assert!(run::<Quota>(&req(r#""tenant": "dan""#, 10, 10, settings)).is_allowed());
        for bad in [
            r#"{"period": "day", "teams": {"a b": {"tokens": 1}}}"#,
            r#"{"period": "day", "keys": {"nothex": {"tokens": 1}}}"#,
        ] {
            assert!(!testing::validate::<Quota>(bad).valid, "{bad}");
        }
    }

    /// EUR 1 per million prompt tokens, 0.1 cached, 4 generated.
    const PRICE: &str =
        r#""price": {"currency": "EUR", "input": 1.0, "cached_input": 0.1, "output": 4.0}"#;

    fn priced(who: &str, prompt: u64, max_tokens: u64, settings: &str) -> String {
        req(&format!("{who}, {PRICE}"), prompt, max_tokens, settings)
    }

    #[test]
    fn a_money_quota_is_charged_the_most_a_request_may_cost_and_settled_by_the_ledgers_cost() {
        testing::reset();
        // 0.01 EUR a day: 1000 prompt tokens and 1000 generated may cost 0.005.
        let s =
            r#"{"period": "day@Europe/Berlin", "cost": 0.01, "teams": {"research": {"cost": 1}}}"#;
        let who = format!(r#"{ALICE}, "team": "research""#);
        let d = run::<Quota>(&priced(&who, 1000, 1000, s));
        assert!(d.is_allowed());
        assert_eq!(d.rate_limits, RateLimits::default(), "no API names money");
        assert!(run::<Quota>(&priced(&who, 1000, 1000, s)).is_allowed());
        // Spent: refused with the scope, the amount and the window's end (midnight in Berlin).
        let d = run::<Quota>(&priced(&who, 1000, 1000, s));
        assert_eq!(
            (d.status, d.reason.as_deref()),
            (Some(429), Some("quota_exceeded"))
        );
        let said = d.message.clone().unwrap();
        assert!(
            said.contains("daily cost quota of 0.01 EUR of tenant uid:1000 is spent")
                && said.contains("2027-01-15T23:00:00Z"),
            "{said}"
        );
        assert_eq!(
            d.mutations
                .response_headers
                .get("x-slotgate-quota-scope")
                .map(String::as_str),
            Some("tenant")
        );
        // The first request used 1000 prompt tokens, 900 of them cached, and generated 100: the
        // ledger booked 0.0001 + 0.00009 + 0.0004 = 0.00059; the rest of its 0.005 comes back.
        let done = format!(
            r#"{{"request": {{{who}, {PRICE}, "model": "m", "prompt_tokens_estimate": 1000, "max_tokens": 1000}},
                "settings": {s}, "prompt_tokens": 1000, "cached_tokens": 900, "completion_tokens": 100,
                "cost": 0.00059, "upstream_ms": 10, "evaluated_unix_ms": {}}}"#,
            host::wall_ms()
        );
        testing::complete::<Quota>(&done);
        let left = host::quota_level("cost:uid:1000", "day@Europe/Berlin", 0.01);
        assert!((left - (0.01 - 0.005 - 0.00059)).abs() < 1e-12, "{left}");
        // A model without a price costs nothing and is not held by the money quota.
        assert!(run::<Quota>(&req(&who, 1000, 1000, s)).is_allowed());
        // A request that could never fit is forbidden, in money.
        let d = run::<Quota>(&priced(&who, 1000, 10_000, s));
        assert_eq!(d.status, Some(403));
        assert!(d.message.unwrap().contains("may cost 0.041 EUR"));
        assert!(!testing::validate::<Quota>(r#"{"period": "day", "cost": -1}"#).valid);
    }

    #[test]
    fn cached_tokens_count_at_the_operators_weight_in_token_quotas() {
        testing::reset();
        let s = r#"{"period": "day", "tokens": 10000}"#;
        assert!(run::<Quota>(&req(ALICE, 8000, 1000, s)).is_allowed());
        // 8000 prompt tokens, 7000 from the cache at a tenth: 1000 + 700 + 500 generated.
        let done = format!(
            r#"{{"request": {{{ALICE}, "model": "m", "prompt_tokens_estimate": 8000, "max_tokens": 1000}},
                "settings": {s}, "prompt_tokens": 8000, "cached_tokens": 7000, "cached_weight": 0.1,
                "completion_tokens": 500, "upstream_ms": 10, "evaluated_unix_ms": {}}}"#,
            host::wall_ms()
        );
        testing::complete::<Quota>(&done);
        let d = run::<Quota>(&req(ALICE, 1, 1, s));
        assert_eq!(d.rate_limits.tokens.unwrap().remaining, 10000 - 2200 - 2);
    }

    #[test]
    fn utc_times_print_like_rfc_3339() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(NOW), "2027-01-15T08:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
