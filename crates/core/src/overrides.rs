//! Overrides: a tenant's own limits (a custom deal), laid over its tier's.
//!
//! An override names only what differs from the tier. Each level's requests,
//! tokens and concurrency are taken separately: what the override names
//! replaces the tier's limit of that kind at that level (a list of rates as a
//! whole), what it leaves out comes from the tier, and taking a limit away
//! takes an explicit [`Setting::Unlimited`]. Leaving a kind out can therefore
//! never remove a limit by accident.

mod words;
pub use words::UNLIMITED;

use super::block::Blocks;
use super::level::DimMap;
use super::tier::{LevelLimits, LimitsError, Rate, ShadowLimits, Tier, user_within_tenant};

/// What an override says about one kind of limit at one level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Setting<T> {
    /// Not named: the tier's limit applies.
    #[default]
    Inherit,
    /// Named as `unlimited`: no limit of this kind at this level, whatever the
    /// tier says.
    Unlimited,
    /// This limit in place of the tier's.
    Limit(T),
}

impl<T> Setting<T> {
    /// True when the override leaves this kind to the tier.
    pub fn is_inherit(&self) -> bool {
        matches!(self, Setting::Inherit)
    }

    /// The value when named, else `None`.
    pub fn limit(&self) -> Option<&T> {
        match self {
            Setting::Limit(v) => Some(v),
            _ => None,
        }
    }
}

impl Setting<Vec<Rate>> {
    /// The rates in force given the tier's.
    pub fn over(&self, tier: &[Rate]) -> Vec<Rate> {
        match self {
            Setting::Inherit => tier.to_vec(),
            Setting::Unlimited => Vec::new(),
            Setting::Limit(rates) => rates.clone(),
        }
    }
}

impl Setting<u64> {
    /// The concurrency in force given the tier's.
    pub fn over(&self, tier: Option<u64>) -> Option<u64> {
        match self {
            Setting::Inherit => tier,
            Setting::Unlimited => None,
            Setting::Limit(c) => Some(*c),
        }
    }
}

/// What an override says about one level.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LevelOverride {
    /// The rates of each rate dimension (spend in µ$).
    pub rates: DimMap<Setting<Vec<Rate>>>,
    /// Requests in flight.
    pub concurrency: Setting<u64>,
}

impl LevelOverride {
    /// The level's limits with this override laid over the tier's `tier`.
    pub fn apply(&self, tier: &LevelLimits) -> LevelLimits {
        LevelLimits {
            rates: self.rates.map(|d, setting| setting.over(&tier.rates[d])),
            concurrency: self.concurrency.over(tier.concurrency),
            output: tier.output,
        }
    }

    /// Only the limits the override sets itself (inherited and removed kinds
    /// count as none): what its own rules are checked on.
    pub fn named(&self) -> LevelLimits {
        self.apply(&LevelLimits::default())
    }

    /// True when the override says nothing about this level.
    pub fn is_empty(&self) -> bool {
        self.rates.iter().all(|(_, s)| s.is_inherit()) && self.concurrency.is_inherit()
    }

    fn validate(&self, path: &str) -> Result<(), LimitsError> {
        for (dimension, setting) in self.rates.iter() {
            let name = dimension.as_str();
            if setting.limit().is_some_and(Vec::is_empty) {
                return Err(LimitsError::new(
                    format!("{path}.{name}"),
                    format!(
                        "an empty list is ambiguous: leave `{name}` out to keep the tier's, \
                         or write {name} = \"unlimited\" to remove them"
                    ),
                ));
            }
        }
        self.named().validate(path)
    }
}

/// What an override says about the tenant and user levels of a quota in shadow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShadowOverride {
    /// Tenant level.
    pub tenant: LevelOverride,
    /// User level.
    pub user: LevelOverride,
}

/// A tenant's override: applies whatever tier its requests name; context size
/// and default output always come from the tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Override {
    /// Tenant level.
    pub tenant: LevelOverride,
    /// User level.
    pub user: LevelOverride,
    /// The quota in shadow, laid over the tier's the same way (a tier without
    /// one counts as a shadow quota with no limits).
    pub shadow: Option<ShadowOverride>,
    /// The tenant, or users of it, refused outright by an operator.
    pub blocks: Blocks,
    /// The tenant's weight in a shared level's line, over its tier's.
    pub weight: Option<u32>,
}

impl Override {
    /// Checks the override's rules on what it sets; `path` prefixes field names
    /// in errors. A user limit is checked against the tenant limit the override
    /// sets for the same kind; an inherited tenant limit lower than it still
    /// binds, as every level is enforced.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        check_levels(path, &self.tenant, &self.user)?;
        self.blocks.validate(path)?;
        if let Some(w) = self.weight {
            super::tier::check_weight(path, w)?;
        }
        if let Some(s) = &self.shadow {
            check_levels(&format!("{path}.shadow"), &s.tenant, &s.user)?;
        }
        Ok(())
    }

    /// `tier` as it applies to this override's tenant.
    pub fn apply(&self, tier: &Tier) -> Tier {
        Tier {
            name: tier.name.clone(),
            tenant: self.tenant.apply(&tier.tenant),
            user: self.user.apply(&tier.user),
            session: tier.session.clone(),
            session_ttl_secs: tier.session_ttl_secs,
            max_context_tokens: tier.max_context_tokens,
            default_max_output_tokens: tier.default_max_output_tokens,
            shadow: self.apply_shadow(tier.shadow.as_ref()),
            models: tier.models.clone(),
            weight: self.weight.unwrap_or(tier.weight),
        }
    }

    fn apply_shadow(&self, tier: Option<&ShadowLimits>) -> Option<ShadowLimits> {
        let Some(o) = &self.shadow else {
            return tier.cloned();
        };
        let base = tier.cloned().unwrap_or_default();
        let shadow = ShadowLimits {
            tenant: o.tenant.apply(&base.tenant),
            user: o.user.apply(&base.user),
            models: base.models,
        };
        // A shadow quota with no limit left is no shadow quota.
        let unlimited =
            shadow.tenant.is_unlimited() && shadow.user.is_unlimited() && shadow.models.is_empty();
        (!unlimited).then_some(shadow)
    }
}

fn check_levels(
    path: &str,
    tenant: &LevelOverride,
    user: &LevelOverride,
) -> Result<(), LimitsError> {
    tenant.validate(&format!("{path}.tenant"))?;
    user.validate(&format!("{path}.user"))?;
    user_within_tenant(path, &user.named(), &tenant.named())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DimMap, Dimension};

    fn rate(limit: u64, period_secs: u64) -> Rate {
        Rate {
            limit,
            period_secs,
            window: None,
            alert_at: Default::default(),
        }
    }

    fn tier() -> Tier {
        Tier {
            weight: 1,
            name: "pro".into(),
            tenant: LevelLimits {
                rates: DimMap::with([
                    (Dimension::Requests, vec![rate(600, 60)]),
                    (Dimension::Tokens, vec![rate(5_000_000, 60)]),
                ]),
                concurrency: Some(50),
                ..LevelLimits::default()
            },
            user: LevelLimits {
                rates: DimMap::with([
                    (Dimension::Requests, vec![rate(60, 60)]),
                    (Dimension::Tokens, vec![rate(500_000, 60)]),
                ]),
                concurrency: Some(5),
                ..LevelLimits::default()
            },
            session: LevelLimits::default(),
            session_ttl_secs: crate::tier::DEFAULT_SESSION_TTL_SECS,
            max_context_tokens: 128_000,
            default_max_output_tokens: 8192,
            shadow: Some(ShadowLimits {
                tenant: LevelLimits::default(),
                user: LevelLimits {
                    rates: DimMap::with([(Dimension::Requests, vec![rate(30, 60)])]),
                    ..LevelLimits::default()
                },
                models: Default::default(),
            }),
            models: Default::default(),
        }
    }

    #[test]
    fn an_override_changes_only_what_it_names() {
        let o = Override {
            user: LevelOverride {
                rates: DimMap::with([(
                    Dimension::Tokens,
                    Setting::Limit(vec![rate(1_000_000, 60)]),
                )]),
                ..LevelOverride::default()
            },
            ..Override::default()
        };
        let t = o.apply(&tier());
        assert_eq!(t.tenant, tier().tenant, "the tenant level is the tier's");
        assert_eq!(t.user.rates[Dimension::Requests], vec![rate(60, 60)]);
        assert_eq!(t.user.concurrency, Some(5));
        assert_eq!(t.user.rates[Dimension::Tokens], vec![rate(1_000_000, 60)]);
        assert_eq!(t.shadow, tier().shadow, "the tier's shadow quota applies");
        assert_eq!(t.max_context_tokens, 128_000);
    }

    #[test]
    fn unlimited_removes_one_kind_only() {
        let o = Override {
            tenant: LevelOverride {
                concurrency: Setting::Unlimited,
                ..LevelOverride::default()
            },
            shadow: Some(ShadowOverride {
                user: LevelOverride {
                    rates: DimMap::with([(Dimension::Requests, Setting::Unlimited)]),
                    ..LevelOverride::default()
                },
                ..ShadowOverride::default()
            }),
            ..Override::default()
        };
        let t = o.apply(&tier());
        assert_eq!(t.tenant.concurrency, None);
        assert_eq!(
            t.tenant.rates[Dimension::Requests],
            tier().tenant.rates[Dimension::Requests]
        );
        assert_eq!(t.user, tier().user);
        assert_eq!(t.shadow, None, "no shadow limit is left");
    }

    #[test]
    fn empty_lists_and_user_above_its_own_tenant_are_refused() {
        let empty = Override {
            user: LevelOverride {
                rates: DimMap::with([(Dimension::Tokens, Setting::Limit(vec![]))]),
                ..LevelOverride::default()
            },
            ..Override::default()
        };
        let err = empty.validate("overrides.bigco").unwrap_err();
        assert_eq!(err.field, "overrides.bigco.user.tokens");
        assert!(err.problem.contains("\"unlimited\""), "{err}");
        let above = Override {
            tenant: LevelOverride {
                rates: DimMap::with([(Dimension::Requests, Setting::Limit(vec![rate(10, 60)]))]),
                ..LevelOverride::default()
            },
            user: LevelOverride {
                rates: DimMap::with([(Dimension::Requests, Setting::Limit(vec![rate(11, 60)]))]),
                ..LevelOverride::default()
            },
            ..Override::default()
        };
        assert_eq!(
            above.validate("overrides.bigco").unwrap_err().field,
            "overrides.bigco.user.requests[0].limit"
        );
    }
}
