//! Decisions: what a store's readings mean for the caller. A denial is a value
//! with a reason, the level that denied, when to retry and a sentence for people;
//! never an error.

use super::bucket::{BucketSpec, Cost, from_milli};
use super::checks::DeniedChecks;
pub use super::denial::{Denial, Reason, period_label};
use super::denial::{Slots, bucket_denial, concurrency_denial};
use super::level::{Dimension, Level};
use super::level_plan::LevelPlan;
use super::model::ModelGroup;
use super::window::Window;
use std::sync::Arc;

/// One value a store reports per check, in plan order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// A bucket's level in thousandths of a unit.
    Bucket {
        /// `floor(level * 1000)`.
        milli: i64,
    },
    /// A concurrency limit's live leases.
    Concurrency {
        /// Live leases.
        active: u64,
        /// Milliseconds until the earliest live lease lapses; 0 with none.
        earliest_expiry_ms: u64,
    },
}

/// A store's readings for a plan, one per check, in plan order.
pub type Readings = Vec<Reading>;

/// The state of one limit after a call, as reported to callers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitState {
    /// The level.
    pub level: Level,
    /// The model group the limit belongs to; `None` for all models.
    pub model_group: Option<Arc<ModelGroup>>,
    /// The dimension.
    pub dimension: Dimension,
    /// The period; 0 for concurrency and calendar windows.
    pub period_secs: u64,
    /// The calendar window, for a windowed limit.
    pub window: Option<Window>,
    /// The limit.
    pub limit: u64,
    /// What is left; negative while in debt.
    pub remaining: i64,
    /// Milliseconds until full again (for concurrency: until the earliest lease lapses).
    pub reset_after_ms: u64,
}

/// One check of a plan paired with its reading, and the entry it belongs to.
enum Checked<'a> {
    Bucket(&'a LevelPlan, &'a BucketSpec, f64),
    Concurrency(&'a LevelPlan, u64, u64, u64),
}

fn checked<'a>(
    levels: &'a [LevelPlan],
    readings: &'a [Reading],
) -> impl Iterator<Item = Checked<'a>> + 'a {
    let mut readings = readings.iter();
    levels.iter().flat_map(move |plan| {
        let mut out = Vec::with_capacity(plan.reading_count());
        for bucket in &plan.buckets {
            if let Some(Reading::Bucket { milli }) = readings.next() {
                out.push(Checked::Bucket(plan, bucket, from_milli(*milli)));
            }
        }
        if let Some(limit) = plan.concurrency
            && let Some(Reading::Concurrency {
                active,
                earliest_expiry_ms,
            }) = readings.next()
        {
            out.push(Checked::Concurrency(
                plan,
                limit,
                *active,
                *earliest_expiry_ms,
            ));
        }
        out
    })
}

/// The caller-facing state of every limit in `levels` given a store's readings.
pub fn limit_states(levels: &[LevelPlan], readings: &[Reading]) -> Vec<LimitState> {
    checked(levels, readings)
        .map(|c| match c {
            Checked::Bucket(plan, b, level) => LimitState {
                level: b.level,
                model_group: match b.group {
                    0 => None,
                    _ => plan.group.clone(),
                },
                dimension: b.dimension,
                period_secs: b.period_secs,
                window: b.window.map(|w| w.window),
                limit: b.limit,
                remaining: level.floor() as i64,
                reset_after_ms: b.reset_after_ms(level),
            },
            Checked::Concurrency(plan, limit, active, earliest) => LimitState {
                level: plan.level,
                model_group: plan.slots.then(|| plan.group.clone()).flatten(),
                dimension: Dimension::Concurrency,
                period_secs: 0,
                window: None,
                limit,
                remaining: limit as i64 - active as i64,
                reset_after_ms: earliest,
            },
        })
        .collect()
}

/// Whether every check in `denied_mask` is of the global level (its own
/// limits, or a model group's there): a denial that room in the shared
/// upstream account can lift, so the call may wait in line for it. False
/// when any tenant, user or session limit denied, or none did.
pub fn denied_only_globally(
    levels: &[LevelPlan],
    readings: &[Reading],
    denied_mask: DeniedChecks,
) -> bool {
    let mut any = false;
    for (i, c) in checked(levels, readings).enumerate() {
        if !denied_mask.contains(i) {
            continue;
        }
        let (Checked::Bucket(plan, ..) | Checked::Concurrency(plan, ..)) = c;
        if plan.level != Level::Global {
            return false;
        }
        any = true;
    }
    any
}

/// Explains a store's refusal: of the checks in `denied_mask`,
/// the one with the longest wait names the reason and level, since a retry must
/// pass them all. Ties go to the outer level. A full concurrency limit suggests a
/// retry when its earliest lease lapses, capped at `concurrency_retry_cap_ms`
/// because Commit and Refund usually free slots sooner. With `headroom`, the
/// wait is until the limit has room for the cost above the share kept for
/// higher priorities.
pub fn denial(
    levels: &[LevelPlan],
    readings: &[Reading],
    denied_mask: DeniedChecks,
    cost: Cost,
    headroom: f64,
    concurrency_retry_cap_ms: u64,
) -> Denial {
    denial_by(
        levels,
        readings,
        denied_mask,
        |b| b.cost(cost),
        headroom,
        concurrency_retry_cap_ms,
    )
}

/// [`denial`] with each bucket's cost from `cost_of`: for a call whose cost
/// is no reservation's (a charge: N requests, one unit of room elsewhere).
pub fn denial_by(
    levels: &[LevelPlan],
    readings: &[Reading],
    denied_mask: DeniedChecks,
    cost_of: impl Fn(&BucketSpec) -> u64,
    headroom: f64,
    concurrency_retry_cap_ms: u64,
) -> Denial {
    let mut worst: Option<Denial> = None;
    for (i, c) in checked(levels, readings).enumerate() {
        if !denied_mask.contains(i) {
            continue;
        }
        let d = match c {
            Checked::Bucket(plan, b, level) => {
                bucket_denial(b, plan.group_of(b), level, cost_of(b), headroom)
            }
            Checked::Concurrency(plan, limit, active, earliest) => concurrency_denial(
                plan,
                Slots {
                    limit,
                    active,
                    earliest_expiry_ms: earliest,
                },
                headroom,
                concurrency_retry_cap_ms,
            ),
        };
        if worst
            .as_ref()
            .is_none_or(|w| d.retry_after_ms > w.retry_after_ms)
        {
            worst = Some(d);
        }
    }
    worst.unwrap_or_else(|| Denial {
        reason: Reason::ConcurrencyExceeded,
        level: None,
        dimension: None,
        period_secs: 0,
        model_group: None,
        retry_after_ms: concurrency_retry_cap_ms,
        detail: "the store refused the reservation without naming a limit; retry shortly".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Vec<LevelPlan> {
        vec![LevelPlan {
            level: Level::User,
            buckets: vec![
                BucketSpec {
                    level: Level::User,
                    dimension: Dimension::Requests,
                    limit: 60,
                    period_secs: 60,
                    group: 0,
                    window: None,
                    alert_at: Default::default(),
                },
                BucketSpec {
                    level: Level::User,
                    dimension: Dimension::Tokens,
                    limit: 6000,
                    period_secs: 60,
                    group: 0,
                    window: None,
                    alert_at: Default::default(),
                },
            ],
            concurrency: Some(2),
            overrun: None,
            idle_secs: None,
            group: None,
            slots: false,
        }]
    }

    #[test]
    fn the_longest_wait_names_the_reason() {
        let readings = [
            Reading::Bucket { milli: 0 },
            Reading::Bucket { milli: 100_000 },
            Reading::Concurrency {
                active: 2,
                earliest_expiry_ms: 30_000,
            },
        ];
        // Requests need 1 s, tokens (500 needed, 100 left) need 4 s, concurrency is capped at 1 s.
        let cost = Cost::reservation(400, 100, 0, &Default::default());
        let d = denial(&plan(), &readings, 0b111.into(), cost, 0.0, 1000);
        assert_eq!(d.reason, Reason::TokensExceeded);
        assert_eq!(d.level, Some(Level::User));
        assert_eq!(d.retry_after_ms, 4000);
        let d = denial(&plan(), &readings, 0b001.into(), cost, 0.0, 1000);
        assert_eq!(
            (d.reason, d.retry_after_ms),
            (Reason::RequestsExceeded, 1000)
        );
    }

    #[test]
    fn headroom_waits_for_the_cost_and_the_share_kept() {
        let readings = [
            Reading::Bucket { milli: 60_000 },
            Reading::Bucket { milli: 3_000_000 },
            Reading::Concurrency {
                active: 0,
                earliest_expiry_ms: 0,
            },
        ];
        let cost = Cost::reservation(2000, 0, 0, &Default::default());
        // 3000 of 6000 left, 2000 wanted, 30% (1800) kept: wait for 800 more
        // tokens at 100 a second.
        let d = denial(&plan(), &readings, 0b010.into(), cost, 0.3, 1000);
        assert_eq!((d.reason, d.retry_after_ms), (Reason::TokensExceeded, 8000));
        assert!(d.detail.contains("the last 30% is kept"), "{}", d.detail);
        // Without headroom the same bucket would have had room: no such note
        // when the cost alone does not fit.
        let short = [
            readings[0],
            Reading::Bucket { milli: 1_000_000 },
            readings[2],
        ];
        let d = denial(&plan(), &short, 0b010.into(), cost, 0.0, 1000);
        assert!(!d.detail.contains("kept"), "{}", d.detail);
        assert_eq!(d.retry_after_ms, 10_000);
    }

    #[test]
    fn states_report_debt_and_reset() {
        let readings = [
            Reading::Bucket { milli: 60_000 },
            Reading::Bucket { milli: -600_500 },
            Reading::Concurrency {
                active: 1,
                earliest_expiry_ms: 900,
            },
        ];
        let s = limit_states(&plan(), &readings);
        assert_eq!(s[0].remaining, 60);
        assert_eq!(s[0].reset_after_ms, 0);
        assert_eq!(s[1].remaining, -601);
        assert_eq!(s[1].reset_after_ms, 66_005);
        assert_eq!((s[2].remaining, s[2].reset_after_ms), (1, 900));
    }

    #[test]
    fn periods_read_naturally() {
        assert_eq!(period_label(60), "1m");
        assert_eq!(period_label(86_400), "1d");
        assert_eq!(period_label(90), "90s");
    }
}
