//! Tenant priority: maps API keys and Unix-socket uids to a named tenant with a priority class, and
//! clamps the client's own priority hint to the tenant's ceiling (lower is served earlier).

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use slotgate_sdk::{is_hashed_key, Decision, EvaluateInput, Identity, Policy, RequestSummary};

pub struct TenantPriority;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Tenants by name.
    #[serde(default)]
    pub tenants: BTreeMap<String, Tenant>,
    /// The class of callers no tenant lists.
    #[serde(default)]
    pub unknown: Class,
    /// Refuse (403) callers no tenant lists, instead of giving them the `unknown` class.
    #[serde(default)]
    pub deny_unknown: bool,
    /// A response header that names the tenant, e.g. `x-tenant`.
    #[serde(default)]
    pub tenant_header: Option<String>,
    /// How much less urgent an agent's subagent is than its root agent: added to the priority of
    /// a request whose client names a parent agent (docs/sessions.md). 0 (the default) ranks them
    /// alike; 1 serves every root agent's waiting request before its subagents'.
    #[serde(default)]
    pub subagent_step: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// Hashed API keys (`sha256:<hex>`, as `slotgate hash-key KEY` prints them).
    #[serde(default)]
    pub api_keys: Vec<String>,
    /// Unix-socket peer uids, used when the request carries no API key that a tenant lists.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Priority class: the priority of a request without a hint.
    pub priority: i64,
    /// The most urgent (lowest) priority a hint may ask for; defaults to `priority`.
    #[serde(default)]
    pub ceiling: Option<i64>,
    /// How long the tenant's answers are worth waiting for, in milliseconds (an IDE's completions:
    /// 2000): its requests must start within it or leave the queue. A client's own
    /// `X-Slotgate-Deadline-Ms` may cut it further, never extend it.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Class {
    /// Tenant name for fair scheduling.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub ceiling: Option<i64>,
    #[serde(default)]
    pub deadline_ms: Option<u64>,
}

impl Default for Class {
    fn default() -> Self {
        Class {
            tenant: default_tenant(),
            priority: 0,
            ceiling: None,
            deadline_ms: None,
        }
    }
}

fn default_tenant() -> String {
    "default".into()
}

/// Who a request is: its tenant's name, class and ceiling.
struct Placement<'a> {
    tenant: &'a str,
    priority: i64,
    ceiling: i64,
    deadline_ms: Option<u64>,
}

/// The tenant listing the request's API key, else the one listing its uid.
fn place<'a>(request: &'a RequestSummary, s: &'a Settings) -> Option<Placement<'a>> {
    // The tenant slotgate named (a key it issued) is the tenant: its class is the one listed
    // under its name, else the unknown callers' (it is known to slotgate, so never denied).
    if let Some(name) = request.tenant.as_deref() {
        return Some(match s.tenants.get(name) {
            Some(t) => Placement {
                tenant: name,
                priority: t.priority,
                ceiling: t.ceiling.unwrap_or(t.priority),
                deadline_ms: t.deadline_ms,
            },
            None => Placement {
                tenant: name,
                priority: s.unknown.priority,
                ceiling: s.unknown.ceiling.unwrap_or(s.unknown.priority),
                deadline_ms: s.unknown.deadline_ms,
            },
        });
    }
    let by_key = request.api_key.as_deref().and_then(|key| {
        s.tenants
            .iter()
            .find(|(_, t)| t.api_keys.iter().any(|k| k == key))
    });
    let by_uid = || {
        let uid = request.peer?.uid;
        s.tenants.iter().find(|(_, t)| t.uids.contains(&uid))
    };
    by_key.or_else(by_uid).map(|(name, t)| Placement {
        tenant: name,
        priority: t.priority,
        ceiling: t.ceiling.unwrap_or(t.priority),
        deadline_ms: t.deadline_ms,
    })
}

fn check_class(
    what: &str,
    priority: i64,
    ceiling: Option<i64>,
    deadline_ms: Option<u64>,
) -> Result<(), String> {
    if deadline_ms == Some(0) {
        return Err(format!(
            "{what}: deadline_ms 0 leaves no time at all; give milliseconds from 1, or leave it out"
        ));
    }
    match ceiling {
        Some(c) if c > priority => Err(format!(
            "{what}: ceiling {c} is less urgent than its own priority {priority} (lower is more urgent)"
        )),
        _ => Ok(()),
    }
}

impl Policy for TenantPriority {
    type Settings = Settings;

    fn validate(s: &Settings) -> Result<(), String> {
        let mut owners: HashMap<String, &str> = HashMap::new();
        for (name, t) in &s.tenants {
            if name.is_empty() {
                return Err("a tenant name is empty".into());
            }
            check_class(
                &format!("tenant `{name}`"),
                t.priority,
                t.ceiling,
                t.deadline_ms,
            )?;
            let ids = t
                .api_keys
                .iter()
                .map(|k| Identity::ApiKey(k))
                .chain(t.uids.iter().map(|&u| Identity::Uid(u)));
            for id in ids {
                if let Identity::ApiKey(k) = id {
                    if !is_hashed_key(k) {
                        return Err(format!(
                            "tenant `{name}`: `{k}` is not a hashed key: list `slotgate hash-key KEY` \
                             output, never the key"
                        ));
                    }
                }
                if let Some(other) = owners.insert(id.to_string(), name) {
                    return Err(format!("{id} is listed by both `{other}` and `{name}`"));
                }
            }
        }
        if s.unknown.tenant.is_empty() {
            return Err("unknown.tenant is empty".into());
        }
        check_class(
            "unknown",
            s.unknown.priority,
            s.unknown.ceiling,
            s.unknown.deadline_ms,
        )?;
        if s.subagent_step < 0 {
            return Err(format!(
                "subagent_step {} would serve subagents before their root agent; give 0 or more",
                s.subagent_step
            ));
        }
        if let Some(h) = &s.tenant_header {
            let token = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
            if h.is_empty() || !h.bytes().all(token) {
                return Err(format!(
                    "tenant_header `{h}` is not a lower-case header name"
                ));
            }
        }
        Ok(())
    }

    fn evaluate(input: &EvaluateInput, s: &Settings) -> Decision {
        let request = &input.request;
        let placement = match place(request, s) {
            Some(p) => p,
            None if s.deny_unknown => {
                return Decision::forbidden(format!("{} is not a known tenant", request.identity()))
            }
            None => Placement {
                tenant: &s.unknown.tenant,
                priority: s.unknown.priority,
                ceiling: s.unknown.ceiling.unwrap_or(s.unknown.priority),
                deadline_ms: s.unknown.deadline_ms,
            },
        };
        // A hint may always ask to wait longer; it may not jump above the tenant's ceiling.
        let priority = match request.priority_hint {
            Some(hint) => hint.max(placement.ceiling),
            None => placement.priority,
        };
        // A subagent waits behind the agent that started it, whatever its hint asked.
        let priority = match request.is_subagent() {
            true => priority.saturating_add(s.subagent_step),
            false => priority,
        };
        let mut decision = Decision {
            priority: Some(priority),
            tenant: Some(placement.tenant.to_owned()),
            deadline_ms: placement.deadline_ms,
            ..Decision::allow()
        };
        if let Some(header) = &s.tenant_header {
            decision
                .mutations
                .response_headers
                .insert(header.clone(), placement.tenant.to_owned());
        }
        decision
    }
}

#[cfg(not(feature = "v2"))]
slotgate_sdk::export_policy!(TenantPriority);
#[cfg(feature = "v2")]
slotgate_sdk::export_component!(TenantPriority);

#[cfg(test)]
mod tests {
    use super::*;
    use slotgate_sdk::testing::{self, run};
    use slotgate_sdk::Verdict;

    fn key(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn settings() -> String {
        format!(
            r#""settings": {{
                "tenants": {{
                    "chat": {{"api_keys": ["{}"], "uids": [1000], "priority": -5, "ceiling": -10, "deadline_ms": 2000}},
                    "batch": {{"uids": [1001], "priority": 10}}
                }},
                "unknown": {{"tenant": "public", "priority": 5, "ceiling": 0}},
                "tenant_header": "x-tenant",
                "subagent_step": 1
            }}"#,
            key(1)
        )
    }

    fn eval(request: &str) -> Decision {
        run::<TenantPriority>(&format!(r#"{{"request": {{{request}}}, {}}}"#, settings()))
    }

    const UID_1000: &str = r#""peer": {"uid": 1000, "gid": 1}"#;
    const UID_1001: &str = r#""peer": {"uid": 1001, "gid": 1}"#;

    #[test]
    fn keys_and_uids_map_to_tenants_and_classes() {
        let d = eval(&format!(r#""api_key": "{}""#, key(1)));
        assert_eq!((d.tenant.as_deref(), d.priority), (Some("chat"), Some(-5)));
        assert_eq!(d.mutations.response_headers["x-tenant"], "chat");
        let d = eval(UID_1000);
        assert_eq!((d.tenant.as_deref(), d.priority), (Some("chat"), Some(-5)));
        let d = eval(UID_1001);
        assert_eq!((d.tenant.as_deref(), d.priority), (Some("batch"), Some(10)));
        let d = eval(r#""method": "POST""#);
        assert_eq!((d.tenant.as_deref(), d.priority), (Some("public"), Some(5)));
    }

    #[test]
    fn a_listed_key_wins_over_the_uid_and_an_unlisted_one_falls_back_to_it() {
        let d = eval(&format!(r#""api_key": "{}", {UID_1001}"#, key(1)));
        assert_eq!(d.tenant.as_deref(), Some("chat"));
        let d = eval(&format!(r#""api_key": "{}", {UID_1001}"#, key(9)));
        assert_eq!(d.tenant.as_deref(), Some("batch"));
        let d = eval(&format!(r#""api_key": "{}""#, key(9)));
        assert_eq!(d.tenant.as_deref(), Some("public"));
    }

    #[test]
    fn hints_are_clamped_to_the_ceiling_but_may_always_lower_urgency() {
        let hint = |who: &str, h: i64| eval(&format!(r#"{who}, "priority_hint": {h}"#)).priority;
        assert_eq!(hint(UID_1000, -100), Some(-10));
        assert_eq!(hint(UID_1000, -7), Some(-7));
        assert_eq!(
            hint(UID_1001, -100),
            Some(10),
            "ceiling defaults to the class"
        );
        assert_eq!(hint(UID_1001, 50), Some(50));
        assert_eq!(hint(r#""stream": true"#, -3), Some(0));
    }

    #[test]
    fn a_subagent_waits_behind_its_root_agent_whatever_its_hint() {
        let root = eval(&format!(
            r#"{UID_1000}, "session_id": "s", "agent_id": "a1""#
        ));
        let sub = eval(&format!(
            r#"{UID_1000}, "session_id": "s", "agent_id": "a2", "parent_agent_id": "a1""#
        ));
        assert_eq!((root.priority, sub.priority), (Some(-5), Some(-4)));
        let hinted = eval(&format!(
            r#"{UID_1000}, "parent_agent_id": "a1", "priority_hint": -100"#
        ));
        assert_eq!(hinted.priority, Some(-9), "the ceiling, then the step");
    }

    #[test]
    fn a_tenant_class_may_carry_a_deadline() {
        assert_eq!(eval(UID_1000).deadline_ms, Some(2000));
        assert_eq!(eval(UID_1001).deadline_ms, None);
    }

    #[test]
    fn unknown_callers_can_be_refused() {
        let input = r#"{"request": {"peer": {"uid": 4242, "gid": 1}},
                        "settings": {"deny_unknown": true, "tenants": {"a": {"uids": [1], "priority": 0}}}}"#;
        let d = run::<TenantPriority>(input);
        assert_eq!(d.verdict, Verdict::Deny);
        assert_eq!(d.status, Some(403));
        assert_eq!(d.message.as_deref(), Some("uid:4242 is not a known tenant"));
    }

    #[test]
    fn no_settings_put_everyone_in_one_default_class() {
        let d = run::<TenantPriority>(r#"{"request": {"priority_hint": -4}}"#);
        assert_eq!(
            (d.tenant.as_deref(), d.priority),
            (Some("default"), Some(0))
        );
        assert!(d.mutations.response_headers.is_empty());
    }

    #[test]
    fn settings_are_validated() {
        let example = include_str!("../settings.example.json");
        assert_eq!(
            testing::validate::<TenantPriority>(example),
            slotgate_sdk::SettingsValidation::ok()
        );
        let k = key(1);
        for bad in [
            r#"{"tenants": {"a": {"api_keys": ["sk-raw"], "priority": 0}}}"#.to_owned(),
            format!(
                r#"{{"tenants": {{"a": {{"api_keys": ["{k}"], "priority": 0}}, "b": {{"api_keys": ["{k}"], "priority": 1}}}}}}"#
            ),
            r#"{"tenants": {"a": {"uids": [7], "priority": 0}, "b": {"uids": [7], "priority": 0}}}"#.into(),
            r#"{"tenants": {"a": {"priority": 0, "ceiling": 3}}}"#.into(),
            r#"{"unknown": {"priority": 0, "ceiling": 1}}"#.into(),
            r#"{"tenants": {"a": {"uids": [7], "priority": 0, "deadline_ms": 0}}}"#.into(),
            r#"{"tenant_header": "X Tenant"}"#.into(),
            r#"{"tenants": {"a": {"uids": [7]}}}"#.into(),
            r#"{"tenant": {}}"#.into(),
            r#"{"subagent_step": -1}"#.into(),
        ] {
            let v = testing::validate::<TenantPriority>(&bad);
            assert!(!v.valid, "{bad} passed");
        }
    }

    #[test]
    fn fixtures() {
        testing::run_fixtures::<TenantPriority>(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"));
    }
}
