//! Denials: why a request was refused ([`Reason`], [`Denial`]), the wording
//! and wait of each kind of refusal as a [`Denial`]
//! (context or request too large, a bucket or a concurrency limit that has
//! no room), the sentence it carries, and when a retry could succeed.

use super::block::BlockedScope;
use super::bucket::BucketSpec;
pub use super::level::period_label;
use super::level::{Dimension, Level};
use super::level_plan::LevelPlan;
use super::model::ModelGroup;
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
    /// A spend limit lacks room for the request's worst-case cost.
    BudgetExceeded,
    /// An operator blocked the tenant or the user.
    Blocked,
    /// An image limit lacks room for the images the call may generate.
    ImagesExceeded,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 8] = [
        Reason::RequestsExceeded,
        Reason::TokensExceeded,
        Reason::ConcurrencyExceeded,
        Reason::ContextTooLarge,
        Reason::RequestTooLarge,
        Reason::BudgetExceeded,
        Reason::Blocked,
        Reason::ImagesExceeded,
    ];

    /// Lower-case name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RequestsExceeded => "rpm_exceeded",
            Reason::TokensExceeded => "tpm_exceeded",
            Reason::ConcurrencyExceeded => "concurrency_exceeded",
            Reason::ContextTooLarge => "context_too_large",
            Reason::RequestTooLarge => "request_too_large",
            Reason::BudgetExceeded => "budget_exceeded",
            Reason::Blocked => "blocked",
            Reason::ImagesExceeded => "images_exceeded",
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
    /// A request of a blocked scope: no level's limit, no retry (waiting
    /// cannot help), the operator's reason in the detail.
    pub fn blocked(r: &BlockedScope<'_>) -> Self {
        Denial {
            reason: Reason::Blocked,
            level: Some(r.level),
            dimension: None,
            period_secs: 0,
            model_group: None,
            retry_after_ms: 0,
            detail: format!(
                "{} is blocked by the operator: {}; retrying cannot help until the operator \
                 lifts the block",
                r.who, r.reason
            ),
        }
    }

    /// Prompt + output exceed the max context — the tier's, or the model
    /// group's context window when that is smaller: the request must shrink.
    /// `prompt` is the count and, when counting stopped early, the bound it
    /// passed (see [`crate::prompt::PromptCount::more_than`]):
    /// the detail then says "more than" the bound rather than quote the count.
    pub fn context_too_large(
        prompt: (u64, Option<u64>),
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
            detail: match prompt {
                (_, Some(more_than)) => format!(
                    "the prompt alone has more than {more_than} tokens (counting stopped \
                     there), over the {bound} of {limit} tokens; shorten the prompt"
                ),
                (prompt, None) => format!(
                    "prompt {prompt} + output {output} tokens exceed the {bound} of {limit} \
                     tokens; shorten the prompt or lower max_output_tokens"
                ),
            },
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
            detail: match bucket.level {
                // The upstream account's size is not the caller's business.
                Level::Global => format!(
                    "this request needs more {} than the {} can ever hold{kept}; retrying \
                     cannot help: shorten the prompt or lower max_output_tokens",
                    bucket.dimension.unit(),
                    limit_name(bucket.level, group, bucket.dimension),
                ),
                _ => format!(
                    "this request needs {cost} {} but the {} limit is {} per {}{kept}; \
                     retrying cannot help: shorten the prompt or lower max_output_tokens",
                    bucket.dimension.unit(),
                    limit_name(bucket.level, group, bucket.dimension),
                    bucket.limit,
                    bucket.period_label()
                ),
            },
        }
    }
}

/// "tenant gpt-4o output-token", for sentences ("… limit"); at the global
/// level "upstream account's gpt-4o output-token budget", named without its
/// size.
fn limit_name(level: Level, group: Option<&str>, dimension: Dimension) -> String {
    let what = dimension.limit_noun();
    match (level, group) {
        (Level::Global, Some(g)) => format!("upstream account's {g} {what} budget"),
        (Level::Global, None) => format!("upstream account's {what} budget"),
        (_, Some(g)) => format!("{level} {g} {what}"),
        (_, None) => format!("{level} {what}"),
    }
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
pub(super) fn bucket_denial(
    b: &BucketSpec,
    group: Option<&str>,
    level: f64,
    cost: u64,
    headroom: f64,
) -> Denial {
    let target = cost as f64 + b.floor(headroom);
    let wait_ms = b.wait_ms(level, target).max(1);
    let reason = match b.dimension {
        Dimension::Requests => Reason::RequestsExceeded,
        Dimension::Spend => Reason::BudgetExceeded,
        Dimension::Images => Reason::ImagesExceeded,
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
        detail: match b.level {
            // The upstream account's size is not the caller's business.
            Level::Global => format!(
                "the {} is used up for now{note}; retry in {}",
                limit_name(b.level, group, b.dimension),
                duration_label(wait_ms)
            ),
            _ => format!(
                "{} limit of {} per {} reached{note}: this request needs {cost}, {} \
                 left; retry in {}",
                limit_name(b.level, group, b.dimension),
                b.limit,
                b.period_label(),
                level.floor() as i64,
                duration_label(wait_ms)
            ),
        },
    }
}

/// A concurrency limit as read.
pub(super) struct Slots {
    pub(super) limit: u64,
    pub(super) active: u64,
    pub(super) earliest_expiry_ms: u64,
}

/// The denial of a full concurrency limit: retry when its earliest lease
/// lapses, at most `retry_cap_ms` from now.
pub(super) fn concurrency_denial(
    plan: &LevelPlan,
    slots: Slots,
    headroom: f64,
    retry_cap_ms: u64,
) -> Denial {
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
        detail: match plan.level {
            // The upstream account's size is not the caller's business.
            Level::Global => format!(
                "the {} is reached{note}; retry in {} or once a request in flight is \
                 committed or refunded",
                limit_name(plan.level, group, Dimension::Concurrency),
                duration_label(wait_ms)
            ),
            _ => format!(
                "{} limit of {} reached{note} ({} in flight); retry in {} or once a \
                 request in flight is committed or refunded",
                limit_name(plan.level, group, Dimension::Concurrency),
                slots.limit,
                slots.active,
                duration_label(wait_ms)
            ),
        },
    }
}

fn duration_label(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}
