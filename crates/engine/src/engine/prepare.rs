//! CheckAndReserve's steps before the store: admit the request (its tier, a
//! block), count its prompt once per way of counting it among the candidate
//! models, correct the count with the estimator, and plan each candidate (its
//! learned output read, its price checked). A request no store could admit is
//! answered here too, with the limits of its scope as they stand.

use super::reply::ReserveOutcome;
use super::resilient::PerCandidate;
use super::{Engine, EngineError};
use crate::domain::decision::{self, LimitState};
use crate::domain::plan::{self, Prepared, ReservePlan, ReserveRequest, Terms};
use crate::domain::{Denial, Limits, PromptCount, PromptInput, Tier, UserId};
use crate::estimator::{Correction, Method};
use crate::store::{Scope, Store};
use crate::telemetry;
use std::sync::Arc;

/// Why a request was refused before the store: it can never fit.
#[derive(Clone, Debug)]
pub(super) struct Refusal {
    /// Context or request too large.
    denial: Denial,
    /// Prompt + output tokens the request asked for.
    tokens: u64,
    /// The output part of `tokens`.
    max_output_tokens: u64,
}

/// The prompt's counts: one per way of counting it (a tokenizer and an
/// estimator key) among the candidates, and which each candidate uses.
pub(super) struct Counts {
    /// The counts, in the order first needed.
    pub counts: PerCandidate<PromptCount>,
    /// Per candidate, in order: the index of its count.
    pub of: PerCandidate<usize>,
}

impl<S: Store> Engine<S> {
    /// The request's tier, or the answer for a blocked tenant or user (a
    /// block holds for every model).
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

    /// The request's prompt counted for each candidate: once per way of
    /// counting it, so candidates of one tokenizer and one estimator key
    /// share a count. The prompt leaves the request (text goes to the
    /// counter, a long one to another thread): nothing after counting reads
    /// it.
    pub(super) async fn count_candidates(&self, req: &mut ReserveRequest, tier: &Tier) -> Counts {
        let mut prompt = std::mem::replace(&mut req.prompt, PromptInput::Tokens(0));
        if req.fallbacks.is_empty() {
            return Counts {
                counts: smallvec::smallvec![self.count(prompt, &req.model, tier).await],
                of: smallvec::smallvec![0],
            };
        }
        let mut ways: PerCandidate<(Method, String)> = PerCandidate::new();
        let mut counts = Counts {
            counts: PerCandidate::new(),
            of: PerCandidate::new(),
        };
        let last = req.fallbacks.len();
        for (i, model) in req.candidates().enumerate() {
            let rules = self.counter.rules();
            let how = (rules.method(model), rules.estimator_key(model).to_string());
            let at = match ways.iter().position(|w| *w == how) {
                Some(at) => at,
                None => {
                    let this = match i == last {
                        true => std::mem::replace(&mut prompt, PromptInput::Tokens(0)),
                        false => prompt.clone(),
                    };
                    counts.counts.push(self.count(this, model, tier).await);
                    ways.push(how);
                    ways.len() - 1
                }
            };
            counts.of.push(at);
        }
        counts
    }

    /// `prompt` counted for `model` (a caller's count is used as is), the
    /// count corrected by the estimator (its multiplier, or its content fit).
    async fn count(&self, prompt: PromptInput, model: &str, tier: &Tier) -> PromptCount {
        // The key names the model's completions too (a learned output).
        let estimator = self.counter.rules().estimator_key(model).to_string();
        let prompt = match prompt {
            PromptInput::Tokens(n) => {
                return PromptCount {
                    estimator,
                    ..PromptCount::given(n)
                };
            }
            PromptInput::Text(prompt) => prompt,
        };
        let mixed = self.multipliers.settings().correction == Correction::Content;
        let counted = self
            .counter
            .count(model, prompt, tier.max_context_tokens, mixed)
            .await;
        let count = counted.count;
        telemetry::counted(counted.method.kind(), count.tokens);
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

    /// The plan of `req` for `model`, its prompt counted as `count` (its
    /// learned output read, its price checked), or why no store could admit
    /// it.
    pub(super) async fn plan(
        &self,
        req: &ReserveRequest,
        model: &str,
        limits: &Arc<Limits>,
        tier: &Arc<Tier>,
        count: &PromptCount,
    ) -> Result<Result<ReservePlan, Refusal>, EngineError> {
        let terms = Terms {
            limits,
            tier,
            leases: self.settings.leases,
            priorities: self.settings.priorities,
            now_us: self.store().now_us(),
        };
        let mut plan = match plan::prepare(req, model, count, &terms)? {
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
        self.check_price(&plan, model, limits)?;
        if plan.levels.iter().any(|l| l.overrun.is_some()) {
            plan.learned_output = self.learned_output(&plan.id.estimator, &tier.name).await;
        }
        Ok(Ok(plan))
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

    /// The answer to a request for `model` no store could admit (counted),
    /// with the limits of its scope as they stand.
    pub(super) async fn refused(
        &self,
        req: &ReserveRequest,
        model: &str,
        (limits, tier): (&Limits, &Tier),
        count: &PromptCount,
        refusal: Refusal,
    ) -> ReserveOutcome {
        telemetry::decision(&tier.name, Some(&refusal.denial), 0);
        let now = match req.statuses.any() {
            true => {
                let all = self.limits_now(req, model, limits, tier).await;
                req.statuses.pick(all, Some(&refusal.denial))
            }
            // Nothing to show: the limits are not read.
            false => Vec::new(),
        };
        ReserveOutcome::refused(
            refusal.denial,
            refusal.tokens,
            refusal.max_output_tokens,
            count,
            now,
        )
    }

    /// The limits of `req`'s scope for `model` as they stand, for a request
    /// refused before the store: retrying cannot help, but the caller still
    /// gets the limits to build its headers from; without the store, it gets
    /// none.
    async fn limits_now(
        &self,
        req: &ReserveRequest,
        model: &str,
        limits: &Limits,
        tier: &Tier,
    ) -> Vec<LimitState> {
        let planned = plan::Scope {
            tier: Some(tier),
            group: limits.group_of(model),
            has_user: req.user.is_some(),
            has_session: req.session.is_some(),
            now_us: self.store().now_us(),
        };
        let levels = plan::levels(limits, planned, false);
        let status = Scope {
            tenant: &req.tenant,
            user: req.user.as_ref(),
            session: req.session.as_ref(),
        };
        match self
            .budget
            .call("status", self.store().status(status, &levels, false))
            .await
        {
            Ok(readings) => decision::limit_states(&levels, &readings),
            Err(_) => Vec::new(),
        }
    }
}
