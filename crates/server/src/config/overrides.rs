//! Overrides as written: each level's `requests`, `tokens` and `concurrency`
//! may be left out (the tier's limit applies), given (it replaces the tier's),
//! or written as `"unlimited"` (the tier's limit of that kind is removed).
//!
//! ```toml
//! [overrides.bigco.user]
//! tokens = [{ limit = 1000000, period = "1m" }]   # replaces the tier's user token rates
//! concurrency = "unlimited"                       # removes the tier's user concurrency
//! # requests left out: the tier's user request rates apply
//! ```

use super::dims::{ByDimension, Unset, WithDimensions, read_section};
use super::rates::{RateSection, rates};
use crate::domain::block::Blocks;
pub use crate::domain::overrides::UNLIMITED;
use crate::domain::{DimMap, LevelOverride, LimitsError, Override, Rate, Setting, ShadowOverride};
use serde::de;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

impl<T> Unset for Setting<T> {
    fn is_unset(&self) -> bool {
        self.is_inherit()
    }
}

/// One level of an override as written: a key per dimension
/// ([`super::dims`]) and `concurrency`; any other key is refused.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LevelOverrideSection {
    /// Each dimension's rates, `"unlimited"`, or left out, by its name.
    #[serde(flatten)]
    pub rates: ByDimension<Setting<Vec<RateSection>>>,
    /// Requests in flight, `"unlimited"`, or left out.
    #[serde(default, skip_serializing_if = "Setting::is_inherit")]
    pub concurrency: Setting<u64>,
}

impl<'de> Deserialize<'de> for LevelOverrideSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        read_section(d)
    }
}

impl<'de> WithDimensions<'de> for LevelOverrideSection {
    type Rates = Setting<Vec<RateSection>>;
    const KEYS: &'static [&'static str] = &["concurrency"];

    fn rates(&mut self) -> &mut ByDimension<Setting<Vec<RateSection>>> {
        &mut self.rates
    }

    fn read_own<A: de::MapAccess<'de>>(
        &mut self,
        key: &str,
        map: &mut A,
    ) -> Result<bool, A::Error> {
        match key {
            "concurrency" => self.concurrency = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl LevelOverrideSection {
    /// True when it names nothing: the whole level is the tier's.
    pub fn is_empty(&self) -> bool {
        self.rates.is_unset() && self.concurrency.is_inherit()
    }

    /// The domain value; `path` names the level in errors.
    pub fn to_domain(&self, path: &str) -> Result<LevelOverride, LimitsError> {
        let mut settings = DimMap::<Setting<Vec<Rate>>>::default();
        for (dimension, written) in self.rates.0.iter() {
            settings[dimension] = match written {
                Setting::Inherit => Setting::Inherit,
                Setting::Unlimited => Setting::Unlimited,
                Setting::Limit(r) => rates(&format!("{path}.{}", dimension.as_str()), dimension, r)
                    .map(Setting::Limit)?,
            };
        }
        Ok(LevelOverride {
            rates: settings,
            concurrency: self.concurrency.clone(),
        })
    }
}

/// The shadow quota of an override as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowOverrideSection {
    /// Tenant level.
    #[serde(default, skip_serializing_if = "LevelOverrideSection::is_empty")]
    pub tenant: LevelOverrideSection,
    /// User level.
    #[serde(default, skip_serializing_if = "LevelOverrideSection::is_empty")]
    pub user: LevelOverrideSection,
}

/// A tenant's override as written: only what differs from the tier.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideSection {
    /// Tenant level.
    #[serde(default, skip_serializing_if = "LevelOverrideSection::is_empty")]
    pub tenant: LevelOverrideSection,
    /// User level.
    #[serde(default, skip_serializing_if = "LevelOverrideSection::is_empty")]
    pub user: LevelOverrideSection,
    /// The quota in shadow, laid over the tier's the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowOverrideSection>,
    /// The whole tenant refused, with the operator's reason
    /// (`ctxbudget overrides block`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
    /// Users of the tenant refused: user id → the operator's reason.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blocked_users: BTreeMap<String, String>,
    /// The tenant's weight in a shared level's line, over its tier's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl OverrideSection {
    /// True when it holds neither limits nor blocks: nothing to keep.
    pub fn is_empty(&self) -> bool {
        self.tenant.is_empty()
            && self.user.is_empty()
            && self.shadow.is_none()
            && self.blocked.is_none()
            && self.blocked_users.is_empty()
            && self.weight.is_none()
    }

    /// The domain override of `tenant`, validated.
    pub fn to_domain(&self, tenant: &str) -> Result<Override, LimitsError> {
        let path = format!("overrides.{tenant}");
        let shadow = |s: &ShadowOverrideSection| {
            Ok::<_, LimitsError>(ShadowOverride {
                tenant: s.tenant.to_domain(&format!("{path}.shadow.tenant"))?,
                user: s.user.to_domain(&format!("{path}.shadow.user"))?,
            })
        };
        let o = Override {
            tenant: self.tenant.to_domain(&format!("{path}.tenant"))?,
            user: self.user.to_domain(&format!("{path}.user"))?,
            shadow: self.shadow.as_ref().map(shadow).transpose()?,
            blocks: Blocks {
                tenant: self.blocked.clone(),
                users: self.blocked_users.clone(),
            },
            weight: self.weight,
        };
        o.validate(&path)?;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_document;
    use crate::domain::Dimension;
    use crate::domain::Rate;

    #[test]
    fn unlimited_a_value_or_nothing_in_toml_and_json() {
        let toml =
            "[user]\ntokens = [{ limit = 1000, period = \"1m\" }]\nconcurrency = \"unlimited\"\n";
        let o: OverrideSection = parse_document(toml).unwrap();
        let d = o.to_domain("bigco").unwrap();
        assert_eq!(
            d.user.rates[Dimension::Tokens],
            Setting::Limit(vec![Rate {
                limit: 1000,
                period_secs: 60,
                window: None,
                alert_at: Default::default(),
            }])
        );
        assert_eq!(d.user.concurrency, Setting::Unlimited);
        assert_eq!(d.user.rates[Dimension::Requests], Setting::Inherit);
        assert!(d.tenant.is_empty());
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(
            json,
            r#"{"user":{"tokens":[{"limit":1000,"period":"1m"}],"concurrency":"unlimited"}}"#
        );
        let back: OverrideSection = parse_document(&json).unwrap();
        assert_eq!(back.to_domain("bigco").unwrap(), d);
        let again: OverrideSection = parse_document(&toml::to_string(&o).unwrap()).unwrap();
        assert_eq!(again.to_domain("bigco").unwrap(), d);
    }

    #[test]
    fn a_misspelt_word_or_a_bad_value_names_the_field() {
        let err = parse_document::<OverrideSection>("[tenant]\ntokens = \"unlimted\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tenant.tokens"), "{err}");
        assert!(err.contains("\"unlimited\""), "{err}");
        let err = parse_document::<OverrideSection>("[user]\nconcurrency = -3\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("user.concurrency"), "{err}");
        let err = parse_document::<OverrideSection>(
            "[user]\nrequests = [{ limit = -5, period = \"1m\" }]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("user.requests[0].limit"), "{err}");
        let o: OverrideSection =
            parse_document("[user]\ntokens = [{ limit = 5, period = \"2w\" }]\n").unwrap();
        let err = o.to_domain("bigco").unwrap_err();
        assert_eq!(err.field, "overrides.bigco.user.tokens[0].period");
    }
}
