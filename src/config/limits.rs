//! Limits as written — rates, periods, levels, tiers and quotas in shadow —
//! and their conversion into validated domain limits.

use super::OverrideSection;
use crate::domain::{LevelLimits, Limits, LimitsError, Rate, ShadowLimits, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One rate as written: `{ limit = 60, period = "1m" }`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateSection {
    /// Units per period.
    pub limit: u64,
    /// `"30s"`, `"1m"`, `"1h"`, `"1d"` or seconds.
    pub period: Period,
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
    /// Token rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<RateSection>,
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
            concurrency: self.concurrency,
        })
    }
}

/// Written rates as domain rates; `path` names the list in errors.
pub(crate) fn rates(path: &str, rates: &[RateSection]) -> Result<Vec<Rate>, LimitsError> {
    rates
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let period_secs = r.period.seconds().map_err(|problem| {
                LimitsError::new(format!("{path}[{i}].period"), problem.to_string())
            })?;
            Ok(Rate {
                limit: r.limit,
                period_secs,
            })
        })
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
}

impl ShadowSection {
    pub(crate) fn to_domain(&self, path: &str) -> Result<ShadowLimits, LimitsError> {
        Ok(ShadowLimits {
            tenant: self.tenant.to_domain(&format!("{path}.tenant"))?,
            user: self.user.to_domain(&format!("{path}.user"))?,
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
        };
        tier.validate(&path)?;
        Ok(tier)
    }
}

/// Validated limits from the written sections.
pub fn build_limits(
    global: Option<&LevelSection>,
    tiers: &BTreeMap<String, TierSection>,
    overrides: &BTreeMap<String, OverrideSection>,
    version: u64,
) -> Result<Limits, LimitsError> {
    let global = global.cloned().unwrap_or_default().to_domain("global")?;
    let mut limits = Limits {
        global,
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
