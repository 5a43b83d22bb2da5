//! Money as written: spend limits in USD, prices per model group in USD per
//! million tokens, and `[money]`. Every amount becomes whole micro-dollars
//! here (an amount finer than a micro-dollar is refused, never rounded).
//!
//! ```toml
//! [prices.gpt-4o]
//! input = 2.50          # USD per million prompt tokens
//! cached_input = 1.25   # cached prompt tokens (default: input)
//! output = 10.00
//!
//! [tiers.pro]
//! tenant = { spend = [{ limit_usd = 500, window = "month", timezone = "Asia/Bangkok" }] }
//!
//! [money]
//! require_price = false             # true: refuse a model without a price
//! ledger = true                     # the usage ledger (docs/money.md)
//! ledger_hourly_retention = "35d"
//! ledger_daily_retention = "400d"
//! ```

use super::rates::period_seconds;
use crate::domain::budget::ledger::LedgerRetention;
use crate::domain::price::{MAX_PRICE_MICROS, Price, Rates, usd_to_micros};
use crate::domain::{DimMap, Dimension, LimitsError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[prices.<group>]`: USD per million tokens (`per_call`: USD per call;
/// `image`: USD per image).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PriceSection {
    /// Prompt tokens.
    pub input: f64,
    /// Prompt tokens read from the provider's cache; default `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Prompt tokens written to the provider's cache for 5 minutes; default `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Prompt tokens written to the provider's cache for an hour; default `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<f64>,
    /// Output tokens.
    pub output: f64,
    /// Reasoning tokens (part of the output); default `output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<f64>,
    /// A flat fee per call (a web-search tool call), USD; default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_call: Option<f64>,
    /// Per image generated, USD; default 0 (the same in every long-context tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<f64>,
    /// Long-context tiers: a prompt above a tier's `prompt_tokens` prices the
    /// whole call at the tier's prices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub above: Vec<PriceTierSection>,
}

/// `[[prices.<group>.above]]`: the prices of a call whose prompt is above
/// `prompt_tokens`; a price left out is the group's own, but `reasoning`,
/// which is the tier's `output` unless given.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTierSection {
    /// The threshold: a prompt of more tokens is priced here.
    pub prompt_tokens: u64,
    /// Prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<f64>,
    /// Prompt tokens read from the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Prompt tokens written to the cache for 5 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Prompt tokens written to the cache for an hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<f64>,
    /// Output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
    /// Reasoning tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<f64>,
    /// A flat fee per call, USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_call: Option<f64>,
}

impl PriceSection {
    /// The domain price, µ$ per million tokens; `path` names it in errors.
    pub fn to_domain(&self, path: &str) -> Result<Price, LimitsError> {
        let or = |name: &str, usd: Option<f64>, default: u64| price_or(path, name, usd, default);
        let input = price_or(path, "input", Some(self.input), 0)?;
        let output = price_or(path, "output", Some(self.output), 0)?;
        let base = Rates {
            input,
            cached_input: or("cached_input", self.cached_input, input)?,
            cache_write: or("cache_write", self.cache_write, input)?,
            cache_write_1h: or("cache_write_1h", self.cache_write_1h, input)?,
            output,
            reasoning: or("reasoning", self.reasoning, output)?,
            per_call: or("per_call", self.per_call, 0)?,
            declared: DimMap::with([(Dimension::Images, or("image", self.image, 0)?)]),
        };
        let above = self
            .above
            .iter()
            .enumerate()
            .map(|(i, t)| t.to_domain(&format!("{path}.above[{i}]"), base))
            .collect::<Result<Vec<_>, _>>()?;
        let price = Price { base, above };
        price.validate(path)?;
        Ok(price)
    }
}

impl PriceTierSection {
    /// The tier's threshold and rates, `base`'s where left out.
    fn to_domain(&self, path: &str, base: Rates) -> Result<(u64, Rates), LimitsError> {
        let or = |name: &str, usd: Option<f64>, default: u64| price_or(path, name, usd, default);
        if self.prompt_tokens == 0 {
            return Err(LimitsError::new(
                format!("{path}.prompt_tokens"),
                "is required: the prompt size above which these prices apply (e.g. 200000)",
            ));
        }
        let output = or("output", self.output, base.output)?;
        let rates = Rates {
            input: or("input", self.input, base.input)?,
            cached_input: or("cached_input", self.cached_input, base.cached_input)?,
            cache_write: or("cache_write", self.cache_write, base.cache_write)?,
            cache_write_1h: or("cache_write_1h", self.cache_write_1h, base.cache_write_1h)?,
            output,
            // As at the group's own prices: reasoning is priced as output
            // unless told otherwise.
            reasoning: or("reasoning", self.reasoning, output)?,
            per_call: or("per_call", self.per_call, base.per_call)?,
            declared: base.declared,
        };
        Ok((self.prompt_tokens, rates))
    }
}

/// `usd` (field `name` of the section at `path`) in µ$, or `default` when
/// left out.
fn price_or(path: &str, name: &str, usd: Option<f64>, default: u64) -> Result<u64, LimitsError> {
    match usd {
        Some(usd) => usd_to_micros(&format!("{path}.{name}"), usd, MAX_PRICE_MICROS),
        None => Ok(default),
    }
}

/// Written prices as domain prices, by group.
pub fn prices(
    sections: &BTreeMap<String, PriceSection>,
) -> Result<BTreeMap<String, Price>, LimitsError> {
    sections
        .iter()
        .map(|(group, p)| Ok((group.clone(), p.to_domain(&format!("prices.{group}"))?)))
        .collect()
}

/// `[money]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MoneySection {
    /// Refuse (INVALID_ARGUMENT) a request for a model without a price, rather
    /// than counting its spend as 0.
    #[serde(default)]
    pub require_price: bool,
    /// Keep the usage ledger (default true).
    #[serde(default = "keep_ledger")]
    pub ledger: bool,
    /// How long hourly ledger rows are kept past their hour ("35d").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_hourly_retention: Option<String>,
    /// How long daily ledger rows are kept past their day ("400d").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_daily_retention: Option<String>,
}

fn keep_ledger() -> bool {
    true
}

impl Default for MoneySection {
    fn default() -> Self {
        MoneySection {
            require_price: false,
            ledger: true,
            ledger_hourly_retention: None,
            ledger_daily_retention: None,
        }
    }
}

/// Hourly ledger rows are kept this long past their hour by default.
pub const LEDGER_HOURLY_RETENTION: &str = "35d";
/// Daily ledger rows are kept this long past their day by default.
pub const LEDGER_DAILY_RETENTION: &str = "400d";

impl MoneySection {
    /// The ledger's retention, or `None` with the ledger off. An hourly row
    /// is kept 1 hour to 400 days, a daily row 1 to 3,660 days.
    pub fn ledger(&self) -> Result<Option<LedgerRetention>, LimitsError> {
        if !self.ledger {
            return Ok(None);
        }
        let read = |field: &str, text: Option<&str>, default: &str, min: u64, max: u64| {
            let name = format!("money.{field}");
            let secs = period_seconds(text.unwrap_or(default))
                .map_err(|e| LimitsError::new(&name, e.to_string()))?;
            if !(min..=max).contains(&secs) {
                return Err(LimitsError::new(
                    &name,
                    format!(
                        "must be between {} and {} days, got {:?}",
                        min as f64 / 86_400.0,
                        max / 86_400,
                        text.unwrap_or(default)
                    ),
                ));
            }
            Ok(secs as i64 * 1_000_000)
        };
        Ok(Some(LedgerRetention {
            hourly_us: read(
                "ledger_hourly_retention",
                self.ledger_hourly_retention.as_deref(),
                LEDGER_HOURLY_RETENTION,
                3_600,
                400 * 86_400,
            )?,
            daily_us: read(
                "ledger_daily_retention",
                self.ledger_daily_retention.as_deref(),
                LEDGER_DAILY_RETENTION,
                86_400,
                3_660 * 86_400,
            )?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(toml: &str) -> Result<Price, LimitsError> {
        let section: PriceSection = toml::from_str(toml).unwrap();
        section.to_domain("prices.g")
    }

    #[test]
    fn prices_left_out_follow_the_rules_providers_bill_by() {
        let p = price(
            "input = 3.0\noutput = 15.0\ncache_write = 3.75\nper_call = 0.01\n\
             [[above]]\nprompt_tokens = 200000\ninput = 6.0\noutput = 22.5\n",
        )
        .unwrap();
        let base = p.base;
        assert_eq!(
            (base.cached_input, base.cache_write_1h),
            (3_000_000, 3_000_000)
        );
        assert_eq!((base.cache_write, base.reasoning), (3_750_000, 15_000_000));
        assert_eq!(base.per_call, 10_000);
        let (threshold, long) = p.above[0];
        assert_eq!(threshold, 200_000);
        // The group's own where left out, but reasoning follows the tier's output.
        assert_eq!(
            (long.input, long.cache_write, long.per_call),
            (6_000_000, 3_750_000, 10_000)
        );
        assert_eq!(long.reasoning, 22_500_000);
    }

    #[test]
    fn a_tier_needs_its_threshold_in_ascending_order() {
        let err = price("input = 1.0\noutput = 1.0\n[[above]]\nprompt_tokens = 0\ninput = 2.0\n")
            .unwrap_err();
        assert_eq!(err.field, "prices.g.above[0].prompt_tokens");
        let err = price(
            "input = 1.0\noutput = 1.0\n[[above]]\nprompt_tokens = 9\n[[above]]\nprompt_tokens = 9\n",
        )
        .unwrap_err();
        assert_eq!(err.field, "prices.g.above[1].prompt_tokens");
        let err = price("input = 1.0\noutput = 1.0\nper_call = -1.0\n").unwrap_err();
        assert_eq!(err.field, "prices.g.per_call");
    }
}
