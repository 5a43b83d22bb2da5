//! Decisions: what a store's readings mean for the caller. A denial is a value
//! with a reason, the level that denied, when to retry and a sentence for people;
//! never an error.

use super::bucket::{BucketSpec, Cost, from_milli};
use super::level::{Dimension, Level};
use super::level_plan::LevelPlan;
use super::model::ModelGroup;
use super::tier::Tier;
use std::sync::Arc;

/// Why a request was denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A request-count bucket is empty.
    RequestsExceeded,
    /// A token bucket lacks room for the request.
    TokensExceeded,
    /// Every concurrency slot is held.
    ConcurrencyExceeded,
    /// Prompt + output exceed the tier's max context.
    ContextTooLarge,
    /// The request needs more tokens than a bucket can ever hold.
    RequestTooLarge,
}

impl Reason {
    /// Lower-case name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RequestsExceeded => "rpm_exceeded",
            Reason::TokensExceeded => "tpm_exceeded",
            Reason::ConcurrencyExceeded => "concurrency_exceeded",
            Reason::ContextTooLarge => "context_too_large",
            Reason::RequestTooLarge => "request_too_large",
        }
    }
}

/// A refusal, with everything a caller needs to act on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// Why.
    pub reason: Reason,
    /// The level whose limit denied; `None` for a tier-wide rule (context size).
    pub level: Option<Level>,
    /// The dimension of the denying limit.
    pub dimension: Option<Dimension>,
    /// The period of the denying limit (0 for concurrency and context).
    pub period_secs: u64,
    /// The model group of the denying limit; `None` for an all-model limit.
    pub model_group: Option<String>,
    /// Milliseconds until a retry could succeed, before jitter; 0 when retrying
    /// cannot help.
    pub retry_after_ms: u64,
    /// What happened and what to do, in one sentence.
    pub detail: String,
}

impl Denial {
    /// Prompt + output exceed the max context — the tier's, or the model
    /// group's context window when that is smaller: the request must shrink.
    pub fn context_too_large(
        prompt: u64,
        output: u64,
        tier: &Tier,
        group: Option<&ModelGroup>,
    ) -> Self {
        let window = group.and_then(|g| Some((g, g.context_window?)));
        let (bound, limit, model_group) = match window {
            Some((g, w)) if w < tier.max_context_tokens => (
                format!("context window of the {} models", g.name),
                w,
                Some(g.name.clone()),
            ),
            _ => (
                format!("{} tier's max context", tier.name),
                tier.max_context_tokens,
                None,
            ),
        };
        Denial {
            reason: Reason::ContextTooLarge,
            level: None,
            dimension: Some(Dimension::Tokens),
            period_secs: 0,
            model_group,
            retry_after_ms: 0,
            detail: format!(
                "prompt {prompt} + output {output} tokens exceed the {bound} of {limit} \
                 tokens; shorten the prompt or lower max_output_tokens"
            ),
        }
    }

    /// The request needs more than `bucket` can ever hold — or, with
    /// `headroom`, more than this priority may ever take of it.
    pub fn request_too_large(
        bucket: &BucketSpec,
        group: Option<&str>,
        cost: u64,
        headroom: f64,
    ) -> Self {
        let kept = if headroom > 0.0 {
            format!(
                " ({:.0}% of it is kept for higher-priority requests)",
                headroom * 100.0
            )
        } else {
            String::new()
        };
        Denial {
            reason: Reason::RequestTooLarge,
            level: Some(bucket.level),
            dimension: Some(bucket.dimension),
            period_secs: bucket.period_secs,
            model_group: group.map(str::to_owned),
            retry_after_ms: 0,
            detail: format!(
                "this request needs {cost} {} but the {} limit is {} per {}{kept}; \
                 retrying cannot help: shorten the prompt or lower max_output_tokens",
                unit(bucket.dimension),
                limit_name(bucket.level, group, bucket.dimension),
                bucket.limit,
                period_label(bucket.period_secs)
            ),
        }
    }
}

/// What a dimension counts, for sentences.
fn unit(dimension: Dimension) -> &'static str {
    match dimension {
        Dimension::Requests | Dimension::Concurrency => "requests",
        Dimension::Tokens => "tokens",
        Dimension::InputTokens => "input tokens",
        Dimension::OutputTokens => "output tokens",
    }
}

/// "tenant gpt-4o output-token limit", for sentences.
fn limit_name(level: Level, group: Option<&str>, dimension: Dimension) -> String {
    let what = match dimension {
        Dimension::Requests => "request",
        Dimension::Tokens => "token",
        Dimension::InputTokens => "input-token",
        Dimension::OutputTokens => "output-token",
        Dimension::Concurrency => "concurrency",
    };
    match group {
        Some(g) => format!("{level} {g} {what}"),
        None => format!("{level} {what}"),
    }
}

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
    /// The period; 0 for concurrency.
    pub period_secs: u64,
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
                limit: b.limit,
                remaining: level.floor() as i64,
                reset_after_ms: b.until_full_us(level).div_ceil(1000),
            },
            Checked::Concurrency(plan, limit, active, earliest) => LimitState {
                level: plan.level,
                model_group: plan.slots.then(|| plan.group.clone()).flatten(),
                dimension: Dimension::Concurrency,
                period_secs: 0,
                limit,
                remaining: limit as i64 - active as i64,
                reset_after_ms: earliest,
            },
        })
        .collect()
}

/// Explains a store's refusal: of the checks in `denied_mask` (bit i = check i),
/// the one with the longest wait names the reason and level, since a retry must
/// pass them all. Ties go to the outer level. A full concurrency limit suggests a
/// retry when its earliest lease lapses, capped at `concurrency_retry_cap_ms`
/// because Commit and Refund usually free slots sooner. With `headroom`, the
/// wait is until the limit has room for the cost above the share kept for
/// higher priorities.
pub fn denial(
    levels: &[LevelPlan],
    readings: &[Reading],
    denied_mask: u64,
    cost: Cost,
    headroom: f64,
    concurrency_retry_cap_ms: u64,
) -> Denial {
    let mut worst: Option<Denial> = None;
    for (i, c) in checked(levels, readings).enumerate() {
        if denied_mask & (1 << i) == 0 {
            continue;
        }
        let d = match c {
            Checked::Bucket(plan, b, level) => {
                bucket_denial(b, plan.group_of(b), level, cost, headroom)
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

/// The sentence part saying headroom bound, when it did: the bucket had room
/// for the cost but not for the cost and the share kept for higher priorities.
fn headroom_note(bound_by_headroom: bool, headroom: f64) -> String {
    match bound_by_headroom {
        true => format!(
            " (the last {:.0}% is kept for higher-priority requests)",
            headroom * 100.0
        ),
        false => String::new(),
    }
}

/// The denial of bucket `b` of `group`, at `level`, for a request of `cost`.
fn bucket_denial(
    b: &BucketSpec,
    group: Option<&str>,
    level: f64,
    cost: Cost,
    headroom: f64,
) -> Denial {
    let cost = b.cost(cost);
    let target = cost as f64 + b.floor(headroom);
    let wait_ms = b.until_level_us(level, target).div_ceil(1000).max(1);
    let reason = match b.dimension {
        Dimension::Requests => Reason::RequestsExceeded,
        _ => Reason::TokensExceeded,
    };
    let note = headroom_note(level >= cost as f64, headroom);
    Denial {
        reason,
        level: Some(b.level),
        dimension: Some(b.dimension),
        period_secs: b.period_secs,
        model_group: group.map(str::to_owned),
        retry_after_ms: wait_ms,
        detail: format!(
            "{} limit of {} per {} reached{note}: this request needs {cost}, {} \
             left; retry in {}",
            limit_name(b.level, group, b.dimension),
            b.limit,
            period_label(b.period_secs),
            level.floor() as i64,
            duration_label(wait_ms)
        ),
    }
}

/// A concurrency limit as read.
struct Slots {
    limit: u64,
    active: u64,
    earliest_expiry_ms: u64,
}

/// The denial of a full concurrency limit: retry when its earliest lease
/// lapses, at most `retry_cap_ms` from now.
fn concurrency_denial(plan: &LevelPlan, slots: Slots, headroom: f64, retry_cap_ms: u64) -> Denial {
    let wait_ms = match slots.earliest_expiry_ms {
        0 => retry_cap_ms,
        e => e.min(retry_cap_ms),
    };
    let group = plan.concurrency_group();
    let note = headroom_note(slots.active < slots.limit, headroom);
    Denial {
        reason: Reason::ConcurrencyExceeded,
        level: Some(plan.level),
        dimension: Some(Dimension::Concurrency),
        period_secs: 0,
        model_group: group.map(str::to_owned),
        retry_after_ms: wait_ms,
        detail: format!(
            "{} limit of {} reached{note} ({} in flight); retry in {} or once a request \
             in flight is committed or refunded",
            limit_name(plan.level, group, Dimension::Concurrency),
            slots.limit,
            slots.active,
            duration_label(wait_ms)
        ),
    }
}

/// A period as people write it: `60s` → `1m`, `86400s` → `1d`.
pub fn period_label(secs: u64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn duration_label(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
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
                },
                BucketSpec {
                    level: Level::User,
                    dimension: Dimension::Tokens,
                    limit: 6000,
                    period_secs: 60,
                    group: 0,
                },
            ],
            concurrency: Some(2),
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
        let cost = Cost {
            prompt: 400,
            output: 100,
        };
        let d = denial(&plan(), &readings, 0b111, cost, 0.0, 1000);
        assert_eq!(d.reason, Reason::TokensExceeded);
        assert_eq!(d.level, Some(Level::User));
        assert_eq!(d.retry_after_ms, 4000);
        let d = denial(&plan(), &readings, 0b001, cost, 0.0, 1000);
        assert_eq!(
            (d.reason, d.retry_after_ms),
            (Reason::RequestsExceeded, 1000)
        );
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
