//! CheckAndReserve: one pipeline, read top to bottom in [`Engine::reserve`].
//! A request names a model and, optionally, fallback candidates to try in
//! order; one model is a one-element list, decided by the same steps:
//!
//! 1. admit: the tier resolved, a block (which holds for every model) checked;
//! 2. count the prompt once per way of counting it, and plan every candidate
//!    ([`super::prepare`]);
//! 3. reserve the first plan with room in one store call, through the
//!    resilience layers ([`super::resilient`]: breaker, degraded decisions,
//!    cancel on drop);
//! 4. check the quota in shadow for the plan answered, when the store is
//!    healthy;
//! 5. explain each reply ([`super::reply`]) and answer: the first allowed
//!    candidate, the others skipped; when none had room, the first
//!    candidate's denial with the earliest retry among all.
//!
//! A denied candidate holds nothing (a reservation is all or nothing), so
//! trying the next one leaves no trace but its denial.

use super::prepare::{Counts, Refusal};
use super::reply::{self, Answered, ReserveOutcome, Skipped, record_decision};
use super::resilient::{PerCandidate, Reserved};
use super::{Engine, EngineError};
use crate::domain::plan::{ReservePlan, ReserveRequest};
use crate::domain::statuses::Statuses;
use crate::domain::{InvalidInput, Level, Limits, Tier};
use crate::store::{ReserveReply, Store};
use crate::telemetry;
use std::sync::Arc;

/// The most candidate models one request may name.
pub const MAX_CANDIDATES: usize = 8;

/// One candidate on its way through the pipeline.
struct Candidate {
    /// Which of the prompt's counts it is planned with.
    count: usize,
    /// Its plan's place among the plans sent, or why no store could admit it.
    planned: Result<usize, Refusal>,
}

/// Every candidate planned, before the store is asked.
struct Planned {
    /// The plans to send, in order.
    plans: PerCandidate<ReservePlan>,
    /// The candidates planned, in order (up to the first that could not be).
    candidates: PerCandidate<Candidate>,
    /// The error of planning the candidate after them, if one failed: it
    /// answers the call if every candidate before it is denied.
    unplanned: Option<EngineError>,
}

/// The candidates answered, in order, until one was allowed.
struct Tried {
    /// `(candidate, outcome)`.
    outcomes: PerCandidate<(usize, ReserveOutcome)>,
    /// The plan whose answer the caller gets: the reservation made, else
    /// the first candidate's (its denial answers when none had room).
    answered: Option<usize>,
    /// The store made a reservation.
    served: bool,
}

impl<S: Store> Engine<S> {
    /// CheckAndReserve: the request's model, then its fallbacks in order,
    /// reserved on the first with room.
    pub async fn reserve(&self, mut req: ReserveRequest) -> Result<ReserveOutcome, EngineError> {
        if req.fallbacks.len() >= MAX_CANDIDATES {
            let named = req.fallbacks.len() + 1;
            return Err(InvalidInput::new(
                "candidate_models",
                format!("{named} models; at most {MAX_CANDIDATES}"),
            )
            .into());
        }
        let limits = self.limits();
        let tier = match self.admit(&limits, &req)? {
            Ok(tier) => tier,
            Err(blocked) => return Ok(blocked),
        };
        let counts = self.count_candidates(&mut req, &tier).await;
        let planned = self.plan_candidates(&req, &limits, &tier, &counts).await;
        let several = planned.plans.len() > 1;
        if let [plan] = planned.plans.as_slice() {
            // Every later line of this call names the reservation.
            tracing::Span::current().record("reservation", tracing::field::display(&plan.id));
        }
        let mut reserved = self.budget.reserve(planned.plans).await?;
        let terms = (&*limits, &*tier);
        let tried = self
            .answer_in_order(&req, terms, &counts, planned.candidates, &mut reserved)
            .await?;
        if let Some(error) = planned.unplanned
            && tried.outcomes.iter().all(|(_, out)| out.denial.is_some())
        {
            return Err(error);
        }
        let mut out = first_allowed(tried.outcomes, &mut req).ok_or_else(|| {
            crate::store::StoreError::Protocol(
                "the store answered none of the candidates' plans".into(),
            )
        })?;
        if several
            && !out.replayed
            && let Some(id) = &out.reservation_id
        {
            tracing::Span::current().record("reservation", id.as_str());
        }
        if !reserved.degraded
            && let Some(plan) = tried.answered.map(|at| &reserved.plans[at])
        {
            out.shadow_denial = self.shadow_verdict(plan, &tier, tried.served).await;
        }
        reserved.answered();
        Ok(out)
    }

    /// Plans every candidate of `req`, each with its count. Candidates after
    /// one that cannot be planned are not planned, nor sent.
    async fn plan_candidates(
        &self,
        req: &ReserveRequest,
        limits: &Arc<Limits>,
        tier: &Arc<Tier>,
        counts: &Counts,
    ) -> Planned {
        let mut planned = Planned {
            plans: PerCandidate::new(),
            candidates: PerCandidate::new(),
            unplanned: None,
        };
        for (model, &count) in req.candidates().zip(&counts.of) {
            let plan = match self
                .plan(req, model, limits, tier, &counts.counts[count])
                .await
            {
                Ok(Ok(plan)) => {
                    planned.plans.push(plan);
                    Ok(planned.plans.len() - 1)
                }
                Ok(Err(refusal)) => Err(refusal),
                Err(e) => {
                    planned.unplanned = Some(e);
                    break;
                }
            };
            planned.candidates.push(Candidate {
                count,
                planned: plan,
            });
        }
        planned
    }

    /// Each candidate answered in order until one is allowed: a plan from
    /// the store's reply to it, a refusal as it stands.
    async fn answer_in_order(
        &self,
        req: &ReserveRequest,
        (limits, tier): (&Limits, &Tier),
        counts: &Counts,
        candidates: PerCandidate<Candidate>,
        reserved: &mut Reserved<'_>,
    ) -> Result<Tried, EngineError> {
        let mut replies = std::mem::take(&mut reserved.replies).into_iter();
        let mut tried = Tried {
            outcomes: PerCandidate::new(),
            answered: None,
            served: false,
        };
        for (i, c) in candidates.into_iter().enumerate() {
            let count = &counts.counts[c.count];
            let out = match c.planned {
                Err(refusal) => {
                    let model = req.candidates().nth(i).unwrap_or_default();
                    self.refused(req, model, (limits, tier), count, refusal)
                        .await
                }
                Ok(at) => {
                    let Some(reply) = replies.next() else { break };
                    tried.served = matches!(reply, ReserveReply::Allowed { .. });
                    let plan = &reserved.plans[at];
                    let how = (reserved.degraded, req.statuses);
                    let out = self.explain(plan, reply, &tier.name, count, how)?;
                    if i == 0 || out.denial.is_none() {
                        tried.answered = Some(at);
                    }
                    out
                }
            };
            let allowed = out.denial.is_none();
            tried.outcomes.push((i, out));
            if allowed {
                break;
            }
        }
        Ok(tried)
    }

    /// The answer to a plan the store replied to: counted, recorded, with the
    /// limits and retry the caller needs.
    fn explain(
        &self,
        plan: &ReservePlan,
        reply: ReserveReply,
        tier: &str,
        count: &crate::domain::PromptCount,
        (degraded, statuses): (bool, Statuses),
    ) -> Result<ReserveOutcome, EngineError> {
        if !degraded {
            let reclaimed = reply.reclaimed();
            for level in Level::ALL {
                telemetry::leases_expired(level.as_str(), reclaimed.at(level));
            }
        }
        let denied = matches!(reply, ReserveReply::Denied { .. });
        let how = Answered {
            degraded,
            concurrency_retry_ms: self.settings.concurrency_retry_ms,
            jitter_ms: if denied {
                reply::jitter(self.settings.retry_jitter_ms)
            } else {
                0
            },
            statuses,
        };
        let out = reply::outcome(plan, reply, count, how)?;
        if let (true, Some(id)) = (out.replayed, &out.reservation_id) {
            // The earlier reservation, not the plan's id, is the one answered.
            tracing::Span::current().record("reservation", id.as_str());
        }
        record_decision(tier, plan, &out);
        Ok(out)
    }
}

/// The answer from the candidates tried (`(candidate, outcome)` in order):
/// the last, if allowed, with the others skipped; else the first candidate's
/// denial with the earliest retry among all. The models named move out of
/// `req`. `None` when none was tried.
fn first_allowed(
    outcomes: PerCandidate<(usize, ReserveOutcome)>,
    req: &mut ReserveRequest,
) -> Option<ReserveOutcome> {
    let mut model = |i: usize| match i {
        0 => std::mem::take(&mut req.model),
        i => std::mem::take(&mut req.fallbacks[i - 1]),
    };
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut first: Option<ReserveOutcome> = None;
    for (i, mut out) in outcomes {
        let Some(denial) = out.denial.clone() else {
            out.chosen_model = Some(model(i));
            out.skipped = skipped;
            return Some(out);
        };
        skipped.push(Skipped {
            model: model(i),
            denial,
        });
        first.get_or_insert(out);
    }
    let mut outcome = first?;
    if let Some(d) = &mut outcome.denial {
        // The earliest retry among all: the first that may pass.
        if let Some(soonest) = skipped
            .iter()
            .map(|s| s.denial.retry_after_ms)
            .filter(|ms| *ms > 0)
            .min()
        {
            d.retry_after_ms = soonest;
        }
    }
    outcome.skipped = skipped;
    Some(outcome)
}
