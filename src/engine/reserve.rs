//! CheckAndReserve: count the prompt (when the caller did not), correct the
//! count with the adaptive multiplier, plan, reserve, and explain the result.

use super::BreakerState;
use super::FailurePolicy;
use super::cancel::CancelGuard;
use super::reply::{self, Answered, ReserveOutcome, record_decision, warn_degraded};
use super::shadow::{ShadowCheck, ShadowSettle};
use super::{Engine, EngineError};
use crate::domain::decision::{self, LimitState};
use crate::domain::plan::{self, Prepared, ReservePlan, ReserveRequest, Terms};
use crate::domain::{Level, Limits, Prompt, PromptCount, PromptInput, Tier, UserId};
use crate::estimator::Correction;
use crate::store::{ReserveReply, Scope, Store, StoreError};
use crate::telemetry;
use std::sync::Arc;

/// Why a request was refused before the store: it can never fit.
#[derive(Clone, Debug)]
pub(super) struct Refusal {
    /// Context or request too large.
    denial: crate::domain::Denial,
    /// Prompt + output tokens the request asked for.
    tokens: u64,
    /// The output part of `tokens`.
    max_output_tokens: u64,
}

impl<S: Store> Engine<S> {
    /// CheckAndReserve: resolve the tier, count, plan, and reserve.
    pub async fn reserve(&self, mut req: ReserveRequest) -> Result<ReserveOutcome, EngineError> {
        let limits = self.limits();
        let tier = match self.admit(&limits, &req)? {
            Ok(tier) => tier,
            Err(blocked) => return Ok(blocked),
        };
        let count = self.count(&mut req, &tier).await;
        self.reserve_counted(&req, &limits, &tier, &count).await
    }

    /// The request's tier, or the answer for a blocked tenant or user.
    pub(super) fn admit(
        &self,
        limits: &Limits,
        req: &ReserveRequest,
    ) -> Result<Result<Arc<Tier>, ReserveOutcome>, EngineError> {
        let tier = self.resolve_tier(limits, &req.tier, req.tenant.as_str())?;
        let user = req.user.as_ref().map(UserId::as_str);
        if let Some(denial) = super::blocked(limits, req.tenant.as_str(), user) {
            telemetry::decision(&tier.name, Some(&denial), 0);
            return Ok(Err(ReserveOutcome::blocked(denial)));
        }
        Ok(Ok(tier))
    }

    /// How a model's prompt is counted and corrected: two models alike in
    /// both (one tokenizer, exact or fast; one estimator key) count a prompt
    /// alike.
    pub(super) fn counted_as(&self, model: &str) -> (crate::estimator::Method, String) {
        let rules = self.counter.rules();
        (rules.method(model), rules.estimator_key(model).to_string())
    }

    /// CheckAndReserve once the prompt is counted (`req`'s prompt no longer
    /// needed): plan and reserve.
    pub(super) async fn reserve_counted(
        &self,
        req: &ReserveRequest,
        limits: &Arc<Limits>,
        tier: &Arc<Tier>,
        count: &PromptCount,
    ) -> Result<ReserveOutcome, EngineError> {
        match self.plan(req, limits, tier, count).await? {
            Ok(plan) => {
                // Every later line of this call names the reservation.
                tracing::Span::current().record("reservation", tracing::field::display(&plan.id));
                self.reserve_plan(plan, tier, count).await
            }
            Err(refusal) => Ok(self.refused(req, limits, tier, count, refusal).await),
        }
    }

    /// The answer to a request no store could admit (counted), with the
    /// limits of its scope as they stand.
    pub(super) async fn refused(
        &self,
        req: &ReserveRequest,
        limits: &Limits,
        tier: &Tier,
        count: &PromptCount,
        refusal: Refusal,
    ) -> ReserveOutcome {
        telemetry::decision(&tier.name, Some(&refusal.denial), 0);
        let now = self.limits_now(req, limits, tier).await;
        ReserveOutcome::refused(
            refusal.denial,
            refusal.tokens,
            refusal.max_output_tokens,
            count,
            now,
        )
    }

    /// The plan of `req`, its prompt counted as `count` (its learned output
    /// read, its price checked), or why no store could admit it.
    pub(super) async fn plan(
        &self,
        req: &ReserveRequest,
        limits: &Arc<Limits>,
        tier: &Arc<Tier>,
        count: &PromptCount,
    ) -> Result<Result<ReservePlan, Refusal>, EngineError> {
        let terms = Terms {
            limits,
            tier,
            leases: self.settings.leases,
            priorities: self.settings.priorities,
            now_us: self.store.now_us(),
        };
        let mut plan = match plan::prepare(req, count, &terms)? {
            Prepared::Plan(plan) => plan,
            Prepared::Refused {
                denial,
                tokens,
                max_output_tokens,
            } => {
                return Ok(Err(Refusal {
                    denial,
                    tokens,
                    max_output_tokens,
                }));
            }
        };
        self.check_price(&plan, &req.model, limits)?;
        if plan.levels.iter().any(|l| l.overrun.is_some()) {
            plan.learned_output = self.learned_output(&plan.id.estimator, &tier.name).await;
        }
        Ok(Ok(plan))
    }

    /// The store's part of CheckAndReserve: check the quota in shadow,
    /// reserve (or, degraded, reserve locally), and explain the reply.
    pub(super) async fn reserve_plan(
        &self,
        plan: ReservePlan,
        tier: &Tier,
        count: &PromptCount,
    ) -> Result<ReserveOutcome, EngineError> {
        let shadow = self.shadow_if_healthy(&plan, tier).await;
        let life =
            std::time::Duration::from_millis(plan.lease_ttl_ms + self.settings.retention.record_ms);
        // Until the caller has its answer, a reservation the store may have
        // made is cancelled if this call is dropped (a client deadline, a
        // reset stream); with an idempotency key, the caller's retry returns it.
        let mut guard = self
            .cancels
            .guard(&plan.id, life, plan.idempotency_key.is_none());
        let reply = self.guarded("reserve", self.store.reserve(&plan)).await;
        self.cancel_if_unanswered(&reply, &plan, life, &mut guard);
        let (plan, reply, degraded) = self.or_degraded(plan, reply).await;
        let mut shadow_denial = None;
        if let Some(shadow) = shadow {
            let served = matches!(reply, Ok(ReserveReply::Allowed { .. }));
            if shadow.taken && !served {
                self.shadow_settle(&plan.id, ShadowSettle::Refund).await;
            }
            shadow_denial = shadow.denial;
        }
        let out = self.explain(&plan, reply?, tier, count, degraded, shadow_denial)?;
        guard.disarm();
        Ok(out)
    }

    /// The answer to a plan the store replied to: counted, recorded, with the
    /// limits and retry the caller needs.
    pub(super) fn explain(
        &self,
        plan: &ReservePlan,
        reply: ReserveReply,
        tier: &Tier,
        count: &PromptCount,
        degraded: bool,
        shadow_denial: Option<crate::domain::Denial>,
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
            shadow_denial,
            concurrency_retry_ms: self.settings.concurrency_retry_ms,
            jitter_ms: if denied {
                reply::jitter(self.settings.retry_jitter_ms)
            } else {
                0
            },
        };
        let out = reply::outcome(plan, reply, count, how)?;
        if let (true, Some(id)) = (out.replayed, &out.reservation_id) {
            // The earlier reservation, not the plan's id, is the one answered.
            tracing::Span::current().record("reservation", id.as_str());
        }
        record_decision(&tier.name, plan, &out);
        Ok(out)
    }

    /// A plan with a spend limit for a model without a price: refused under
    /// `[money] require_price`, else its spend is 0, said once per model.
    fn check_price(
        &self,
        plan: &ReservePlan,
        model: &str,
        limits: &Limits,
    ) -> Result<(), EngineError> {
        let spends = plan
            .levels
            .iter()
            .flat_map(|l| &l.buckets)
            .any(|b| b.dimension == crate::domain::Dimension::Spend);
        let priced = plan
            .model_group
            .as_ref()
            .is_some_and(|g| limits.prices.contains_key(&g.name));
        if !spends || priced {
            return Ok(());
        }
        if self.settings.require_price {
            return Err(crate::domain::InvalidInput::new(
                "model",
                format!(
                    "{model:?} has no price and spend limits apply ([money] require_price): \
                     set its model group's prices with `ctxbudget prices set`, or send a \
                     priced model"
                ),
            )
            .into());
        }
        if self.unpriced.note(model) {
            tracing::warn!(
                model,
                "a model without a price is counted as costing nothing against spend limits; \
                 set its model group's prices ([prices.<group>] or `ctxbudget prices set`)"
            );
        }
        Ok(())
    }

    /// The quota in shadow's check of `plan`, while the store is healthy: in
    /// an outage it would only add its deadline to every call.
    async fn shadow_if_healthy(&self, plan: &ReservePlan, tier: &Tier) -> Option<ShadowCheck> {
        match &tier.shadow {
            Some(limits) if self.breaker_state() == BreakerState::Closed => {
                Some(self.shadow_check(plan, limits, &tier.name).await)
            }
            _ => None,
        }
    }

    /// The request's prompt counted (a caller's count is used as is), the
    /// count corrected by the estimator (its multiplier, or its content fit). Text goes to the counter
    /// (a long one to another thread), so it leaves the request: nothing after
    /// counting reads it.
    pub(super) async fn count(&self, req: &mut ReserveRequest, tier: &Tier) -> PromptCount {
        let prompt = match &mut req.prompt {
            PromptInput::Tokens(n) => {
                // The key names the model's completions too (a learned output).
                let estimator = self.counter.rules().estimator_key(&req.model).to_string();
                return PromptCount {
                    estimator,
                    ..PromptCount::given(*n)
                };
            }
            PromptInput::Text(prompt) => std::mem::replace(prompt, Prompt::Text(String::new())),
        };
        let mixed = self.multipliers.settings().correction == Correction::Content;
        let counted = self
            .counter
            .count(&req.model, prompt, tier.max_context_tokens, mixed)
            .await;
        let count = counted.count;
        telemetry::counted(counted.method.kind(), count.tokens);
        let estimator = self.counter.rules().estimator_key(&req.model).to_string();
        let corrector = self.corrector(&estimator).await;
        let (reserve, multiplier) = corrector.reserve(count.tokens, counted.mix.as_ref());
        PromptCount {
            tokens: count.tokens,
            more_than: count.exceeded.then_some(tier.max_context_tokens),
            reserve,
            estimated: count.tokens,
            estimator,
            multiplier,
            mix: counted.mix,
        }
    }

    /// The limits of `req`'s scope as they stand, for a request refused
    /// before the store: retrying cannot help, but the caller still gets the
    /// limits to build its headers from; without the store, it gets none.
    async fn limits_now(
        &self,
        req: &ReserveRequest,
        limits: &Limits,
        tier: &Tier,
    ) -> Vec<LimitState> {
        let planned = plan::Scope {
            tier: Some(tier),
            group: limits.group_of(&req.model),
            has_user: req.user.is_some(),
            has_session: req.session.is_some(),
            now_us: self.store.now_us(),
        };
        let levels = plan::levels(limits, planned, false);
        let status = Scope {
            tenant: &req.tenant,
            user: req.user.as_ref(),
            session: req.session.as_ref(),
        };
        match self
            .guarded("status", self.store.status(status, &levels, false))
            .await
        {
            Ok(readings) => decision::limit_states(&levels, &readings),
            Err(_) => Vec::new(),
        }
    }

    /// After the store call: a reservation the caller will not get is queued
    /// for cancellation, and the drop guard stands down unless the store
    /// reserved something new (the guard then holds until the answer is out).
    pub(super) fn cancel_if_unanswered(
        &self,
        reply: &Result<ReserveReply, StoreError>,
        plan: &ReservePlan,
        life: std::time::Duration,
        guard: &mut CancelGuard<'_>,
    ) {
        match reply {
            Ok(ReserveReply::Allowed { .. }) => {}
            Err(StoreError::Unanswered(_) | StoreError::Protocol(_)) => {
                // The script may have run, or still run (a frozen store runs
                // it when it wakes), and the caller will not get the
                // reservation: cancel it. Under fail_closed a caller with an
                // idempotency key retries with it and gets it back instead.
                if plan.idempotency_key.is_none() || self.policy() != FailurePolicy::FailClosed {
                    self.cancels.push(plan.id.clone(), life);
                }
                guard.disarm();
            }
            // Refused by the breaker, or answered with an error (nothing ran),
            // or nothing new was reserved.
            _ => guard.disarm(),
        }
    }

    /// The store's reply, or — when it failed and the policy allows — the
    /// local store's, for the plan the local store enforces; true when
    /// degraded so.
    pub(super) async fn or_degraded(
        &self,
        plan: ReservePlan,
        reply: Result<ReserveReply, StoreError>,
    ) -> (ReservePlan, Result<ReserveReply, StoreError>, bool) {
        match reply {
            Err(e) if e.is_transient() && self.policy() != FailurePolicy::FailClosed => {
                // Degraded: decide from this replica's memory and say so.
                warn_degraded(self.policy().as_str(), &e.to_string());
                telemetry::degraded(self.policy().as_str());
                let plan = self.local_plan(&plan);
                let reply = self.local.reserve(&plan).await;
                (plan, reply, true)
            }
            other => (plan, other, false),
        }
    }

    /// The limits of a reservation's tenant and tier, if the tier still exists.
    pub(super) fn tier_of(
        &self,
        id: &crate::domain::ReservationId,
    ) -> Option<Arc<crate::domain::Tier>> {
        self.limits().resolve(&id.tier, id.tenant.as_str())
    }
}
