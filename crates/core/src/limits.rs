//! The set of limits the service enforces: global limits, the model groups,
//! the tiers by name, and tenants' overrides laid over them; the lookup of a
//! tenant's tier and of a model's group.
//!
//! The limit vocabulary lives in [`super::level`] and [`super::tier`]; it is
//! re-exported here, where callers have always found it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ids::InvalidInput;
pub use super::level::{Dimension, Level};
use super::model::{ModelGroup, ModelGroups, check_groups, group_of};
use super::overrides::Override;
use super::price::Price;
pub use super::tier::{
    LevelLimits, LimitsError, MAX_COUNT, MAX_PERIOD_SECS, MAX_RATES_PER_DIMENSION, MIN_PERIOD_SECS,
    Rate, ShadowLimits, Tier,
};

/// Every limit the service enforces: global limits, the tiers by name, and
/// tenants' overrides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Limits on all traffic together.
    pub global: LevelLimits,
    /// Model groups by name: per-model limits of the upstream account.
    pub models: ModelGroups,
    /// Prices by model group name, µ$ per million tokens.
    pub prices: BTreeMap<String, Price>,
    /// Tiers by name.
    pub tiers: BTreeMap<String, Arc<Tier>>,
    /// Overrides by tenant id.
    pub overrides: BTreeMap<String, Arc<Override>>,
    /// The configuration version these limits came from (0: a file).
    pub version: u64,
}

impl Limits {
    /// Checks every tier and the global limits; the error names the bad field.
    pub fn validate(&self) -> Result<(), LimitsError> {
        self.global.validate("global")?;
        if self.tiers.is_empty() {
            return Err(LimitsError::new("tiers", "at least one tier is required"));
        }
        check_groups(&self.models)?;
        for (group, price) in &self.prices {
            price.validate(&format!("prices.{group}"))?;
            if !self.models.contains_key(group) {
                return Err(LimitsError::new(
                    format!("prices.{group}"),
                    format!(
                        "there is no model group {group:?}: prices are per model group \
                         (known groups: {})",
                        self.group_names()
                    ),
                ));
            }
        }
        for (name, tier) in &self.tiers {
            tier.validate(&format!("tiers.{name}"))?;
            let shadow = tier.shadow.iter().flat_map(|s| {
                s.models
                    .keys()
                    .map(move |m| (format!("tiers.{name}.shadow.models.{m}"), m))
            });
            let own = tier
                .models
                .keys()
                .map(|m| (format!("tiers.{name}.models.{m}"), m));
            for (path, group) in own.chain(shadow) {
                if !self.models.contains_key(group) {
                    return Err(LimitsError::new(
                        path,
                        format!(
                            "there is no model group {group:?}; define [models.{group}] first \
                             (known groups: {})",
                            self.group_names()
                        ),
                    ));
                }
            }
        }
        for (tenant, o) in &self.overrides {
            o.validate(&format!("overrides.{tenant}"))?;
        }
        Ok(())
    }

    /// Looks a tier up by name, as configured.
    pub fn tier(&self, name: &str) -> Option<&Arc<Tier>> {
        self.tiers.get(name)
    }

    /// The limits that apply to `tenant` on tier `name`: the tier, with the
    /// tenant's override (if any) laid over it — each limit the override names
    /// replaces the tier's, every other one is the tier's.
    pub fn resolve(&self, name: &str, tenant: &str) -> Option<Arc<Tier>> {
        let tier = self.tiers.get(name)?;
        match self.overrides.get(tenant) {
            None => Some(tier.clone()),
            Some(o) => Some(Arc::new(o.apply(tier))),
        }
    }

    /// [`Self::resolve`], or the INVALID_ARGUMENT error naming the tiers
    /// there are: the one answer to a request for a tier these limits lack.
    pub fn resolve_known(&self, name: &str, tenant: &str) -> Result<Arc<Tier>, InvalidInput> {
        self.resolve(name, tenant)
            .ok_or_else(|| self.unknown_tier(name))
    }

    /// The error for a tier these limits do not have.
    pub fn unknown_tier(&self, name: &str) -> InvalidInput {
        InvalidInput::new(
            "tier",
            format!("unknown tier {name:?}; known tiers: {}", self.tier_names()),
        )
    }

    /// The group of `model`, if any (groups never overlap).
    pub fn group_of(&self, model: &str) -> Option<&Arc<ModelGroup>> {
        group_of(&self.models, model)
    }

    /// The model group names, for error messages.
    pub fn group_names(&self) -> String {
        match self.models.is_empty() {
            true => "none".into(),
            false => self.models.keys().cloned().collect::<Vec<_>>().join(", "),
        }
    }

    /// True when some level a request on `tier` passes through holds the
    /// learned output: its Commits then keep completion samples.
    pub fn learns_output(&self, tier: &Tier) -> bool {
        let learned = |l: &LevelLimits| l.output.is_learned();
        learned(&self.global)
            || learned(&tier.tenant)
            || learned(&tier.user)
            || tier
                .models
                .values()
                .any(|m| learned(&m.tenant) || learned(&m.user))
            || self.models.values().any(|g| learned(&g.global))
    }

    /// The tier names, for error messages that list the valid choices.
    pub fn tier_names(&self) -> String {
        self.tiers.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}
