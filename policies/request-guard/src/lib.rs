//! Request guard: refuses endpoints and models that are not allowed and prompts that are too large,
//! caps (or refuses) `max_tokens`, and isolates tenants' prompt caches, all through the fixed
//! mutations the host applies.

use serde::Deserialize;
use slotgate_sdk::{Decision, EvaluateInput, Mutations, Policy};

pub struct RequestGuard;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The most tokens a request may generate.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// What a larger `max_tokens` gets.
    #[serde(default)]
    pub over_max_tokens: OverMaxTokens,
    /// Largest prompt, in characters.
    #[serde(default)]
    pub max_prompt_chars: Option<u64>,
    /// Largest prompt, in tokens as llama-server counts them. Setting it makes slotgate count every
    /// request's prompt before the chain decides (see `needs_prompt_tokens`): about 1-2 ms more to
    /// the first token of a request that would otherwise be forwarded at once.
    #[serde(default)]
    pub max_prompt_tokens: Option<u64>,
    /// Paths that are served (empty: all but `denied_paths`). `/x*` matches every path under `/x`.
    #[serde(default)]
    pub allowed_paths: Vec<String>,
    /// Paths that are refused, checked first.
    #[serde(default)]
    pub denied_paths: Vec<String>,
    /// Models that may be asked for by name (empty: any). A request naming none is let through:
    /// llama-server then answers with the model it has loaded.
    #[serde(default)]
    pub allowed_models: Vec<String>,
    /// Force `cache_prompt: false` and strip `id_slot`, so no tenant reuses another's prompt cache
    /// or picks its slot.
    #[serde(default)]
    pub cache_isolation: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverMaxTokens {
    /// Lower it to the limit.
    #[default]
    Cap,
    /// Refuse the request (403).
    Deny,
}

/// Exact match, or a prefix match for a pattern ending in `*`.
fn matches(pattern: &str, value: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => pattern == value,
    }
}

fn any_matches(patterns: &[String], value: &str) -> bool {
    patterns.iter().any(|p| matches(p, value))
}

impl Policy for RequestGuard {
    type Settings = Settings;

    fn validate(s: &Settings) -> Result<(), String> {
        let paths = s.allowed_paths.iter().chain(&s.denied_paths);
        if let Some(bad) = paths.into_iter().find(|p| !p.starts_with('/')) {
            return Err(format!("path pattern `{bad}` must start with `/`"));
        }
        if let Some(bad) = s.allowed_models.iter().find(|m| m.is_empty()) {
            return Err(format!("model pattern `{bad}` is empty"));
        }
        if s.max_tokens == Some(0) {
            return Err("max_tokens must be positive".into());
        }
        Ok(())
    }

    /// A prompt limit in tokens is only as good as the count: with one set, ask for the exact one.
    fn needs_prompt_tokens(s: &Settings) -> bool {
        s.max_prompt_tokens.is_some()
    }

    fn evaluate(input: &EvaluateInput, s: &Settings) -> Decision {
        let r = &input.request;
        let path = r.path.split('?').next().unwrap_or_default();
        if any_matches(&s.denied_paths, path)
            || !(s.allowed_paths.is_empty() || any_matches(&s.allowed_paths, path))
        {
            return Decision::forbidden(format!("{path} is not served here"));
        }
        if let Some(model) = &r.model {
            if !(s.allowed_models.is_empty() || any_matches(&s.allowed_models, model)) {
                return Decision::forbidden(format!("model `{model}` is not served here"));
            }
        }
        if let Some(limit) = s.max_prompt_chars.filter(|&l| r.prompt_chars > l) {
            return Decision::forbidden(format!(
                "the prompt has {} characters; the limit is {limit}",
                r.prompt_chars
            ));
        }
        if let Some(limit) = s.max_prompt_tokens.filter(|&l| r.prompt_tokens_best() > l) {
            let about = if r.prompt_tokens.is_some() {
                ""
            } else {
                "about "
            };
            return Decision::forbidden(format!(
                "the prompt has {about}{} tokens; the limit is {limit}",
                r.prompt_tokens_best()
            ));
        }
        if let (Some(limit), Some(asked), OverMaxTokens::Deny) =
            (s.max_tokens, r.max_tokens, s.over_max_tokens)
        {
            if asked > limit {
                return Decision::forbidden(format!(
                    "max_tokens {asked} is over the limit of {limit}"
                ));
            }
        }
        Decision {
            mutations: Mutations {
                // Sent even when the request is within the limit or names none, so the host also
                // bounds a request that leaves max_tokens out.
                cap_max_tokens: s.max_tokens,
                disable_prompt_cache: s.cache_isolation,
                strip_id_slot: s.cache_isolation,
                ..Mutations::default()
            },
            ..Decision::allow()
        }
    }
}

#[cfg(not(feature = "v2"))]
slotgate_sdk::export_policy!(RequestGuard);
#[cfg(feature = "v2")]
slotgate_sdk::export_component!(RequestGuard);

#[cfg(test)]
mod tests {
    use super::*;
    use slotgate_sdk::testing::{self, run};

    const SETTINGS: &str = r#""settings": {
        "max_tokens": 512, "max_prompt_chars": 1000, "max_prompt_tokens": 200,
        "allowed_paths": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings*"],
        "denied_paths": ["/v1/embeddings/batch"],
        "allowed_models": ["qwen2.5-7b", "llama-3.1-*"],
        "cache_isolation": true
    }"#;

    fn eval(request: &str) -> Decision {
        run::<RequestGuard>(&format!(r#"{{"request": {{{request}}}, {SETTINGS}}}"#))
    }

    fn denial(request: &str) -> String {
        let d = eval(request);
        assert_eq!(d.status, Some(403), "{request}: {d:?}");
        d.message.unwrap()
    }

    #[test]
    fn a_request_within_limits_is_capped_and_isolated() {
        let d = eval(r#""model": "qwen2.5-7b", "max_tokens": 100, "prompt_chars": 900"#);
        assert!(d.is_allowed());
        assert_eq!(
            d.mutations,
            Mutations {
                cap_max_tokens: Some(512),
                disable_prompt_cache: true,
                strip_id_slot: true,
                ..Mutations::default()
            }
        );
        let d = eval(r#""max_tokens": 100000"#);
        assert_eq!(
            (d.is_allowed(), d.mutations.cap_max_tokens),
            (true, Some(512))
        );
    }

    #[test]
    fn paths_are_allow_listed_and_deny_listed() {
        assert!(eval(r#""path": "/v1/completions?x=1""#).is_allowed());
        assert!(eval(r#""path": "/v1/embeddings""#).is_allowed());
        assert_eq!(
            denial(r#""path": "/v1/embeddings/batch""#),
            "/v1/embeddings/batch is not served here"
        );
        denial(r#""path": "/slots/0", "method": "POST""#);
        denial(r#""path": "/v1/chat/completions/""#);
    }

    #[test]
    fn models_are_allow_listed_and_a_nameless_request_passes() {
        assert!(eval(r#""model": "llama-3.1-8b""#).is_allowed());
        assert_eq!(
            denial(r#""model": "gpt-4""#),
            "model `gpt-4` is not served here"
        );
        assert!(eval(r#""stream": true"#).is_allowed());
    }

    #[test]
    fn large_prompts_are_refused() {
        assert!(denial(r#""prompt_chars": 1001"#).contains("1001 characters"));
        assert!(denial(r#""prompt_tokens_estimate": 201"#).contains("about 201 tokens"));
    }

    #[test]
    fn over_max_tokens_can_deny_instead_of_capping() {
        let input = |n: u64| {
            format!(
                r#"{{"request": {{"max_tokens": {n}}}, "settings": {{"max_tokens": 512, "over_max_tokens": "deny"}}}}"#
            )
        };
        let d = run::<RequestGuard>(&input(513));
        assert_eq!(d.status, Some(403));
        assert_eq!(
            d.message.as_deref(),
            Some("max_tokens 513 is over the limit of 512")
        );
        let d = run::<RequestGuard>(&input(512));
        assert_eq!(
            (d.is_allowed(), d.mutations.cap_max_tokens),
            (true, Some(512))
        );
        assert!(!d.mutations.disable_prompt_cache);
    }

    #[test]
    fn no_settings_allow_everything_unchanged() {
        let d = run::<RequestGuard>(r#"{"request": {"path": "/anything", "max_tokens": 99999}}"#);
        assert_eq!(d, Decision::allow());
    }

    #[test]
    fn settings_are_validated() {
        let example = include_str!("../settings.example.json");
        assert_eq!(
            testing::validate::<RequestGuard>(example),
            slotgate_sdk::SettingsValidation::ok()
        );
        // A token limit asks for the exact count before the chain decides; without one, no count.
        assert!(
            testing::validate::<RequestGuard>(r#"{"max_prompt_tokens": 100}"#).needs_prompt_tokens
        );
        assert!(
            !testing::validate::<RequestGuard>(r#"{"max_prompt_chars": 100}"#).needs_prompt_tokens
        );
        for bad in [
            r#"{"allowed_paths": ["v1/chat/completions"]}"#,
            r#"{"denied_paths": ["*"]}"#,
            r#"{"allowed_models": [""]}"#,
            r#"{"max_tokens": 0}"#,
            r#"{"over_max_tokens": "truncate"}"#,
            r#"{"max_token": 5}"#,
        ] {
            assert!(
                !testing::validate::<RequestGuard>(bad).valid,
                "{bad} passed"
            );
        }
    }

    #[test]
    fn fixtures() {
        testing::run_fixtures::<RequestGuard>(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"));
    }
}
