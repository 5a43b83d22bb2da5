//! The store's reply to a reservation, explained: the outcome the caller
//! gets (limits, the denial and when to retry, the reservation replayed), and
//! the decision counted and logged.

use super::reserve::ReserveOutcome;
use super::{Engine, EngineError};
use crate::domain::decision;
use crate::domain::plan::ReservePlan;
use crate::domain::{Dimension, InvalidInput, Level};
use crate::store::{ReserveReply, Store, StoreError};
use crate::telemetry;

impl<S: Store> Engine<S> {
    /// Fills `out` from the store's reply to `plan`. A spent or conflicting
    /// idempotency key is an error, not a decision.
    pub(super) fn explain(
        &self,
        out: &mut ReserveOutcome,
        plan: &ReservePlan,
        reply: ReserveReply,
    ) -> Result<(), EngineError> {
        match reply {
            ReserveReply::Allowed {
                readings,
                granted_output,
                ..
            } => {
                out.limits = decision::limit_states(&plan.levels, &readings);
                out.reservation_id = Some(plan.id.to_string());
                out.granted_max_output_tokens = granted_output;
                out.reserved_tokens = plan.prompt_tokens + granted_output;
                out.lease_expires_in_ms = plan.lease_ttl_ms;
            }
            ReserveReply::Denied {
                readings,
                denied_mask,
                ..
            } => {
                let cost = plan.cost_with(plan.min_output_tokens);
                let mut denial = decision::denial(
                    &plan.levels,
                    &readings,
                    denied_mask,
                    cost,
                    plan.headroom,
                    self.settings.concurrency_retry_ms,
                );
                denial.retry_after_ms += self.jitter();
                out.limits = decision::limit_states(&plan.levels, &readings);
                out.denial = Some(denial);
                out.granted_max_output_tokens = 0;
            }
            ReserveReply::Replayed {
                nonce,
                tokens,
                lease_expires_in_ms,
                readings,
                ..
            } => {
                out.limits = decision::limit_states(&plan.levels, &readings);
                replayed(out, plan, &nonce, tokens, lease_expires_in_ms)?;
            }
            ReserveReply::IdempotencySpent { settled } => return Err(spent_key(settled)),
            ReserveReply::IdempotencyConflict => {
                return Err(InvalidInput::new(
                    "idempotency_key",
                    "was already used for a different request of this tenant; use a new key per \
                     logical request",
                )
                .into());
            }
        }
        Ok(())
    }

    pub(super) fn jitter(&self) -> u64 {
        match self.settings.retry_jitter_ms {
            0 => 0,
            j => rand::random_range(0..=j),
        }
    }
}

/// Fills `out` for an idempotency key that returned an earlier reservation
/// (its nonce as stored).
fn replayed(
    out: &mut ReserveOutcome,
    plan: &ReservePlan,
    nonce: &str,
    tokens: u64,
    lease_expires_in_ms: u64,
) -> Result<(), StoreError> {
    let id = plan.id.with_nonce_b64(nonce).ok_or_else(|| {
        StoreError::Protocol(format!("stored idempotency nonce {nonce:?} is malformed").into())
    })?;
    out.reservation_id = Some(id.to_string());
    tracing::Span::current().record("reservation", tracing::field::display(&id));
    out.reserved_tokens = tokens;
    out.granted_max_output_tokens = tokens.saturating_sub(plan.prompt_tokens);
    out.lease_expires_in_ms = lease_expires_in_ms;
    out.replayed = true;
    Ok(())
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
