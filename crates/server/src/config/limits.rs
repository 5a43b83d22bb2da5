//! Tiers and quotas in shadow as written, and the whole of the limits —
//! global limits, model groups, prices, tiers and overrides — built and
//! validated into domain limits, the `[envoy]` map checked against them.

use super::OverrideSection;
use super::envoy::EnvoySection;
use super::ext_proc::ExtProcSection;
use super::level::LevelSection;
use super::models::{ModelLimitsSection, ModelSection, model_groups, model_limits};
use super::money::{PriceSection, prices};
use super::rates::Period;
use crate::domain::tier::DEFAULT_SESSION_TTL_SECS;
use crate::domain::{Limits, LimitsError, ShadowLimits, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// Session-level limits: of each session (agent run) of a user.
    #[serde(default, skip_serializing_if = "LevelSection::is_empty")]
    pub session: LevelSection,
    /// How long a session's keys live unused: `"24h"` when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_ttl: Option<Period>,
    /// A stricter quota evaluated and reported but not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowSection>,
    /// Limits per model group, by group name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelLimitsSection>,
    /// Its tenants' weight in a shared level's line: 1 (an equal share)
    /// when left out.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

fn is_one(weight: &u32) -> bool {
    *weight == 1
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
            session: self.session.to_domain(&format!("{path}.session"))?,
            session_ttl_secs: match &self.session_ttl {
                None => DEFAULT_SESSION_TTL_SECS,
                Some(p) => p
                    .seconds()
                    .map_err(|e| LimitsError::new(format!("{path}.session_ttl"), e.to_string()))?,
            },
            max_context_tokens: self.max_context_tokens,
            default_max_output_tokens: self.default_max_output_tokens,
            shadow: self
                .shadow
                .as_ref()
                .map(|s| s.to_domain(&format!("{path}.shadow")))
                .transpose()?,
            models: model_limits(&format!("{path}.models"), &self.models)?,
            weight: self.weight,
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
    /// `[ext_proc]`.
    pub ext_proc: Option<&'a ExtProcSection>,
}

/// Validated limits from the written sections. The `[envoy]` map and
/// `[ext_proc]` are checked with them (their default tiers among their tiers),
/// though they are not part of them: the Envoy services hold them
/// (`gateway::rls::descriptor::LiveMap`, `gateway::ext_proc::LiveReading`).
pub fn build_limits(sections: LimitSections<'_>, version: u64) -> Result<Limits, LimitsError> {
    let LimitSections {
        global,
        models,
        prices: price_sections,
        tiers,
        overrides,
        envoy,
        ext_proc,
    } = sections;
    let envoy = envoy.cloned().unwrap_or_default();
    envoy.validate()?;
    let ext_proc = ext_proc.cloned().unwrap_or_default();
    ext_proc.validate()?;
    let global = global.cloned().unwrap_or_default().to_domain("global")?;
    let mut limits = Limits {
        global,
        models: model_groups(models)?,
        prices: prices(price_sections)?,
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
    if let Some(tier) = &envoy.default_tier
        && !limits.tiers.contains_key(tier)
    {
        return Err(LimitsError::new(
            "envoy.default_tier",
            format!(
                "there is no tier {tier:?} (known tiers: {})",
                limits.tier_names()
            ),
        ));
    }
    if let Some(tier) = &ext_proc.default_tier
        && !limits.tiers.contains_key(tier)
    {
        return Err(LimitsError::new(
            "ext_proc.default_tier",
            format!(
                "there is no tier {tier:?} (known tiers: {})",
                limits.tier_names()
            ),
        ));
    }
    Ok(limits)
}
