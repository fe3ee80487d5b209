//! What tokens cost (`[prices]`, docs/spend.md): per million tokens of input, of input llama-server
//! read from its prompt cache, and of output, by model, in one currency; a default for the models
//! not listed. A request's cost is fixed when it ends, at the prices then in force, and booked in
//! the access line and the usage ledger.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};

/// One model's prices, per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Price {
    /// Prompt tokens llama-server processed.
    pub input: f64,
    /// Prompt tokens it reused from its prompt cache (default: `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Generated tokens.
    pub output: f64,
}

impl Price {
    /// The cost of `uncached`, `cached` and `output` tokens, in the currency.
    pub fn cost(&self, uncached: u64, cached: u64, output: u64) -> f64 {
        let per = |n: u64, p: f64| n as f64 * p / 1e6;
        per(uncached, self.input)
            + per(cached, self.cached_input.unwrap_or(self.input))
            + per(output, self.output)
    }
}

/// The `[prices]` table as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PricesTable {
    /// An ISO 4217 code: `EUR`, `USD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// The price of a model not listed in `models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Price>,
    /// By the model a request is booked under (the one llama-server serves, or a router's model).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, Price>,
}

/// The prices in force, checked. Empty: nothing is priced, and no cost is booked anywhere.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    pub currency: String,
    pub default: Option<Price>,
    pub models: BTreeMap<String, Price>,
}

impl Prices {
    pub fn new(t: PricesTable) -> Result<Prices, ConfigError> {
        let check = |what: String, p: &Price| -> Result<(), ConfigError> {
            let ok = |x: f64| x.is_finite() && x >= 0.0;
            if ok(p.input) && ok(p.output) && p.cached_input.is_none_or(ok) {
                return Ok(());
            }
            Err(invalid(
                "prices",
                format!("{what}: prices are numbers of the currency per million tokens, 0 or more"),
            ))
        };
        if let Some(d) = &t.default {
            check("prices.default".into(), d)?;
        }
        for (model, p) in &t.models {
            check(format!("prices.models.\"{model}\""), p)?;
        }
        let priced = t.default.is_some() || !t.models.is_empty();
        let currency = match t.currency {
            Some(c) if c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()) => c,
            Some(c) => {
                return Err(invalid(
                    "prices.currency",
                    format!("`{c}` is not a currency code (three capital letters: EUR, USD)"),
                ))
            }
            None if priced => {
                return Err(invalid(
                    "prices.currency",
                    "prices need their currency: `currency = \"EUR\"`",
                ))
            }
            None => String::new(),
        };
        Ok(Prices {
            currency,
            default: t.default,
            models: t.models,
        })
    }

    /// The currency a policy's quota is kept in: this one for a money quota (`cost:…`, the `quota`
    /// policy's), none for tokens and requests.
    pub fn quota_currency(&self, key: &str) -> Option<&str> {
        (key.starts_with("cost:") && self.any()).then_some(&*self.currency)
    }

    /// Whether anything is priced.
    pub fn any(&self) -> bool {
        self.default.is_some() || !self.models.is_empty()
    }

    /// The price of `model`: its own, else the default; `None` when neither is set.
    pub fn of(&self, model: &str) -> Option<&Price> {
        self.models.get(model).or(self.default.as_ref())
    }

    /// As the table is written.
    pub fn table(&self) -> PricesTable {
        PricesTable {
            currency: (!self.currency.is_empty()).then(|| self.currency.clone()),
            default: self.default,
            models: self.models.clone(),
        }
    }
}

/// The `[prices]` table.
impl super::table::Keys<super::Settings> for Prices {
    type Value = Prices;
    fn read(s: &super::Settings) -> Result<Prices, ConfigError> {
        Prices::new(s.prices.clone().unwrap_or_default())
    }
    fn write(v: &Prices, s: &mut super::Settings) {
        s.prices = v.any().then(|| v.table());
    }
}

/// Money as the ledger keeps it: billionths of the currency, so sums are exact.
pub fn nanos(cost: f64) -> u64 {
    (cost * 1e9).round().clamp(0.0, u64::MAX as f64) as u64
}

/// Billionths of the currency, back to the currency.
pub fn from_nanos(n: u64) -> f64 {
    n as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<Prices, ConfigError> {
        Prices::new(toml::from_str(text).unwrap())
    }

    #[test]
    fn a_cost_is_tokens_times_prices_cached_apart() {
        let p = table(
            "currency = \"EUR\"\ndefault = { input = 1.0, output = 2.0 }\n\
             [models.\"qwen\"]\ninput = 0.5\ncached-input = 0.05\noutput = 1.5\n",
        )
        .unwrap();
        let q = p.of("qwen").unwrap();
        // 1,000 processed, 9,000 cached, 500 out.
        let cost = q.cost(1_000, 9_000, 500);
        assert!(
            (cost - (0.0005 + 0.00045 + 0.00075)).abs() < 1e-12,
            "{cost}"
        );
        let d = p.of("other").unwrap();
        assert!(
            (d.cost(1_000, 1_000, 0) - 0.002).abs() < 1e-12,
            "cached at the input price"
        );
        assert_eq!(nanos(cost), 1_700_000);
        assert!((from_nanos(nanos(cost)) - cost).abs() < 1e-12);
    }

    #[test]
    fn prices_are_checked() {
        assert!(table("").unwrap().of("m").is_none());
        assert!(!table("").unwrap().any());
        for bad in [
            "default = { input = 1.0, output = 1.0 }",
            "currency = \"euro\"\ndefault = { input = 1.0, output = 1.0 }",
            "currency = \"EUR\"\ndefault = { input = -1.0, output = 1.0 }",
            "currency = \"EUR\"\n[models.m]\ninput = 1.0\noutput = nan\n",
        ] {
            assert!(table(bad).is_err(), "{bad}");
        }
    }
}
