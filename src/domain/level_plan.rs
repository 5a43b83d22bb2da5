//! The levels a request passes through and what each checks: its buckets and
//! its concurrency limit, from the limits in force (or a quota in shadow), and
//! one replica's share of them while replicas decide apart.

use super::bucket::BucketSpec;
use super::level::{Dimension, Level};
use super::limits::Limits;
use super::tier::{LevelLimits, Rate, ShadowLimits, Tier};

/// What one level checks: its buckets and its concurrency limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelPlan {
    /// The level.
    pub level: Level,
    /// Request buckets, then token buckets, in configuration order.
    pub buckets: Vec<BucketSpec>,
    /// The level's concurrency limit; `None` means unlimited (no lease is kept).
    pub concurrency: Option<u64>,
}

impl LevelPlan {
    /// The plan of one level's limits.
    pub fn new(level: Level, limits: &LevelLimits) -> Self {
        let rates = |dimension, rates: &[Rate]| {
            rates
                .iter()
                .map(move |r| BucketSpec {
                    level,
                    dimension,
                    limit: r.limit,
                    period_secs: r.period_secs,
                })
                .collect::<Vec<_>>()
        };
        let mut buckets = rates(Dimension::Requests, &limits.requests);
        buckets.extend(rates(Dimension::Tokens, &limits.tokens));
        LevelPlan {
            level,
            buckets,
            concurrency: limits.concurrency,
        }
    }

    /// The level with every limit divided by `parts` (at least 1 each): one
    /// replica's share while replicas decide apart.
    pub fn scaled(&self, parts: u64) -> LevelPlan {
        let parts = parts.max(1);
        LevelPlan {
            level: self.level,
            buckets: self
                .buckets
                .iter()
                .map(|b| BucketSpec {
                    limit: (b.limit / parts).max(1),
                    ..*b
                })
                .collect(),
            concurrency: self.concurrency.map(|c| (c / parts).max(1)),
        }
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

/// The levels a request passes through, outermost first: global, tenant, and
/// user when the request names one. With `keep_unlimited` false, levels without
/// any limit are dropped (they cost no store work).
pub fn levels(
    limits: &Limits,
    tier: Option<&Tier>,
    has_user: bool,
    keep_unlimited: bool,
) -> Vec<LevelPlan> {
    let empty = LevelLimits::default();
    let mut out = vec![
        LevelPlan::new(Level::Global, &limits.global),
        LevelPlan::new(Level::Tenant, tier.map_or(&empty, |t| &t.tenant)),
    ];
    if has_user {
        out.push(LevelPlan::new(
            Level::User,
            tier.map_or(&empty, |t| &t.user),
        ));
    }
    if !keep_unlimited {
        out.retain(|l| !l.is_unlimited());
    }
    out
}

/// The levels of a quota in shadow: tenant and (with a user) user; the global
/// level is never in shadow.
pub fn shadow_levels(
    shadow: &ShadowLimits,
    has_user: bool,
    keep_unlimited: bool,
) -> Vec<LevelPlan> {
    let mut out = vec![LevelPlan::new(Level::Tenant, &shadow.tenant)];
    if has_user {
        out.push(LevelPlan::new(Level::User, &shadow.user));
    }
    if !keep_unlimited {
        out.retain(|l| !l.is_unlimited());
    }
    out
}
