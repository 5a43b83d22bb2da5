//! Decisions: what a store's readings mean for the caller. A denial is a value
//! with a reason, the level that denied, when to retry and a sentence for people;
//! never an error.

use super::bucket::{BucketSpec, from_milli};
use super::level::{Dimension, Level};
use super::level_plan::LevelPlan;
use super::tier::Tier;

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
    /// Milliseconds until a retry could succeed, before jitter; 0 when retrying
    /// cannot help.
    pub retry_after_ms: u64,
    /// What happened and what to do, in one sentence.
    pub detail: String,
}

impl Denial {
    /// Prompt + output exceed the tier's max context: the request must shrink.
    pub fn context_too_large(prompt: u64, output: u64, tier: &Tier) -> Self {
        Denial {
            reason: Reason::ContextTooLarge,
            level: None,
            dimension: Some(Dimension::Tokens),
            period_secs: 0,
            retry_after_ms: 0,
            detail: format!(
                "prompt {prompt} + output {output} tokens exceed the {} tier's max context of {} \
                 tokens; shorten the prompt or lower max_output_tokens",
                tier.name, tier.max_context_tokens
            ),
        }
    }

    /// The request needs more than `bucket` can ever hold.
    pub fn request_too_large(bucket: &BucketSpec, tokens: u64) -> Self {
        Denial {
            reason: Reason::RequestTooLarge,
            level: Some(bucket.level),
            dimension: Some(bucket.dimension),
            period_secs: bucket.period_secs,
            retry_after_ms: 0,
            detail: format!(
                "this request needs {tokens} tokens but the {} limit is {} tokens per {}; \
                 retrying cannot help: shorten the prompt or lower max_output_tokens",
                bucket.level,
                bucket.limit,
                period_label(bucket.period_secs)
            ),
        }
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitState {
    /// The level.
    pub level: Level,
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

/// One check of a plan paired with its reading.
enum Checked<'a> {
    Bucket(&'a BucketSpec, f64),
    Concurrency(Level, u64, u64, u64),
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
                out.push(Checked::Bucket(bucket, from_milli(*milli)));
            }
        }
        if let Some(limit) = plan.concurrency
            && let Some(Reading::Concurrency {
                active,
                earliest_expiry_ms,
            }) = readings.next()
        {
            out.push(Checked::Concurrency(
                plan.level,
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
            Checked::Bucket(b, level) => LimitState {
                level: b.level,
                dimension: b.dimension,
                period_secs: b.period_secs,
                limit: b.limit,
                remaining: level.floor() as i64,
                reset_after_ms: b.until_full_us(level).div_ceil(1000),
            },
            Checked::Concurrency(level, limit, active, earliest) => LimitState {
                level,
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
/// because Commit and Refund usually free slots sooner.
pub fn denial(
    levels: &[LevelPlan],
    readings: &[Reading],
    denied_mask: u64,
    tokens: u64,
    concurrency_retry_cap_ms: u64,
) -> Denial {
    let mut worst: Option<Denial> = None;
    for (i, c) in checked(levels, readings).enumerate() {
        if denied_mask & (1 << i) == 0 {
            continue;
        }
        let d = match c {
            Checked::Bucket(b, level) => bucket_denial(b, level, tokens),
            Checked::Concurrency(level, limit, active, earliest) => {
                concurrency_denial(level, limit, active, earliest, concurrency_retry_cap_ms)
            }
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
        retry_after_ms: concurrency_retry_cap_ms,
        detail: "the store refused the reservation without naming a limit; retry shortly".into(),
    })
}

/// The denial of bucket `b`, at `level`, for a request of `tokens`.
fn bucket_denial(b: &BucketSpec, level: f64, tokens: u64) -> Denial {
    let cost = b.cost(tokens);
    let wait_ms = b.until_level_us(level, cost as f64).div_ceil(1000).max(1);
    let (reason, what) = match b.dimension {
        Dimension::Requests => (Reason::RequestsExceeded, "request"),
        _ => (Reason::TokensExceeded, "token"),
    };
    Denial {
        reason,
        level: Some(b.level),
        dimension: Some(b.dimension),
        period_secs: b.period_secs,
        retry_after_ms: wait_ms,
        detail: format!(
            "{} {what} limit of {} per {} reached: this request needs {cost}, {} \
             left; retry in {}",
            b.level,
            b.limit,
            period_label(b.period_secs),
            level.floor() as i64,
            duration_label(wait_ms)
        ),
    }
}

/// The denial of a full concurrency limit: retry when its earliest lease
/// lapses, at most `retry_cap_ms` from now.
fn concurrency_denial(
    level: Level,
    limit: u64,
    active: u64,
    earliest_expiry_ms: u64,
    retry_cap_ms: u64,
) -> Denial {
    let wait_ms = match earliest_expiry_ms {
        0 => retry_cap_ms,
        e => e.min(retry_cap_ms),
    };
    Denial {
        reason: Reason::ConcurrencyExceeded,
        level: Some(level),
        dimension: Some(Dimension::Concurrency),
        period_secs: 0,
        retry_after_ms: wait_ms,
        detail: format!(
            "{level} concurrency limit of {limit} reached ({active} in flight); retry \
             in {} or once a request in flight is committed or refunded",
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
                },
                BucketSpec {
                    level: Level::User,
                    dimension: Dimension::Tokens,
                    limit: 6000,
                    period_secs: 60,
                },
            ],
            concurrency: Some(2),
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
        let d = denial(&plan(), &readings, 0b111, 500, 1000);
        assert_eq!(d.reason, Reason::TokensExceeded);
        assert_eq!(d.level, Some(Level::User));
        assert_eq!(d.retry_after_ms, 4000);
        let d = denial(&plan(), &readings, 0b001, 500, 1000);
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
