//! The answer to CheckAndReserve, [`ReserveOutcome`], and the one place it is
//! built: [`outcome`], a pure function of the plan, the store's reply and the
//! prompt's count; before any store call, [`ReserveOutcome::blocked`] and
//! [`ReserveOutcome::refused`]. Also the decision counted and logged.

use super::EngineError;
use crate::domain::budget::{DeniedChecks, ReserveReply};
use crate::domain::decision::{self, LimitState, Reading};
use crate::domain::plan::ReservePlan;
use crate::domain::statuses::Statuses;
use crate::domain::{Denial, Dimension, InvalidInput, Level, PromptCount};
use crate::store::StoreError;
use crate::telemetry;

/// The answer to CheckAndReserve.
#[derive(Clone, Debug, PartialEq)]
pub struct ReserveOutcome {
    /// `None` when allowed; the refusal otherwise.
    pub denial: Option<Denial>,
    /// The reservation id when allowed.
    pub reservation_id: Option<String>,
    /// Prompt + output tokens reserved (or that would have been).
    pub reserved_tokens: u64,
    /// Output tokens asked for (the request's, or the tier's default).
    pub max_output_tokens: u64,
    /// Output tokens granted: `max_output_tokens`, or less with reduced output.
    pub granted_max_output_tokens: u64,
    /// Output tokens reserved: the most any level holds (the grant, or less
    /// where every level holds the learned output).
    pub reserved_output_tokens: u64,
    /// The service's raw prompt count (0 when the caller counted).
    pub estimated_prompt_tokens: u64,
    /// The correction applied to the count (1 for caller counts).
    pub estimator_multiplier: f64,
    /// Every limit that applied.
    pub limits: Vec<LimitState>,
    /// When allowed: milliseconds until the lease lapses.
    pub lease_expires_in_ms: u64,
    /// An idempotency key returned an earlier reservation.
    pub replayed: bool,
    /// What the quota in shadow would have denied, if anything.
    pub shadow_denial: Option<Denial>,
    /// Decided without the store (its failure policy applied).
    pub degraded: bool,
    /// The candidate reserved, as sent (`None` when none was).
    pub chosen_model: Option<String>,
    /// The candidates tried before it; all of them when none had room.
    pub skipped: Vec<Skipped>,
    /// Denied only by the global level (its own limits or a model group's
    /// there): room in the shared account can lift it, so the call may wait
    /// in line for it.
    pub waitable: bool,
    /// How long the call waited in line, in milliseconds (0: it did not).
    pub waited_ms: u64,
}

/// A candidate model that was not taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    /// The model, as sent.
    pub model: String,
    /// Why.
    pub denial: Denial,
}

impl ReserveOutcome {
    /// Refused before anything is counted or reserved: the scope is blocked.
    pub(super) fn blocked(denial: Denial) -> Self {
        ReserveOutcome {
            denial: Some(denial),
            reservation_id: None,
            reserved_tokens: 0,
            max_output_tokens: 0,
            granted_max_output_tokens: 0,
            reserved_output_tokens: 0,
            estimated_prompt_tokens: 0,
            estimator_multiplier: 1.0,
            limits: Vec::new(),
            lease_expires_in_ms: 0,
            replayed: false,
            shadow_denial: None,
            degraded: false,
            chosen_model: None,
            skipped: Vec::new(),
            waitable: false,
            waited_ms: 0,
        }
    }

    /// Refused before the store, the prompt counted as `count`: the request
    /// can never fit (`tokens` asked for, `max_output_tokens` of them output).
    /// `limits` as read for the caller's headers.
    pub(super) fn refused(
        denial: Denial,
        tokens: u64,
        max_output_tokens: u64,
        count: &PromptCount,
        limits: Vec<LimitState>,
    ) -> Self {
        ReserveOutcome {
            denial: Some(denial),
            reservation_id: None,
            reserved_tokens: tokens,
            max_output_tokens,
            granted_max_output_tokens: 0,
            reserved_output_tokens: 0,
            estimated_prompt_tokens: count.estimated,
            estimator_multiplier: count.multiplier,
            limits,
            lease_expires_in_ms: 0,
            replayed: false,
            shadow_denial: None,
            degraded: false,
            chosen_model: None,
            skipped: Vec::new(),
            waitable: false,
            waited_ms: 0,
        }
    }
}

/// How the store's reply came, besides the plan, the reply and the count.
#[derive(Clone, Debug)]
pub(super) struct Answered {
    /// Decided on this replica's memory, the store unavailable (its failure
    /// policy applied).
    pub degraded: bool,
    /// Longest retry_after suggested for a full concurrency limit.
    pub concurrency_retry_ms: u64,
    /// Added to a denial's retry_after: random, drawn by the caller.
    pub jitter_ms: u64,
    /// Which limits' statuses the answer carries.
    pub statuses: Statuses,
}

/// The answer to CheckAndReserve from the store's `reply` to `plan`, the
/// prompt counted as `count`. Pure, so it is tested without a store. A spent
/// or conflicting idempotency key is an error, not a decision; so is a stored
/// nonce that does not decode.
#[expect(
    clippy::too_many_lines,
    reason = "one match over the store's replies builds the whole outcome"
)]
pub(super) fn outcome(
    plan: &ReservePlan,
    reply: ReserveReply,
    count: &PromptCount,
    how: Answered,
) -> Result<ReserveOutcome, EngineError> {
    let retry = (how.concurrency_retry_ms, how.jitter_ms);
    // Nothing reserved: what every answer but an allowed or replayed one says.
    let none = ReserveOutcome {
        denial: None,
        reservation_id: None,
        reserved_tokens: plan.tokens(),
        max_output_tokens: plan.max_output_tokens,
        granted_max_output_tokens: 0,
        reserved_output_tokens: 0,
        estimated_prompt_tokens: count.estimated,
        estimator_multiplier: count.multiplier,
        limits: Vec::new(),
        lease_expires_in_ms: 0,
        replayed: false,
        shadow_denial: None,
        degraded: how.degraded,
        chosen_model: None,
        skipped: Vec::new(),
        waitable: false,
        waited_ms: 0,
    };
    Ok(match reply {
        ReserveReply::Allowed {
            readings,
            granted_output,
            reserved_output,
            ..
        } => ReserveOutcome {
            reservation_id: Some(plan.id.to_string()),
            reserved_tokens: plan.prompt_tokens + reserved_output,
            reserved_output_tokens: reserved_output,
            granted_max_output_tokens: granted_output,
            limits: statuses(how.statuses, plan, &readings, None),
            lease_expires_in_ms: plan.lease_ttl_ms,
            ..none
        },
        ReserveReply::Denied {
            readings,
            denied_mask,
            ..
        } => {
            let denial = denial(plan, &readings, denied_mask, retry);
            ReserveOutcome {
                limits: statuses(how.statuses, plan, &readings, Some(&denial)),
                waitable: decision::denied_only_globally(&plan.levels, &readings, denied_mask),
                denial: Some(denial),
                ..none
            }
        }
        ReserveReply::Replayed {
            nonce,
            tokens,
            lease_expires_in_ms,
            readings,
            ..
        } => {
            // The earlier reservation, under its nonce as stored.
            let id = plan
                .id
                .with_nonce_b64(&nonce)
                .ok_or_else(|| malformed(&nonce))?;
            ReserveOutcome {
                reservation_id: Some(id.to_string()),
                reserved_tokens: tokens,
                granted_max_output_tokens: tokens.saturating_sub(plan.prompt_tokens),
                // The record keeps the grant: a replay reports it as reserved.
                reserved_output_tokens: tokens.saturating_sub(plan.prompt_tokens),
                limits: statuses(how.statuses, plan, &readings, None),
                lease_expires_in_ms,
                replayed: true,
                ..none
            }
        }
        ReserveReply::IdempotencySpent { settled } => return Err(spent_key(settled)),
        ReserveReply::IdempotencyConflict => return Err(conflicting_key()),
    })
}

/// The statuses of `plan`'s limits the answer carries (`denial`: the
/// call's): none built when it carries none.
fn statuses(
    which: Statuses,
    plan: &ReservePlan,
    readings: &[Reading],
    denial: Option<&Denial>,
) -> Vec<LimitState> {
    match which.any() {
        true => which.pick(decision::limit_states(&plan.levels, readings), denial),
        false => Vec::new(),
    }
}

/// The denial of `plan` the store's checks (`denied_mask` over `readings`)
/// name, its retry_after capped for concurrency and jittered.
fn denial(
    plan: &ReservePlan,
    readings: &[Reading],
    denied_mask: DeniedChecks,
    (concurrency_retry_ms, jitter_ms): (u64, u64),
) -> Denial {
    let mut denial = decision::denial(
        &plan.levels,
        readings,
        denied_mask,
        plan.cost_with(plan.min_output_tokens),
        plan.headroom,
        concurrency_retry_ms,
    );
    denial.retry_after_ms += jitter_ms;
    denial
}

/// Up to `max_ms` of random jitter for a retry_after (0 for none).
pub(super) fn jitter(max_ms: u64) -> u64 {
    match max_ms {
        0 => 0,
        j => rand::random_range(0..=j),
    }
}

/// The error for a replayed reservation whose stored nonce does not decode.
fn malformed(nonce: &str) -> StoreError {
    StoreError::Protocol(format!("stored idempotency nonce {nonce:?} is malformed").into())
}

/// The error for an idempotency key another request of the tenant used.
fn conflicting_key() -> EngineError {
    InvalidInput::new(
        "idempotency_key",
        "was already used for a different request of this tenant; use a new key per logical \
         request",
    )
    .into()
}

/// The error for an idempotency key whose reservation is settled or lapsed.
fn spent_key(settled: bool) -> EngineError {
    let what = if settled {
        "was already committed or refunded"
    } else {
        "has a lease that already lapsed (commit or refund it)"
    };
    EngineError::FailedPrecondition(format!(
        "idempotency_key belongs to a reservation that {what}; a new request needs a new key"
    ))
}

/// Counts the decision, logs its sizes (prompt contents never reach a log),
/// and publishes the global leases held as the store reported them.
pub(super) fn record_decision(tier: &str, plan: &ReservePlan, out: &ReserveOutcome) {
    let fresh_tokens = if out.replayed || out.denial.is_some() {
        0
    } else {
        out.reserved_tokens
    };
    telemetry::decision(tier, out.denial.as_ref(), fresh_tokens);
    tracing::debug!(
        allowed = out.denial.is_none(),
        reason = out.denial.as_ref().map(|d| d.reason.as_str()),
        prompt_tokens = plan.prompt_tokens,
        reserved_tokens = out.reserved_tokens,
        degraded = out.degraded,
        replayed = out.replayed,
        "decision"
    );
    if !out.degraded
        && let Some(global) = out
            .limits
            .iter()
            .find(|l| l.level == Level::Global && l.dimension == Dimension::Concurrency)
    {
        telemetry::global_leases_active(global.limit as i64 - global.remaining);
    }
}

/// Logs a degraded decision at WARN at most every 10 seconds (an outage would
/// otherwise log every call), at DEBUG in between.
pub(super) fn warn_degraded(policy: &'static str, why: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_WARNED_S: AtomicU64 = AtomicU64::new(0);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_WARNED_S.load(Ordering::Relaxed);
    if now_s >= last + 10
        && LAST_WARNED_S
            .compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            policy,
            error = why,
            "deciding without the store (logged every 10 s while it lasts; \
             ctxbudget_degraded_decisions_total counts every one)"
        );
    } else {
        tracing::debug!(policy, error = why, "deciding without the store");
    }
}

#[cfg(test)]
mod tests;
