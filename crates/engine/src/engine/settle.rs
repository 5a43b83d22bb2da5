//! Commit, Refund and RenewLease: settling a reservation by its id alone.
//! Each takes its request's fields parsed (in `api/`) and answers with a
//! struct: [`CommitOutcome`], [`RefundOutcome`], [`RenewOutcome`].

use super::shadow::ShadowSettle;
use super::{Engine, EngineError};
use crate::domain::DimMap;
use crate::domain::budget::Usage;
use crate::domain::plan::{self, LevelPlan};
use crate::domain::price::Billed;
use crate::domain::tier::MAX_COUNT;
use crate::domain::{Prompt, ReservationId};
use crate::store::{RenewReply, SettleReply, Settled, Settlement, Store};
use crate::telemetry;

/// What a settling call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Changed the reservation.
    Applied,
    /// Settled before; nothing changed.
    AlreadySettled,
    /// RenewLease on a lapsed lease.
    Expired,
}

/// The completion a Commit reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The upstream's own count.
    Tokens(u64),
    /// The text delivered, for the service to count (a stream without usage).
    Text(String),
}

/// A Commit, fields validated (in `api/`): the reservation, and the usage
/// the upstream reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitRequest {
    /// The reservation to settle.
    pub id: ReservationId,
    /// Prompt tokens used (at most 2^40).
    pub prompt_tokens: u64,
    /// The completion: the upstream's count, or the text to count.
    pub completion: Completion,
    /// Of `prompt_tokens`, those read from the provider's prompt cache (at
    /// most `prompt_tokens`).
    pub cached_prompt_tokens: u64,
    /// Of `prompt_tokens`, those written to the provider's cache for 5
    /// minutes (with the cached ones and the next, at most `prompt_tokens`).
    pub cache_write_prompt_tokens: u64,
    /// Of `prompt_tokens`, those written to the provider's cache for an hour.
    pub cache_write_1h_prompt_tokens: u64,
    /// Of the completion, its reasoning tokens.
    pub reasoning_tokens: u64,
    /// What the call used in each dimension the caller counts (images).
    pub declared: DimMap<u64>,
}

/// The answer to Commit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CommitOutcome {
    /// Applied or already settled.
    pub outcome: Outcome,
    /// Actual minus reserved tokens.
    pub token_delta: i64,
    /// The completion tokens charged: as sent, or counted from the text.
    pub completion_tokens: u64,
    /// Actual ÷ estimated prompt tokens when the service counted the prompt.
    pub estimation_ratio: f64,
    /// Actual minus estimated prompt tokens when the service counted it.
    pub estimation_error_tokens: i64,
    /// What the usage cost at the model group's price, µ$ (0 unless applied).
    pub cost_micros: u64,
}

/// The answer to Refund.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefundOutcome {
    /// Applied or already settled.
    pub outcome: Outcome,
    /// The tokens returned (by this call, or by the refund before it).
    pub refunded_tokens: u64,
    /// The spend returned, µ$ (0 unless applied).
    pub cost_micros: u64,
}

/// The answer to RenewLease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewOutcome {
    /// Applied, already settled, or expired.
    pub outcome: Outcome,
    /// Milliseconds until the renewed lease lapses (0 unless applied).
    pub expires_in_ms: u64,
}

impl<S: Store> Engine<S> {
    /// Every level a reservation touched, with the current limits of its tier
    /// (none, if the tier was removed since).
    fn settlement_levels(&self, id: &ReservationId) -> Vec<LevelPlan> {
        let limits = self.limits();
        let tier = self.limits().resolve(&id.tier, id.tenant.as_str());
        let scope = plan::Scope {
            tier: tier.as_deref(),
            group: limits.models.get(&id.group),
            has_user: id.user.is_some(),
            has_session: id.session.is_some(),
            now_us: self.budget.now_us(id.local),
        };
        let levels = plan::levels(&limits, scope, true);
        if !id.local {
            return levels;
        }
        // A reservation made in degraded mode lives in the local store, under
        // the limits it was made with.
        self.budget.local_levels(&levels)
    }

    /// Commit: `prompt_tokens` + the completion used, of which
    /// `cached_prompt_tokens` were read from the provider's prompt cache (left
    /// out of input-token limits where the model group says cached input does
    /// not count).
    #[expect(
        clippy::too_many_lines,
        reason = "the commit's count, store call and telemetry, in order"
    )]
    pub async fn commit(&self, req: CommitRequest) -> Result<CommitOutcome, EngineError> {
        let CommitRequest {
            id,
            prompt_tokens: prompt,
            completion,
            cached_prompt_tokens,
            cache_write_prompt_tokens,
            cache_write_1h_prompt_tokens,
            reasoning_tokens,
            declared,
        } = req;
        // A count of the delivered text comes with a prompt the gateway only
        // knew as reserved: nothing for the estimator to learn from.
        let (completion, learn) = match completion {
            Completion::Tokens(n) => (n, true),
            Completion::Text(text) => (self.count_completion(&id, text).await?, false),
        };
        let usage = Usage {
            learn,
            output_kept: self.output_kept(&id),
            ..self.usage(
                &id,
                Billed {
                    prompt,
                    cached: cached_prompt_tokens,
                    cache_write: cache_write_prompt_tokens,
                    cache_write_1h: cache_write_1h_prompt_tokens,
                    completion,
                    reasoning: reasoning_tokens,
                    declared,
                },
            )
        };
        let levels = self.settlement_levels(&id);
        let s = Settlement {
            id: &id,
            levels: &levels,
        };
        let reply = self.budget.commit(s, usage).await?;
        let delta = |settled| match settled {
            Settled::Committed(delta) => delta,
            _ => 0,
        };
        match reply {
            SettleReply::Applied {
                settled,
                estimated_prompt_tokens,
                reserved_output,
                ..
            } => {
                let token_delta = delta(settled);
                let (estimation_ratio, estimation_error_tokens) = match estimated_prompt_tokens > 0
                    && learn
                {
                    true => {
                        let ratio = prompt as f64 / estimated_prompt_tokens as f64;
                        // What was reserved: the usage less the delta, less the output.
                        let reserved = (usage.tokens as i64 - token_delta) - reserved_output as i64;
                        telemetry::estimation(&id.estimator, ratio, prompt as i64 > reserved);
                        (ratio, prompt as i64 - estimated_prompt_tokens as i64)
                    }
                    false => (0.0, 0),
                };
                telemetry::committed(&id.tier, prompt + completion, token_delta);
                telemetry::cost(id.tenant.as_str(), &id.group, usage.cost);
                let usage = Usage {
                    output_kept: 0,
                    ..usage
                };
                self.shadow_settle(&id, ShadowSettle::Commit(usage)).await;
                // Tokens may have come back: the first in each line tries again.
                self.queues.room();
                Ok(CommitOutcome {
                    outcome: Outcome::Applied,
                    token_delta,
                    completion_tokens: completion,
                    estimation_ratio,
                    estimation_error_tokens,
                    cost_micros: usage.cost,
                })
            }
            SettleReply::AlreadySettled(settled) => Ok(CommitOutcome {
                outcome: Outcome::AlreadySettled,
                token_delta: delta(settled),
                completion_tokens: completion,
                estimation_ratio: 0.0,
                estimation_error_tokens: 0,
                cost_micros: 0,
            }),
            SettleReply::NotFound => Err(not_found(&id)),
        }
    }

    /// Counts a completion's text with the tokenizer the reservation's prompt
    /// was counted with (its estimator key names the model or its family; a
    /// caller-counted prompt falls back to the default encoding), exactly as a
    /// prompt would be, stopping above the largest token count accepted.
    async fn count_completion(&self, id: &ReservationId, text: String) -> Result<u64, EngineError> {
        let counted = self
            .counter
            .count(&id.estimator, Prompt::Text(text), MAX_COUNT, false)
            .await;
        Ok(plan::check_tokens("completion_text", counted.count.tokens)?)
    }

    /// The usage as the reservation's buckets count it: cached prompt tokens
    /// leave the input count when the reservation's model group says so; the
    /// cost as the provider bills it.
    fn usage(&self, id: &ReservationId, used: Billed) -> Usage {
        let limits = self.limits();
        let (prompt, cached) = (used.prompt, used.cached);
        let uncounted = match limits.models.get(&id.group) {
            Some(g) if !g.cached_input_counts => cached,
            _ => 0,
        };
        let cost = limits.prices.get(&id.group).map_or(0, |p| p.actual(used));
        Usage {
            tokens: prompt + used.completion,
            prompt,
            input: prompt - uncounted,
            cached,
            cache_write: used.cache_write,
            cache_write_1h: used.cache_write_1h,
            reasoning: used.reasoning,
            cost,
            declared: used.declared,
            learn: true,
            output_kept: 0,
        }
    }

    /// Completions kept for the reservation's (estimator key, tier) when a
    /// level of its tier holds the learned output; else 0 (none kept).
    fn output_kept(&self, id: &ReservationId) -> usize {
        let learns = self
            .limits()
            .resolve(&id.tier, id.tenant.as_str())
            .is_some_and(|t| self.limits().learns_output(&t));
        match learns && !id.estimator.is_empty() && !id.local {
            true => self.multipliers.outputs().settings().window,
            false => 0,
        }
    }

    /// Refund.
    pub async fn refund(&self, id: &ReservationId) -> Result<RefundOutcome, EngineError> {
        let (reply, refunded_tokens) = self.refund_id(id).await?;
        self.queues.room();
        let (outcome, cost_micros) = match reply {
            SettleReply::Applied { reserved_spend, .. } => (Outcome::Applied, reserved_spend),
            SettleReply::AlreadySettled(_) => (Outcome::AlreadySettled, 0),
            SettleReply::NotFound => return Err(not_found(id)),
        };
        Ok(RefundOutcome {
            outcome,
            refunded_tokens,
            cost_micros,
        })
    }

    /// Refunds a parsed reservation id: the store's reply and the tokens
    /// returned. Refund, and the cancellation of reservations never returned
    /// to their caller, share it.
    pub(super) async fn refund_id(
        &self,
        id: &ReservationId,
    ) -> Result<(SettleReply, u64), crate::store::StoreError> {
        let levels = self.settlement_levels(id);
        let s = Settlement {
            id,
            levels: &levels,
        };
        let reply = self.budget.refund(s).await?;
        let refunded = match reply {
            SettleReply::Applied {
                settled: Settled::Refunded(n),
                ..
            }
            | SettleReply::AlreadySettled(Settled::Refunded(n)) => n,
            _ => 0,
        };
        if matches!(reply, SettleReply::Applied { .. }) {
            telemetry::refunded(&id.tier, refunded);
            self.shadow_settle(id, ShadowSettle::Refund).await;
        }
        Ok((reply, refunded))
    }

    /// RenewLease: for `lease_ttl_ms` more (absent or 0: the default).
    pub async fn renew(
        &self,
        id: &ReservationId,
        lease_ttl_ms: Option<u64>,
    ) -> Result<RenewOutcome, EngineError> {
        let ttl = self.settings.leases.ttl_ms("lease_ttl_ms", lease_ttl_ms)?;
        let levels = self.settlement_levels(id);
        let s = Settlement {
            id,
            levels: &levels,
        };
        let reply = self.budget.renew(s, ttl).await?;
        let (outcome, expires_in_ms) = match reply {
            RenewReply::Renewed { expires_in_ms } => {
                self.shadow_settle(id, ShadowSettle::Renew { ttl_ms: ttl })
                    .await;
                (Outcome::Applied, expires_in_ms)
            }
            RenewReply::AlreadySettled => (Outcome::AlreadySettled, 0),
            RenewReply::Expired => (Outcome::Expired, 0),
            RenewReply::NotFound => return Err(not_found(id)),
        };
        Ok(RenewOutcome {
            outcome,
            expires_in_ms,
        })
    }
}

/// The error for a reservation the store does not have (as the caller sent
/// it: a parsed id prints back as it was sent).
fn not_found(id: &ReservationId) -> EngineError {
    let shown: String = id.to_string().chars().take(80).collect();
    if id.local {
        return EngineError::NotFound(format!(
            "reservation {shown} was made in degraded mode (the shared store was unavailable) \
             and lives only in the memory of the replica that made it, which is not this one or \
             has restarted: settle it on that replica, or let its lease lapse (its budget \
             returns by itself); nothing to settle here"
        ));
    }
    EngineError::NotFound(format!(
        "reservation {shown} not found: it was never made, or its record expired (records are \
         kept for the lease plus the retention period); nothing to settle"
    ))
}
