//! The caller's allowance as rate-limit headers, in the names of the API it speaks: OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (reset a duration, `6m0s`), which its
//! SDKs expose and many clients read, on every route but `/v1/messages`; Anthropic's
//! `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}` (reset an RFC 3339 time) there.

use std::collections::BTreeMap;

use slotgate_sdk::{RateLimit, RateLimits};

/// OpenAI's names and forms.
pub fn openai(limits: &RateLimits, now_ms: i64, out: &mut BTreeMap<String, String>) {
    for (kind, limit) in kinds(limits) {
        out.insert(format!("x-ratelimit-limit-{kind}"), limit.limit.to_string());
        out.insert(
            format!("x-ratelimit-remaining-{kind}"),
            limit.remaining.to_string(),
        );
        out.insert(
            format!("x-ratelimit-reset-{kind}"),
            duration(limit.reset_unix_ms as i64 - now_ms),
        );
    }
}

/// Anthropic's names and forms.
pub fn anthropic(limits: &RateLimits, out: &mut BTreeMap<String, String>) {
    for (kind, limit) in kinds(limits) {
        out.insert(
            format!("anthropic-ratelimit-{kind}-limit"),
            limit.limit.to_string(),
        );
        out.insert(
            format!("anthropic-ratelimit-{kind}-remaining"),
            limit.remaining.to_string(),
        );
        out.insert(
            format!("anthropic-ratelimit-{kind}-reset"),
            rfc3339(limit.reset_unix_ms as i64),
        );
    }
}

fn kinds(limits: &RateLimits) -> impl Iterator<Item = (&'static str, &RateLimit)> {
    [("requests", &limits.requests), ("tokens", &limits.tokens)]
        .into_iter()
        .filter_map(|(kind, l)| l.as_ref().map(|l| (kind, l)))
}

/// A wait as OpenAI writes it: `20ms` under a second, else whole seconds (rounded up) in hours,
/// minutes and seconds with the leading zero units left out: `12s`, `6m0s`, `1h0m0s`.
fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = (ms + 999) / 1000;
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// A Unix time in milliseconds as RFC 3339 in UTC, to the second (rounded up: never before it).
fn rfc3339(ms: i64) -> String {
    let secs = (ms + 999).div_euclid(1000);
    jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RateLimits {
        RateLimits {
            requests: Some(RateLimit {
                limit: 100,
                remaining: 40,
                reset_unix_ms: 1_800_000_360_000,
            }),
            tokens: None,
        }
    }

    #[test]
    fn openai_names_and_durations() {
        let mut h = BTreeMap::new();
        openai(&limits(), 1_800_000_000_000, &mut h);
        assert_eq!(h["x-ratelimit-limit-requests"], "100");
        assert_eq!(h["x-ratelimit-remaining-requests"], "40");
        assert_eq!(h["x-ratelimit-reset-requests"], "6m0s");
        assert_eq!(h.len(), 3, "no tokens reported, none sent");
        for (ms, text) in [
            (0, "0ms"),
            (20, "20ms"),
            (1_001, "2s"),
            (3_600_000, "1h0m0s"),
        ] {
            assert_eq!(duration(ms), text);
        }
    }

    #[test]
    fn anthropic_names_and_times() {
        let mut h = BTreeMap::new();
        anthropic(&limits(), &mut h);
        assert_eq!(h["anthropic-ratelimit-requests-limit"], "100");
        assert_eq!(h["anthropic-ratelimit-requests-remaining"], "40");
        assert_eq!(
            h["anthropic-ratelimit-requests-reset"],
            "2027-01-15T08:06:00Z"
        );
    }
}
