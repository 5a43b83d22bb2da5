//! Tiers as operators define them: rates per period, concurrency, the tier's
//! request shape, its per-model-group limits, and the rules a tier (and any
//! level's limits) must follow before the service accepts it — the tier-name
//! rule among them.
//!
//! Size: the whole limit vocabulary an operator writes (levels, tiers, model
//! and shadow limits) and its validation rules, kept together as one contract.

use super::alert::Thresholds;
use super::level::{DimMap, Dimension, Level};
use super::output::OutputReservation;
use super::window::Window;
use std::collections::BTreeMap;

/// Shortest period a rate may use.
pub const MIN_PERIOD_SECS: u64 = 1;
/// Longest period a rate may use (30 days).
pub const MAX_PERIOD_SECS: u64 = 30 * 24 * 3600;
/// Largest limit or token count accepted anywhere. Lua numbers are doubles, so
/// every count must stay far below 2^53; 2^40 leaves room for sums.
pub const MAX_COUNT: u64 = 1 << 40;
/// The largest spend limit (µ$): about $1.1 billion (2⁵⁰ µ$), far inside
/// the doubles the scripts count in.
pub const MAX_SPEND_MICROS: u64 = 1 << 50;
pub use super::dimension::MAX_RATES_PER_DIMENSION;

/// `limit` units per `period_secs`, refilled continuously — or, with a
/// `window`, per calendar window, full again at each boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Bucket capacity, and what refills over one period (or window).
    pub limit: u64,
    /// The period in seconds; 0 with a window.
    pub period_secs: u64,
    /// A calendar window instead of a rolling period.
    pub window: Option<Window>,
    /// Fractions of the limit to alert at (`alert_at`; none: no alerts).
    pub alert_at: Thresholds,
}

impl Rate {
    /// How the rate is written in messages: `1m`, or `month (Asia/Bangkok)`.
    pub fn label(&self) -> String {
        match self.window {
            Some(w) => w.to_string(),
            None => super::level::period_label(self.period_secs),
        }
    }
}

/// The limits of one level. Every part may be absent, meaning unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LevelLimits {
    /// The rates of each rate dimension (RPM, TPM, a monthly budget in µ$,
    /// …); none: unlimited in it.
    pub rates: DimMap<Vec<Rate>>,
    /// Requests in flight at once.
    pub concurrency: Option<u64>,
    /// How much output a reservation holds here: the grant, or the learned
    /// output (`output_reservation`, `output_overrun`).
    pub output: OutputReservation,
}

impl LevelLimits {
    /// The rate a learned output's overrun credit is sized on: the shortest
    /// rolling token rate, else the shortest rolling output-token rate.
    pub fn overrun_basis(&self) -> Option<&Rate> {
        fn rolling(rates: &[Rate]) -> Option<&Rate> {
            rates
                .iter()
                .filter(|r| r.window.is_none())
                .min_by_key(|r| r.period_secs)
        }
        rolling(&self.rates[Dimension::Tokens])
            .or_else(|| rolling(&self.rates[Dimension::OutputTokens]))
    }

    /// True when nothing at this level is limited: the level costs no store work.
    pub fn is_unlimited(&self) -> bool {
        self.has_no_rates() && self.concurrency.is_none()
    }

    /// True when the level has no rate of any dimension.
    pub fn has_no_rates(&self) -> bool {
        self.rates.iter().all(|(_, r)| r.is_empty())
    }

    /// The rates of one rate dimension (none for concurrency).
    pub fn rates(&self, dimension: Dimension) -> &[Rate] {
        match dimension.slot() {
            Some(_) => &self.rates[dimension],
            None => &[],
        }
    }

    /// Checks the level's rules; `path` prefixes field names in errors.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        for (dimension, rates) in self.rates.iter() {
            let name = dimension.as_str();
            let max = match dimension.is_priced() {
                true => MAX_SPEND_MICROS,
                false => MAX_COUNT,
            };
            if rates.len() > MAX_RATES_PER_DIMENSION {
                return Err(LimitsError::new(
                    format!("{path}.{name}"),
                    format!("at most {MAX_RATES_PER_DIMENSION} rates per dimension"),
                ));
            }
            for (i, rate) in rates.iter().enumerate() {
                let field = format!("{path}.{name}[{i}]");
                if rate.limit == 0 || rate.limit > max {
                    return Err(LimitsError::new(
                        format!("{field}.limit"),
                        format!("must be between 1 and {max}, got {}", rate.limit),
                    ));
                }
                if rate.window.is_none()
                    && !(MIN_PERIOD_SECS..=MAX_PERIOD_SECS).contains(&rate.period_secs)
                {
                    return Err(LimitsError::new(
                        format!("{field}.period"),
                        format!("must be between 1s and 30d, got {}s", rate.period_secs),
                    ));
                }
                let same = |r: &Rate| match (r.window, rate.window) {
                    (None, None) => r.period_secs == rate.period_secs,
                    (Some(a), Some(b)) => a.tag() == b.tag(),
                    _ => false,
                };
                if rates[..i].iter().any(same) {
                    let what = if rate.window.is_some() {
                        "window"
                    } else {
                        "period"
                    };
                    return Err(LimitsError::new(
                        format!("{field}.{what}"),
                        format!("another {name} rate already uses {}", rate.label()),
                    ));
                }
            }
        }
        if let Some(c) = self.concurrency
            && (c == 0 || c > 1_000_000)
        {
            return Err(LimitsError::new(
                format!("{path}.concurrency"),
                format!("must be between 1 and 1000000, got {c}"),
            ));
        }
        self.validate_output(path)
    }

    /// A learned output needs a rate to size its overrun credit on.
    fn validate_output(&self, path: &str) -> Result<(), LimitsError> {
        if self.output.is_learned() && self.overrun_basis().is_none() {
            return Err(LimitsError::new(
                format!("{path}.output_reservation"),
                "\"learned\" needs a rolling tokens or output_tokens rate at this level \
                 (its overrun credit is sized on it); add one, or use \"max\"",
            ));
        }
        Ok(())
    }
}

/// A plan customers are on: tenant- and user-level limits plus request shape limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tier {
    /// The name callers pass as `tier`.
    pub name: String,
    /// Limits shared by all users of one tenant on this tier.
    pub tenant: LevelLimits,
    /// Limits of each user of such a tenant.
    pub user: LevelLimits,
    /// Limits of each session (agent run, trace) of such a user; a request
    /// naming no session skips them.
    pub session: LevelLimits,
    /// A session's keys expire after this long unused (seconds).
    pub session_ttl_secs: u64,
    /// Prompt + output tokens above this are `CONTEXT_TOO_LARGE`.
    pub max_context_tokens: u64,
    /// Output tokens reserved when a request leaves `max_output_tokens` at 0.
    pub default_max_output_tokens: u64,
    /// A stricter quota being rolled out: evaluated and reported on every
    /// request, never enforced.
    pub shadow: Option<ShadowLimits>,
    /// Limits of requests for one model group, by group name, on top of the
    /// tier's all-model limits.
    pub models: BTreeMap<String, ModelLimits>,
    /// Its tenants' weight in a shared level's line (1 to [`MAX_WEIGHT`]):
    /// with every tenant waiting, one of weight w is granted w / Σw of the
    /// shared account (`domain::queue`).
    pub weight: u32,
}

/// The largest weight a tier or an override may give.
pub const MAX_WEIGHT: u32 = 1000;

/// Checks a weight at `path`: 1 to [`MAX_WEIGHT`].
pub fn check_weight(path: &str, weight: u32) -> Result<(), LimitsError> {
    if !(1..=MAX_WEIGHT).contains(&weight) {
        return Err(LimitsError::new(
            format!("{path}.weight"),
            format!("is {weight}; a weight is 1 to {MAX_WEIGHT} (1: an equal share)"),
        ));
    }
    Ok(())
}

/// The tenant-, user- and session-level limits a tier sets for one model group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelLimits {
    /// Shared by all users of one tenant.
    pub tenant: LevelLimits,
    /// Of each user.
    pub user: LevelLimits,
    /// Of each session of a user.
    pub session: LevelLimits,
}

impl ModelLimits {
    /// Checks the levels, that the user fits within the tenant and the
    /// session within the user.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        self.tenant.validate(&format!("{path}.tenant"))?;
        self.user.validate(&format!("{path}.user"))?;
        self.session.validate(&format!("{path}.session"))?;
        user_within_tenant(path, &self.user, &self.tenant)?;
        session_within_user(path, &self.session, &self.user)
    }
}

/// The tenant- and user-level limits of a quota in shadow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShadowLimits {
    /// Tenant-level limits.
    pub tenant: LevelLimits,
    /// User-level limits.
    pub user: LevelLimits,
    /// Per-model-group limits in shadow, by group name.
    pub models: BTreeMap<String, ModelLimits>,
}

impl ShadowLimits {
    fn validate(&self, path: &str) -> Result<(), LimitsError> {
        self.tenant.validate(&format!("{path}.tenant"))?;
        self.user.validate(&format!("{path}.user"))?;
        user_within_tenant(path, &self.user, &self.tenant)?;
        if let Some((name, _)) = self.models.iter().find(|(_, m)| !m.session.is_unlimited()) {
            return Err(LimitsError::new(
                format!("{path}.models.{name}.session"),
                "a quota in shadow has tenant and user levels only; move session limits \
                 to the tier itself",
            ));
        }
        validate_models(&format!("{path}.models"), &self.models)
    }
}

/// Checks each group's limits of a `models` table.
fn validate_models(path: &str, models: &BTreeMap<String, ModelLimits>) -> Result<(), LimitsError> {
    models
        .iter()
        .try_for_each(|(name, m)| m.validate(&format!("{path}.{name}")))
}

impl Tier {
    /// Checks the tier's own rules; `path` prefixes field names in errors.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        if !is_tier_name(&self.name) {
            return Err(LimitsError::new(
                path.to_string(),
                format!(
                    "tier name {:?} must be 1-64 characters of a-z, A-Z, 0-9, '-', '_' or '.'",
                    self.name
                ),
            ));
        }
        self.tenant.validate(&format!("{path}.tenant"))?;
        self.user.validate(&format!("{path}.user"))?;
        self.session.validate(&format!("{path}.session"))?;
        if !(1..=MAX_SESSION_TTL_SECS).contains(&self.session_ttl_secs) {
            return Err(LimitsError::new(
                format!("{path}.session_ttl"),
                format!(
                    "{}s is out of range: give between 1s and 90d",
                    self.session_ttl_secs
                ),
            ));
        }
        if self.max_context_tokens == 0 || self.max_context_tokens > MAX_COUNT {
            return Err(LimitsError::new(
                format!("{path}.max_context_tokens"),
                format!("must be between 1 and {MAX_COUNT}"),
            ));
        }
        check_weight(path, self.weight)?;
        if self.default_max_output_tokens > self.max_context_tokens {
            return Err(LimitsError::new(
                format!("{path}.default_max_output_tokens"),
                format!(
                    "{} is above max_context_tokens {}",
                    self.default_max_output_tokens, self.max_context_tokens
                ),
            ));
        }
        user_within_tenant(path, &self.user, &self.tenant)?;
        session_within_user(path, &self.session, &self.user)?;
        if let Some(shadow) = &self.shadow {
            shadow.validate(&format!("{path}.shadow"))?;
        }
        validate_models(&format!("{path}.models"), &self.models)
    }
}

/// The tier-name rule, for configured tiers, requests and reservation ids
/// alike: 1-64 characters of a-z, A-Z, 0-9, '-', '_' or '.'.
pub fn is_tier_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_TIER_NAME_CHARS && name.chars().all(is_name_char)
}

/// Longest tier name, in bytes (tier names are ASCII).
pub const MAX_TIER_NAME_CHARS: usize = 64;

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// The longest `session_ttl`: a key's longest life, 90 days.
pub const MAX_SESSION_TTL_SECS: u64 = 90 * 86_400;
/// `session_ttl` when a tier names none: a day.
pub const DEFAULT_SESSION_TTL_SECS: u64 = 86_400;

/// A user can never use more than its tenant: a user limit above the tenant's
/// limit of the same dimension and period is a configuration mistake.
pub(crate) fn user_within_tenant(
    path: &str,
    user: &LevelLimits,
    tenant: &LevelLimits,
) -> Result<(), LimitsError> {
    inner_within_outer(path, (Level::User, user), (Level::Tenant, tenant))
}

/// Nor can a session use more than its user.
pub(crate) fn session_within_user(
    path: &str,
    session: &LevelLimits,
    user: &LevelLimits,
) -> Result<(), LimitsError> {
    inner_within_outer(path, (Level::Session, session), (Level::User, user))
}

fn inner_within_outer(
    path: &str,
    (inner_level, inner): (Level, &LevelLimits),
    (outer_level, outer): (Level, &LevelLimits),
) -> Result<(), LimitsError> {
    for (name, inners, outers) in
        Dimension::RATES.map(|d| (d.as_str(), inner.rates(d), outer.rates(d)))
    {
        for (i, u) in inners.iter().enumerate() {
            if let Some(t) = outers.iter().find(|t| t.period_secs == u.period_secs)
                && u.limit > t.limit
            {
                return Err(LimitsError::new(
                    format!("{path}.{inner_level}.{name}[{i}].limit"),
                    format!(
                        "{inner_level} limit {} is above the {outer_level} limit {} for the same {}s period",
                        u.limit, t.limit, u.period_secs
                    ),
                ));
            }
        }
    }
    if let (Some(u), Some(t)) = (inner.concurrency, outer.concurrency)
        && u > t
    {
        return Err(LimitsError::new(
            format!("{path}.{inner_level}.concurrency"),
            format!("{inner_level} concurrency {u} is above the {outer_level} concurrency {t}"),
        ));
    }
    Ok(())
}

/// A set of limits broke a rule; `field` is the dotted path of the culprit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct LimitsError {
    /// Dotted path of the offending field, e.g. `tiers.pro.user.tokens[0].period`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl LimitsError {
    /// Builds an error for `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        LimitsError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    pub(crate) use super::tests::tier;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DimMap, Dimension};

    pub(crate) fn tier() -> Tier {
        Tier {
            weight: 1,
            name: "pro".into(),
            tenant: LevelLimits {
                rates: DimMap::with([(
                    Dimension::Requests,
                    vec![Rate {
                        limit: 100,
                        period_secs: 60,
                        window: None,
                        alert_at: Default::default(),
                    }],
                )]),
                concurrency: Some(10),
                ..LevelLimits::default()
            },
            user: LevelLimits {
                rates: DimMap::with([
                    (
                        Dimension::Requests,
                        vec![Rate {
                            limit: 10,
                            period_secs: 60,
                            window: None,
                            alert_at: Default::default(),
                        }],
                    ),
                    (
                        Dimension::Tokens,
                        vec![Rate {
                            limit: 1000,
                            period_secs: 60,
                            window: None,
                            alert_at: Default::default(),
                        }],
                    ),
                ]),
                concurrency: Some(2),
                ..LevelLimits::default()
            },
            session: LevelLimits::default(),
            session_ttl_secs: DEFAULT_SESSION_TTL_SECS,
            max_context_tokens: 1000,
            default_max_output_tokens: 100,
            shadow: None,
            models: BTreeMap::new(),
        }
    }

    #[test]
    fn a_sound_tier_passes() {
        assert_eq!(tier().validate("tiers.pro"), Ok(()));
    }

    #[test]
    fn user_above_tenant_names_the_field() {
        let mut t = tier();
        t.user.rates[Dimension::Requests][0].limit = 101;
        let err = t.validate("tiers.pro").unwrap_err();
        assert_eq!(err.field, "tiers.pro.user.requests[0].limit");
    }

    #[test]
    fn a_session_above_its_user_or_an_unbounded_session_ttl_names_the_field() {
        let mut t = tier();
        t.session.rates[Dimension::Requests] = vec![Rate {
            limit: 11,
            period_secs: 60,
            window: None,
            alert_at: Default::default(),
        }];
        let err = t.validate("tiers.pro").unwrap_err();
        assert_eq!(err.field, "tiers.pro.session.requests[0].limit");
        assert!(err.problem.contains("above the user limit"), "{err}");
        t.session.rates[Dimension::Requests][0].limit = 10;
        t.session.concurrency = Some(3);
        let err = t.validate("tiers.pro").unwrap_err();
        assert_eq!(err.field, "tiers.pro.session.concurrency");
        t.session.concurrency = Some(2);
        assert_eq!(t.validate("tiers.pro"), Ok(()));
        for ttl in [0, MAX_SESSION_TTL_SECS + 1] {
            t.session_ttl_secs = ttl;
            let err = t.validate("tiers.pro").unwrap_err();
            assert_eq!(err.field, "tiers.pro.session_ttl", "{ttl}");
        }
        t.session_ttl_secs = DEFAULT_SESSION_TTL_SECS;
        let mut shadow = ShadowLimits::default();
        shadow.models.insert(
            "g".into(),
            ModelLimits {
                session: t.session.clone(),
                ..ModelLimits::default()
            },
        );
        t.shadow = Some(shadow);
        let err = t.validate("tiers.pro").unwrap_err();
        assert_eq!(err.field, "tiers.pro.shadow.models.g.session");
    }

    #[test]
    fn periods_outside_one_second_to_thirty_days_are_refused() {
        let mut t = tier();
        t.user.rates[Dimension::Tokens][0].period_secs = MAX_PERIOD_SECS + 1;
        assert_eq!(
            t.validate("tiers.pro").unwrap_err().field,
            "tiers.pro.user.tokens[0].period"
        );
        t.user.rates[Dimension::Tokens][0].period_secs = 0;
        assert!(t.validate("tiers.pro").is_err());
    }

    #[test]
    fn duplicate_periods_are_refused() {
        let mut t = tier();
        t.user.rates[Dimension::Tokens].push(Rate {
            limit: 5,
            period_secs: 60,
            window: None,
            alert_at: Default::default(),
        });
        assert_eq!(
            t.validate("tiers.pro").unwrap_err().field,
            "tiers.pro.user.tokens[1].period"
        );
    }
}
