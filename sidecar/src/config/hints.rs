//! What a client's priority fields mean (docs/sessions.md#priority-and-slo-hints): each API's
//! `service_tier` mapped to a priority hint by a rule the operator may change; and when a router in
//! front is told the load (`load-report`, docs/observability.md).

use std::fmt;
use std::str::FromStr;

/// `service_tier` values (OpenAI's `auto`, `default`, `flex`, `scale`, `priority`; Anthropic's
/// `auto`, `standard_only`) and the priority hint each stands for (lower is more urgent). A tier
/// the rule does not name gives no hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierPriorities(Vec<(String, i64)>);

impl Default for TierPriorities {
    /// `priority` one level above the rest, `flex` (OpenAI's slower, cheaper tier) ten below.
    fn default() -> Self {
        TierPriorities(
            [
                ("priority", -1),
                ("default", 0),
                ("auto", 0),
                ("standard_only", 0),
                ("scale", 0),
                ("flex", 10),
            ]
            .into_iter()
            .map(|(t, p)| (t.to_owned(), p))
            .collect(),
        )
    }
}

impl TierPriorities {
    /// The hint a tier stands for.
    pub fn of(&self, tier: &str) -> Option<i64> {
        self.0.iter().find(|(t, _)| t == tier).map(|(_, p)| *p)
    }
}

impl FromStr for TierPriorities {
    type Err = String;
    /// `TIER=P,TIER=P`; `none` maps no tier.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim() == "none" {
            return Ok(TierPriorities(Vec::new()));
        }
        let mut out: Vec<(String, i64)> = Vec::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (tier, p) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not TIER=PRIORITY, e.g. flex=10"))?;
            let tier = tier.trim();
            if tier.is_empty() || !tier.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("`{tier}` is not a service tier name"));
            }
            let p: i64 = p
                .trim()
                .parse()
                .map_err(|_| format!("`{pair}`: the priority must be a whole number"))?;
            if out.iter().any(|(t, _)| t == tier) {
                return Err(format!("service tier `{tier}` is mapped twice"));
            }
            out.push((tier.to_owned(), p));
        }
        Ok(TierPriorities(out))
    }
}

impl fmt::Display for TierPriorities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, (tier, p)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{tier}={p}")?;
        }
        Ok(())
    }
}
string_serde!(TierPriorities);

/// When a response carries an ORCA load report (`endpoint-load-metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadReport {
    Never,
    /// When the request asks for one (`endpoint-load-metrics-format`), as vLLM answers.
    Asked,
    /// On every response of a slot route (Envoy reads them without asking).
    Always,
}

impl FromStr for LoadReport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "never" => Ok(LoadReport::Never),
            "asked" => Ok(LoadReport::Asked),
            "always" => Ok(LoadReport::Always),
            _ => Err(format!(
                "`{s}` is not a load report setting; use never, asked or always"
            )),
        }
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LoadReport::Never => "never",
            LoadReport::Asked => "asked",
            LoadReport::Always => "always",
        })
    }
}
string_serde!(LoadReport);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_reads_and_prints_back() {
        let d = TierPriorities::default();
        assert_eq!(d.to_string().parse::<TierPriorities>().unwrap(), d);
        assert_eq!(
            (d.of("flex"), d.of("priority"), d.of("gold")),
            (Some(10), Some(-1), None)
        );
        let mine: TierPriorities = " flex = 3 , priority=-2".parse().unwrap();
        assert_eq!(mine.to_string(), "flex=3,priority=-2");
        assert_eq!("none".parse::<TierPriorities>().unwrap().of("flex"), None);
        for bad in ["flex", "flex=x", "fl ex=1", "flex=1,flex=2"] {
            assert!(bad.parse::<TierPriorities>().is_err(), "{bad}");
        }
    }
}
