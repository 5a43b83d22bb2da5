//! The levels a request passes through and what each checks: its buckets and
//! its concurrency limit, from the limits in force (or a quota in shadow), and
//! one replica's share of them while replicas decide apart.
//!
//! A request for a model of a group checks, at every level, the level's
//! all-model limits and the group's limits there. The group's rates are
//! buckets in the level's own state (their ids carry the group's tag), so they
//! cost no extra key; the group's concurrency limit at a level is a plan entry
//! of its own (`slots`), kept under its own key, since a lease must count
//! toward the group's slots and the level's apart.

use super::bucket::{BucketSpec, Windowed};
use super::layout::MAX_TTL_US;
use super::level::{Dimension, Level};
use super::limits::Limits;
use super::model::ModelGroup;
use super::output::{OutputReservation, OverrunCredit};
use super::tier::{DEFAULT_SESSION_TTL_SECS, LevelLimits, ModelLimits, ShadowLimits, Tier};
use std::sync::Arc;

/// What one level checks: its buckets and its concurrency limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelPlan {
    /// The level.
    pub level: Level,
    /// The request's model group, when this entry holds any of its limits.
    pub group: Option<Arc<ModelGroup>>,
    /// True for the group's concurrency slots at this level (a key of its
    /// own, no buckets); false for the level itself.
    pub slots: bool,
    /// Buckets in plan order: the all-model ones (requests, tokens, input,
    /// output tokens, each in configuration order), then the group's.
    pub buckets: Vec<BucketSpec>,
    /// The concurrency limit; `None` means unlimited (no lease is kept).
    pub concurrency: Option<u64>,
    /// The overrun credit, when the level holds the learned output.
    pub overrun: Option<OverrunCredit>,
    /// At the session level, the tier's `session_ttl` (seconds): the level's
    /// key lives at most this long past its last write, however long its
    /// buckets take to refill. `None` elsewhere (up to [`MAX_TTL_US`]).
    pub idle_secs: Option<u64>,
}

impl LevelPlan {
    /// The plan of one level's all-model limits at `now_us` (where calendar
    /// windows' boundaries fall).
    pub fn new(level: Level, limits: &LevelLimits, now_us: i64) -> Self {
        let mut buckets = Vec::with_capacity(rate_count(limits));
        push_rates(&mut buckets, level, limits, 0, now_us);
        LevelPlan {
            level,
            group: None,
            slots: false,
            buckets,
            concurrency: limits.concurrency,
            overrun: overrun_credit(limits),
            idle_secs: None,
        }
    }

    /// The plan of a level's all-model limits `all` and `group`'s limits
    /// there (`of_group`), and the entry of the group's slots at the level
    /// (its concurrency limit; `None` when it has none).
    pub fn with_group(
        level: Level,
        all: &LevelLimits,
        group: &Arc<ModelGroup>,
        of_group: Option<&LevelLimits>,
        now_us: i64,
    ) -> (LevelPlan, LevelPlan) {
        let empty = LevelLimits::default();
        let of_group = of_group.unwrap_or(&empty);
        let mut buckets = Vec::with_capacity(rate_count(all) + rate_count(of_group));
        push_rates(&mut buckets, level, all, 0, now_us);
        push_rates(&mut buckets, level, of_group, group.tag(), now_us);
        let has_group = buckets.len() > rate_count(all);
        let main = LevelPlan {
            level,
            group: has_group.then(|| group.clone()),
            slots: false,
            buckets,
            concurrency: all.concurrency,
            overrun: overrun_credit(all).or_else(|| overrun_credit(of_group)),
            idle_secs: None,
        };
        let slots = LevelPlan {
            level,
            group: Some(group.clone()),
            slots: true,
            buckets: Vec::new(),
            concurrency: of_group.concurrency,
            overrun: None,
            idle_secs: None,
        };
        (main, slots)
    }

    /// The bit of this entry in a reservation's lease mask: the level's bit,
    /// or its group slots' bit.
    pub fn bit(&self) -> u8 {
        match self.slots {
            true => self.level.slots_bit(),
            false => self.level.bit(),
        }
    }

    /// The name of the model group a bucket of this entry belongs to (`None`
    /// for an all-model bucket).
    pub fn group_of(&self, bucket: &BucketSpec) -> Option<&str> {
        match bucket.group {
            0 => None,
            _ => self.group.as_deref().map(|g| g.name.as_str()),
        }
    }

    /// The name of the model group this entry's concurrency limit belongs to.
    pub fn concurrency_group(&self) -> Option<&str> {
        match self.slots {
            true => self.group.as_deref().map(|g| g.name.as_str()),
            false => None,
        }
    }

    /// The level with every limit divided by `parts` (at least 1 each): one
    /// replica's share while replicas decide apart.
    pub fn scaled(&self, parts: u64) -> LevelPlan {
        let parts = parts.max(1);
        LevelPlan {
            buckets: self
                .buckets
                .iter()
                .map(|b| BucketSpec {
                    limit: (b.limit / parts).max(1),
                    ..*b
                })
                .collect(),
            concurrency: self.concurrency.map(|c| (c / parts).max(1)),
            overrun: self.overrun.map(|o| OverrunCredit {
                capacity: o.capacity / parts,
                ..o
            }),
            ..self.clone()
        }
    }

    /// The longest the level's key may live past a write (µs): a session's
    /// `session_ttl`, else [`MAX_TTL_US`].
    pub fn max_life_us(&self) -> f64 {
        self.idle_secs
            .map_or(MAX_TTL_US, |s| (s as f64 * 1e6).min(MAX_TTL_US))
    }

    /// True when the level holds output: it has a bucket the output counts
    /// in ([`Dimension::counts_output`]).
    pub fn holds_output(&self) -> bool {
        self.buckets.iter().any(|b| b.dimension.counts_output())
    }

    /// True when the level checks nothing.
    pub fn is_unlimited(&self) -> bool {
        self.buckets.is_empty() && self.concurrency.is_none()
    }

    /// How many readings a store reports for this level: one per bucket, plus one
    /// for concurrency.
    pub fn reading_count(&self) -> usize {
        self.buckets.len() + usize::from(self.concurrency.is_some())
    }
}

/// The overrun credit of a level whose limits are `limits`, when its output
/// is learned: `output_overrun` × its [`LevelLimits::overrun_basis`] rate.
pub fn overrun_credit(limits: &LevelLimits) -> Option<OverrunCredit> {
    let OutputReservation::Learned { overrun_permille } = limits.output else {
        return None;
    };
    let basis = limits.overrun_basis()?;
    Some(OverrunCredit {
        capacity: basis.limit.saturating_mul(u64::from(overrun_permille)) / 1000,
        period_secs: basis.period_secs,
    })
}

fn rate_count(limits: &LevelLimits) -> usize {
    Dimension::RATES
        .iter()
        .map(|&d| limits.rates(d).len())
        .sum()
}

fn push_rates(
    out: &mut Vec<BucketSpec>,
    level: Level,
    limits: &LevelLimits,
    group: u32,
    now_us: i64,
) {
    for dimension in Dimension::RATES {
        out.extend(limits.rates(dimension).iter().map(|r| BucketSpec {
            level,
            dimension,
            limit: r.limit,
            period_secs: r.period_secs,
            group,
            window: r.window.map(|window| Windowed {
                window,
                span: window.span(now_us),
            }),
            alert_at: r.alert_at,
        }));
    }
}

/// Who a request is for: its tier (none once removed) and model group, and
/// whether it names a user and a session.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    /// The tier's limits in force for the tenant.
    pub tier: Option<&'a Tier>,
    /// The model's group, if the model has one.
    pub group: Option<&'a Arc<ModelGroup>>,
    /// True when user-level limits apply.
    pub has_user: bool,
    /// True when session-level limits apply.
    pub has_session: bool,
    /// When (µs): where calendar windows' boundaries fall.
    pub now_us: i64,
}

/// The levels a request passes through, outermost first: global, tenant,
/// user when the request names one and session when it names one (a session
/// with no user is one of the tenant's), each followed by its model group's slots
/// when the group limits concurrency there. With `keep_unlimited` false,
/// entries without any limit are dropped (they cost no store work); with it
/// true, a group's slots are listed at every level (settling must free a
/// lease taken under limits since removed).
pub fn levels(limits: &Limits, scope: Scope<'_>, keep_unlimited: bool) -> Vec<LevelPlan> {
    let empty = LevelLimits::default();
    let models = scope
        .group
        .and_then(|g| scope.tier.and_then(|t| t.models.get(&g.name)));
    let all = [
        (
            Level::Global,
            &limits.global,
            scope.group.map(|g| &g.global),
        ),
        (
            Level::Tenant,
            scope.tier.map_or(&empty, |t| &t.tenant),
            models.map(|m| &m.tenant),
        ),
        (
            Level::User,
            scope.tier.map_or(&empty, |t| &t.user),
            models.map(|m| &m.user),
        ),
        (
            Level::Session,
            scope.tier.map_or(&empty, |t| &t.session),
            models.map(|m| &m.session),
        ),
    ];
    let named = [true, true, scope.has_user, scope.has_session];
    let mut out = Vec::new();
    for (sources, _) in all.iter().zip(named).filter(|(_, named)| *named) {
        plan_levels(&mut out, sources, scope.group, keep_unlimited, scope.now_us);
    }
    if scope.has_session {
        let idle = scope
            .tier
            .map_or(DEFAULT_SESSION_TTL_SECS, |t| t.session_ttl_secs);
        out.iter_mut()
            .filter(|l| l.level == Level::Session)
            .for_each(|l| l.idle_secs = Some(idle));
    }
    out
}

/// The levels of a quota in shadow: tenant and (with a user) user, with the
/// model group's limits in shadow; the global level is never in shadow.
pub fn shadow_levels(
    shadow: &ShadowLimits,
    group: Option<&Arc<ModelGroup>>,
    has_user: bool,
    keep_unlimited: bool,
    now_us: i64,
) -> Vec<LevelPlan> {
    let models: Option<&ModelLimits> = group.and_then(|g| shadow.models.get(&g.name));
    let all = [
        (Level::Tenant, &shadow.tenant, models.map(|m| &m.tenant)),
        (Level::User, &shadow.user, models.map(|m| &m.user)),
    ];
    let n = if has_user { 2 } else { 1 };
    let mut out = Vec::new();
    for sources in &all[..n] {
        plan_levels(&mut out, sources, group, keep_unlimited, now_us);
    }
    out
}

/// One level's all-model limits and its model group's, if any.
type LevelSources<'a> = (Level, &'a LevelLimits, Option<&'a LevelLimits>);

/// Appends one level's entries to `out`: the level, then its group's slots
/// when listed; with `keep_unlimited` false, only entries with a limit.
fn plan_levels(
    out: &mut Vec<LevelPlan>,
    &(level, limits, of_group): &LevelSources<'_>,
    group: Option<&Arc<ModelGroup>>,
    keep_unlimited: bool,
    now_us: i64,
) {
    let mut push = |entry: LevelPlan| {
        if keep_unlimited || !entry.is_unlimited() {
            out.push(entry);
        }
    };
    match group {
        None => push(LevelPlan::new(level, limits, now_us)),
        Some(g) => {
            let (main, slots) = LevelPlan::with_group(level, limits, g, of_group, now_us);
            push(main);
            if keep_unlimited || slots.concurrency.is_some() {
                push(slots);
            }
        }
    }
}

#[cfg(test)]
mod tests;
