//! {{name}}: a slotgate admission policy (slotgate:policy@2.0.0).
//!
//! It refuses requests that ask for more than `max_tokens` tokens, and charges the others their
//! estimated prompt. Change `evaluate` to your rule; `cargo test` runs the tests below natively.

use serde::Deserialize;
use slotgate_sdk::{Decision, EvaluateInput, Policy};

pub struct Rule;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The most tokens a request may ask llama-server to generate.
    #[serde(default = "default_max_tokens")]
    max_tokens: u64,
}

fn default_max_tokens() -> u64 {
    4096
}

impl Policy for Rule {
    type Settings = Settings;

    fn validate(s: &Settings) -> Result<(), String> {
        match s.max_tokens {
            0 => Err("max_tokens must be positive".into()),
            _ => Ok(()),
        }
    }

    fn evaluate(input: &EvaluateInput, s: &Settings) -> Decision {
        match input.request.max_tokens {
            Some(n) if n > s.max_tokens => {
                Decision::forbidden(format!("max_tokens is capped at {}", s.max_tokens))
            }
            _ => Decision {
                cost: Some(input.request.prompt_tokens_estimate),
                ..Decision::allow()
            },
        }
    }
}

slotgate_sdk::export_component!(Rule);

#[cfg(test)]
mod tests {
    use super::*;
    use slotgate_sdk::testing;

    #[test]
    fn refuses_more_than_the_cap_and_charges_the_rest() {
        let big = r#"{"request": {"max_tokens": 9000}, "settings": {"max_tokens": 100}}"#;
        assert_eq!(testing::run::<Rule>(big).status, Some(403));
        let small = r#"{"request": {"max_tokens": 50, "prompt_tokens_estimate": 12}}"#;
        let d = testing::run::<Rule>(small);
        assert!(d.is_allowed());
        assert_eq!(d.cost, Some(12));
        assert!(!testing::validate::<Rule>(r#"{"max_tokens": 0}"#).valid);
    }
}
