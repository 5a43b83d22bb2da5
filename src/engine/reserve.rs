//! CheckAndReserve: count the prompt (when the caller did not), correct the
//! count with the adaptive multiplier, plan, reserve, and explain the result.

use super::BreakerState;
use super::FailurePolicy;
use super::cancel::CancelGuard;
use super::reply::{record_decision, warn_degraded};
use super::shadow::{ShadowCheck, ShadowSettle};
use super::{Engine, EngineError};
use crate::domain::decision::{self, LimitState};
use crate::domain::plan::{self, Prepared, ReservePlan, ReserveRequest};
use crate::domain::{Denial, IdempotencyKey, Level, Limits, Priority, TenantId, Tier, UserId};
use crate::estimator::Prompt;
use crate::store::{ReserveReply, Scope, Store, StoreError};
use crate::telemetry;
use std::sync::Arc;

/// The prompt as the caller gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptInput {
    /// The caller's own count, used as is.
    Tokens(u64),
    /// Text or chat messages the service counts.
    Text(Prompt),
}

/// A CheckAndReserve request, fields validated.
#[derive(Clone, Debug)]
pub struct ReserveInput {
    /// The customer.
    pub tenant: TenantId,
    /// The user, if user-level limits apply.
    pub user: Option<UserId>,
    /// The tier name.
    pub tier: String,
    /// The upstream model: picks the tokenizer and the estimator key.
    pub model: String,
    /// The prompt.
    pub prompt: PromptInput,
    /// Output tokens; 0 means the tier's default.
    pub max_output_tokens: u64,
    /// With reduced output allowed: the fewest output tokens worth granting.
    pub min_output_tokens: Option<u64>,
    /// Makes a retried call return the first reservation.
    pub idempotency_key: Option<IdempotencyKey>,
    /// Requested lease length.
    pub lease_ttl_ms: Option<u64>,
    /// How much the request matters: picks the headroom it must leave.
    pub priority: Priority,
}

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
}

/// The prompt after counting.
struct Counted {
    raw: u64,
    /// Counting stopped early, above this many tokens.
    more_than: Option<u64>,
    reserve: u64,
    estimated: u64,
    estimator: String,
    multiplier: f64,
}

impl ReserveOutcome {
    /// Refused before anything is counted or reserved: the scope is blocked.
    fn blocked(denial: Denial) -> Self {
        ReserveOutcome {
            denial: Some(denial),
            ..ReserveOutcome::counted(&Counted {
                raw: 0,
                more_than: None,
                reserve: 0,
                estimated: 0,
                estimator: String::new(),
                multiplier: 1.0,
            })
        }
    }

    /// Nothing decided yet, the prompt counted.
    fn counted(counted: &Counted) -> Self {
        ReserveOutcome {
            denial: None,
            reservation_id: None,
            reserved_tokens: 0,
            max_output_tokens: 0,
            granted_max_output_tokens: 0,
            estimated_prompt_tokens: counted.estimated,
            estimator_multiplier: counted.multiplier,
            limits: Vec::new(),
            lease_expires_in_ms: 0,
            replayed: false,
            shadow_denial: None,
            degraded: false,
        }
    }
}

impl<S: Store> Engine<S> {
    /// CheckAndReserve: count, plan, check the quota in shadow, reserve (or,
    /// degraded, reserve locally), and explain the store's reply.
    pub async fn reserve(&self, input: ReserveInput) -> Result<ReserveOutcome, EngineError> {
        let limits = self.limits();
        let tier = self.resolve_tier(&limits, &input.tier, input.tenant.as_str())?;
        let user = input.user.as_ref().map(UserId::as_str);
        if let Some(denial) = super::blocked(&limits, input.tenant.as_str(), user) {
            telemetry::decision(&tier.name, Some(&denial), 0);
            return Ok(ReserveOutcome::blocked(denial));
        }
        let (req, counted) = self.count(input, &tier).await;
        let model = req.model.clone();
        let mut out = ReserveOutcome::counted(&counted);
        let scope = (req.tenant.clone(), req.user.clone());
        let plan = match plan::prepare(req, &limits, &self.settings.leases)? {
            Prepared::Plan(plan) => {
                // Every later line of this call names the reservation.
                tracing::Span::current().record("reservation", tracing::field::display(&plan.id));
                self.check_price(&plan, &model, &limits)?;
                plan
            }
            Prepared::Refused {
                denial,
                tokens,
                max_output_tokens,
            } => {
                out.denial = Some(denial);
                out.reserved_tokens = tokens;
                out.max_output_tokens = max_output_tokens;
                return Ok(self.refused(out, &limits, &tier, &scope, &model).await);
            }
        };
        out.max_output_tokens = plan.max_output_tokens;
        out.reserved_tokens = plan.tokens();
        out.granted_max_output_tokens = plan.max_output_tokens;
        let shadow = self.shadow_if_healthy(&plan, &tier).await;
        let life =
            std::time::Duration::from_millis(plan.lease_ttl_ms + self.settings.retention.record_ms);
        // Until the caller has its answer, a reservation the store may have
        // made is cancelled if this call is dropped (a client deadline, a
        // reset stream); with an idempotency key, the caller's retry returns it.
        let mut guard = self
            .cancels
            .guard(plan.id.clone(), life, plan.idempotency_key.is_none());
        let reply = self.guarded("reserve", self.store.reserve(&plan)).await;
        self.cancel_if_unanswered(&reply, &plan, life, &mut guard);
        let (plan, reply) = self.or_degraded(plan, reply, &mut out).await;
        if let Some(shadow) = shadow {
            let served = matches!(reply, Ok(ReserveReply::Allowed { .. }));
            if shadow.taken && !served {
                self.shadow_settle(&plan.id, ShadowSettle::Refund).await;
            }
            out.shadow_denial = shadow.denial;
        }
        let reply = reply?;
        if !out.degraded {
            let reclaimed = reply.reclaimed();
            for level in [Level::Global, Level::Tenant, Level::User] {
                telemetry::leases_expired(level.as_str(), reclaimed.at(level));
            }
        }
        self.explain(&mut out, &plan, reply)?;
        record_decision(&tier.name, &plan, &out);
        guard.disarm();
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

    /// The request with its prompt counted (when the caller did not) and the
    /// count corrected by the estimator's multiplier.
    async fn count(&self, input: ReserveInput, tier: &Tier) -> (ReserveRequest, Counted) {
        let counted = match input.prompt {
            PromptInput::Tokens(n) => Counted {
                raw: n,
                more_than: None,
                reserve: n,
                estimated: 0,
                estimator: String::new(),
                multiplier: 1.0,
            },
            PromptInput::Text(prompt) => {
                let (count, method) = self
                    .counter
                    .count(&input.model, prompt, tier.max_context_tokens)
                    .await;
                telemetry::counted(method.kind(), count.tokens);
                let estimator = self.counter.rules().estimator_key(&input.model).to_string();
                let multiplier = self.multiplier(&estimator).await;
                let reserve = (count.tokens as f64 * multiplier).ceil() as u64;
                Counted {
                    raw: count.tokens,
                    more_than: count.exceeded.then_some(tier.max_context_tokens),
                    reserve,
                    estimated: count.tokens,
                    estimator,
                    multiplier,
                }
            }
        };
        let req = ReserveRequest {
            tenant: input.tenant,
            user: input.user,
            tier: input.tier,
            model: input.model,
            headroom: self.settings.priorities.headroom(input.priority),
            prompt_tokens: counted.raw,
            prompt_more_than: counted.more_than,
            prompt_reserve: counted.reserve,
            estimated_prompt_tokens: counted.estimated,
            estimator: counted.estimator.clone(),
            max_output_tokens: input.max_output_tokens,
            min_output_tokens: input.min_output_tokens,
            idempotency_key: input.idempotency_key,
            lease_ttl_ms: input.lease_ttl_ms,
            now_us: self.store.now_us(),
        };
        (req, counted)
    }

    /// A request refused before the store (`out` carries the denial):
    /// retrying cannot help, but the caller still gets the limits to build its
    /// headers from; without the store, it gets none.
    async fn refused(
        &self,
        mut out: ReserveOutcome,
        limits: &Limits,
        tier: &Tier,
        scope: &(TenantId, Option<UserId>),
        model: &str,
    ) -> ReserveOutcome {
        telemetry::decision(&tier.name, out.denial.as_ref(), 0);
        let planned = plan::Scope {
            tier: Some(tier),
            group: limits.group_of(model),
            has_user: scope.1.is_some(),
            now_us: self.store.now_us(),
        };
        let levels = plan::levels(limits, planned, false);
        let status = Scope {
            tenant: &scope.0,
            user: scope.1.as_ref(),
        };
        out.limits = match self
            .guarded("status", self.store.status(status, &levels, false))
            .await
        {
            Ok(readings) => decision::limit_states(&levels, &readings),
            Err(_) => Vec::new(),
        };
        out
    }

    /// After the store call: a reservation the caller will not get is queued
    /// for cancellation, and the drop guard stands down unless the store
    /// reserved something new (the guard then holds until the answer is out).
    fn cancel_if_unanswered(
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
    /// local store's, for the plan the local store enforces (`out` is marked
    /// degraded).
    async fn or_degraded(
        &self,
        plan: ReservePlan,
        reply: Result<ReserveReply, StoreError>,
        out: &mut ReserveOutcome,
    ) -> (ReservePlan, Result<ReserveReply, StoreError>) {
        match reply {
            Err(e) if e.is_transient() && self.policy() != FailurePolicy::FailClosed => {
                // Degraded: decide from this replica's memory and say so.
                warn_degraded(self.policy().as_str(), &e.to_string());
                telemetry::degraded(self.policy().as_str());
                let plan = self.local_plan(&plan);
                out.degraded = true;
                let reply = self.local.reserve(&plan).await;
                (plan, reply)
            }
            other => (plan, other),
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
