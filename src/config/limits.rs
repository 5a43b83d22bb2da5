//! Limits as written — rates, periods, levels, tiers and quotas in shadow —
//! and their conversion into validated domain limits.

use super::OverrideSection;
use super::envoy::EnvoySection;
use super::models::{ModelLimitsSection, ModelSection, model_groups, model_limits};
use super::money::{PriceSection, SpendSection, prices, spend_rates};
use crate::domain::window::{Window, WindowKind, parse_zone};
use crate::domain::{LevelLimits, Limits, LimitsError, Rate, ShadowLimits, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One rate as written: `{ limit = 60, period = "1m" }`, or per calendar
/// window: `{ limit = 1000000, window = "month", timezone = "Asia/Bangkok" }`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateSection {
    /// Units per period (or window).
    pub limit: u64,
    /// `"30s"`, `"1m"`, `"1h"`, `"1d"` or seconds: a rolling period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    /// `"day"`, `"week"` or `"month"`: a calendar window instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The window's IANA time zone (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

impl RateSection {
    /// The domain rate; `field` names it in errors.
    pub(crate) fn to_domain(&self, field: &str) -> Result<Rate, LimitsError> {
        let err =
            |name: &str, problem: String| LimitsError::new(format!("{field}.{name}"), problem);
        match (&self.period, &self.window) {
            (Some(period), None) => {
                if self.timezone.is_some() {
                    return Err(err(
                        "timezone",
                        "a time zone goes with a calendar window (window = \"day\", \"week\" \
                         or \"month\"), not a rolling period"
                            .into(),
                    ));
                }
                let period_secs = period.seconds().map_err(|p| err("period", p.to_string()))?;
                Ok(Rate {
                    limit: self.limit,
                    period_secs,
                    window: None,
                })
            }
            (None, Some(kind)) => {
                let kind = WindowKind::parse(kind).ok_or_else(|| {
                    err(
                        "window",
                        format!("{kind:?} is not a window; use \"day\", \"week\" or \"month\""),
                    )
                })?;
                let zone = self.timezone.as_deref().unwrap_or("UTC");
                let tz = parse_zone(zone).ok_or_else(|| {
                    err(
                        "timezone",
                        format!(
                            "{zone:?} is not an IANA time zone (e.g. \"UTC\", \"Asia/Bangkok\")"
                        ),
                    )
                })?;
                Ok(Rate {
                    limit: self.limit,
                    period_secs: 0,
                    window: Some(Window { kind, tz }),
                })
            }
            (Some(_), Some(_)) => Err(err(
                "window",
                "give a rolling period or a calendar window, not both".into(),
            )),
            (None, None) => Err(err(
                "period",
                "is required: a rolling period (\"1m\", \"1d\") or a calendar window \
                 (window = \"day\", \"week\" or \"month\")"
                    .into(),
            )),
        }
    }

    /// A domain rate as written.
    pub fn of(rate: &Rate) -> Self {
        match rate.window {
            Some(w) => RateSection {
                limit: rate.limit,
                period: None,
                window: Some(w.kind.as_str().into()),
                timezone: Some(w.tz.name().into()),
            },
            None => RateSection {
                limit: rate.limit,
                period: Some(Period::Text(crate::domain::decision::period_label(
                    rate.period_secs,
                ))),
                window: None,
                timezone: None,
            },
        }
    }
}

/// A period as written: a number of seconds or a string with a unit.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Period {
    /// Seconds.
    Secs(u64),
    /// `"<n><s|m|h|d>"`.
    Text(String),
}

impl Period {
    /// The period in seconds, or what is wrong with it.
    pub fn seconds(&self) -> Result<u64, PeriodError> {
        match self {
            Period::Secs(s) => Ok(*s),
            Period::Text(t) => period_seconds(t),
        }
    }
}

/// A period that does not parse; the message quotes it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    /// No number where one must be.
    #[error("{0:?} is not a period like \"30s\", \"1m\", \"1h\" or \"1d\"")]
    NotAPeriod(String),
    /// A unit other than s, m, h or d.
    #[error("{0:?} has an unknown unit; use s, m, h or d")]
    UnknownUnit(String),
    /// More seconds than a u64 holds.
    #[error("{0:?} is too long")]
    TooLong(String),
}

/// Parses `"90s"`, `"1m"`, `"2h"`, `"1d"` or a bare number of seconds.
pub fn period_seconds(text: &str) -> Result<u64, PeriodError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| PeriodError::NotAPeriod(text.into()))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(PeriodError::UnknownUnit(text.into())),
    };
    n.checked_mul(scale)
        .ok_or_else(|| PeriodError::TooLong(text.into()))
}

/// The limits of one level as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LevelSection {
    /// Request rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<RateSection>,
    /// Token rates (prompt + output).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<RateSection>,
    /// Input (prompt) token rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_tokens: Vec<RateSection>,
    /// Output token rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_tokens: Vec<RateSection>,
    /// Spend limits, in USD.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spend: Vec<SpendSection>,
    /// Requests in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
}

impl LevelSection {
    /// The domain limits; `path` names the section in errors.
    pub fn to_domain(&self, path: &str) -> Result<LevelLimits, LimitsError> {
        Ok(LevelLimits {
            requests: rates(&format!("{path}.requests"), &self.requests)?,
            tokens: rates(&format!("{path}.tokens"), &self.tokens)?,
            input_tokens: rates(&format!("{path}.input_tokens"), &self.input_tokens)?,
            output_tokens: rates(&format!("{path}.output_tokens"), &self.output_tokens)?,
            spend: spend_rates(&format!("{path}.spend"), &self.spend)?,
            concurrency: self.concurrency,
        })
    }
}

/// Written rates as domain rates; `path` names the list in errors.
pub(crate) fn rates(path: &str, rates: &[RateSection]) -> Result<Vec<Rate>, LimitsError> {
    rates
        .iter()
        .enumerate()
        .map(|(i, r)| r.to_domain(&format!("{path}[{i}]")))
        .collect()
}

/// A tier as written.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TierSection {
    /// Prompt + output tokens above this are refused.
    pub max_context_tokens: u64,
    /// Output tokens reserved when a request names none.
    pub default_max_output_tokens: u64,
    /// Tenant-level limits.
    #[serde(default)]
    pub tenant: LevelSection,
    /// User-level limits.
    #[serde(default)]
    pub user: LevelSection,
    /// A stricter quota evaluated and reported but not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowSection>,
    /// Limits per model group, by group name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelLimitsSection>,
}

/// A quota in shadow: tenant- and user-level limits.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSection {
    /// Tenant-level limits.
    #[serde(default)]
    pub tenant: LevelSection,
    /// User-level limits.
    #[serde(default)]
    pub user: LevelSection,
    /// Per-model-group limits in shadow.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelLimitsSection>,
}

impl ShadowSection {
    pub(crate) fn to_domain(&self, path: &str) -> Result<ShadowLimits, LimitsError> {
        Ok(ShadowLimits {
            tenant: self.tenant.to_domain(&format!("{path}.tenant"))?,
            user: self.user.to_domain(&format!("{path}.user"))?,
            models: model_limits(&format!("{path}.models"), &self.models)?,
        })
    }
}

impl TierSection {
    /// The domain tier `name`, validated.
    pub fn to_domain(&self, name: &str) -> Result<Tier, LimitsError> {
        let path = format!("tiers.{name}");
        let tier = Tier {
            name: name.to_string(),
            tenant: self.tenant.to_domain(&format!("{path}.tenant"))?,
            user: self.user.to_domain(&format!("{path}.user"))?,
            max_context_tokens: self.max_context_tokens,
            default_max_output_tokens: self.default_max_output_tokens,
            shadow: self
                .shadow
                .as_ref()
                .map(|s| s.to_domain(&format!("{path}.shadow")))
                .transpose()?,
            models: model_limits(&format!("{path}.models"), &self.models)?,
        };
        tier.validate(&path)?;
        Ok(tier)
    }
}

/// The written sections limits are built from.
#[derive(Clone, Copy, Debug)]
pub struct LimitSections<'a> {
    /// `[global]`.
    pub global: Option<&'a LevelSection>,
    /// `[models.*]`.
    pub models: &'a BTreeMap<String, ModelSection>,
    /// `[prices.*]`.
    pub prices: &'a BTreeMap<String, PriceSection>,
    /// `[tiers.*]`.
    pub tiers: &'a BTreeMap<String, TierSection>,
    /// `[overrides.*]`.
    pub overrides: &'a BTreeMap<String, OverrideSection>,
    /// `[envoy]`.
    pub envoy: Option<&'a EnvoySection>,
}

/// Validated limits from the written sections.
pub fn build_limits(sections: LimitSections<'_>, version: u64) -> Result<Limits, LimitsError> {
    let LimitSections {
        global,
        models,
        prices: price_sections,
        tiers,
        overrides,
        envoy,
    } = sections;
    let global = global.cloned().unwrap_or_default().to_domain("global")?;
    let mut limits = Limits {
        global,
        models: model_groups(models)?,
        prices: prices(price_sections)?,
        descriptors: envoy.cloned().unwrap_or_default().to_domain()?,
        version,
        ..Limits::default()
    };
    for (name, t) in tiers {
        limits
            .tiers
            .insert(name.clone(), Arc::new(t.to_domain(name)?));
    }
    for (tenant, o) in overrides {
        limits
            .overrides
            .insert(tenant.clone(), Arc::new(o.to_domain(tenant)?));
    }
    limits.validate()?;
    Ok(limits)
}
