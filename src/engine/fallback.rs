//! CheckAndReserve with fallback candidates: each model in order, reserved
//! as CheckAndReserve reserves one, until one has room. A denied candidate
//! holds nothing (a reservation is all or nothing), so trying the next one
//! leaves no trace but its denial. The tier is resolved and a block (which
//! holds for every model) checked once, the prompt counted once per
//! tokenizer and estimator key, and every candidate planned before the store
//! is asked: the plans go to it in one call ([`Store::reserve_first`]: one
//! script call on Redis), but under a quota in shadow, checked plan by plan.

use super::reply::ReserveOutcome;
use super::reserve::Refusal;
use super::{Engine, EngineError};
use crate::domain::plan::{ReservePlan, ReserveRequest};
use crate::domain::{Denial, Limits, PromptCount, PromptInput, Tier};
use crate::estimator::Method;
use crate::store::{ReserveReply, Store, StoreError};
use std::time::Duration;

/// How a candidate's prompt is counted: its tokenizer and estimator key.
type CountedAs = (Method, String);

/// The most candidates one request may name.
pub const MAX_CANDIDATES: usize = 8;

/// A candidate that was not taken.
#[derive(Clone, Debug)]
pub struct Skipped {
    /// The model, as sent.
    pub model: String,
    /// Why.
    pub denial: Denial,
}

/// The answer to CheckAndReserve with candidates.
#[derive(Clone, Debug)]
pub struct FallbackOutcome {
    /// The chosen candidate's reservation; when none had room, the first
    /// candidate's denial with the earliest retry among all.
    pub outcome: ReserveOutcome,
    /// The candidate reserved, as sent.
    pub chosen_model: Option<String>,
    /// The candidates tried before it (all of them when none had room).
    pub skipped: Vec<Skipped>,
}

impl<S: Store> Engine<S> {
    /// Reserves `req` on the first of `candidates` with room (`req.model`
    /// is replaced by each in turn).
    pub async fn reserve_first(
        &self,
        req: ReserveRequest,
        candidates: Vec<String>,
    ) -> Result<FallbackOutcome, EngineError> {
        let limits = self.limits();
        let tier = match self.admit(&limits, &req)? {
            Ok(tier) => tier,
            // A block holds for every model.
            Err(blocked) => {
                return Ok(FallbackOutcome {
                    outcome: blocked,
                    chosen_model: None,
                    skipped: Vec::new(),
                });
            }
        };
        // Every candidate planned first; those no store could admit (a
        // context too large) and planning errors are answered when reached.
        let mut entries = Vec::with_capacity(candidates.len());
        // The prompt is counted once per way of counting it: candidates of
        // one tokenizer and one estimator key share the count.
        let mut counted: Vec<(CountedAs, PromptCount)> = Vec::new();
        for model in candidates {
            let mut attempt = for_model(&req, &model);
            let how = self.counted_as(&model);
            let i = match counted.iter().position(|(h, _)| *h == how) {
                Some(i) => i,
                None => {
                    attempt.prompt = req.prompt.clone();
                    let count = self.count(&mut attempt, &tier).await;
                    counted.push((how, count));
                    counted.len() - 1
                }
            };
            let planned = self.plan(&attempt, &limits, &tier, &counted[i].1).await;
            entries.push(Entry {
                model,
                counted: i,
                attempt,
                planned,
            });
        }
        let ctx = Tried {
            limits: &limits,
            tier: &tier,
            counted: &counted,
        };
        let outcomes = match tier.shadow.is_some() {
            // A quota in shadow is checked plan by plan, as for one model.
            true => self.in_order(entries, &ctx, How::OneByOne).await?,
            false => self.together(entries, &ctx).await?,
        };
        Ok(first_allowed(outcomes))
    }

    /// The candidates answered in order until one is allowed: a plan as
    /// `how` says, a refusal as it stands, the error of planning a candidate
    /// as the call's (every candidate before it was denied).
    async fn in_order(
        &self,
        entries: Vec<Entry>,
        ctx: &Tried<'_>,
        mut how: How,
    ) -> Result<Vec<(String, ReserveOutcome)>, EngineError> {
        let mut outcomes = Vec::with_capacity(entries.len());
        for entry in entries {
            let count = &ctx.counted[entry.counted].1;
            let out = match (entry.planned?, &mut how) {
                (Err(refusal), _) => {
                    self.refused(&entry.attempt, ctx.limits, ctx.tier, count, refusal)
                        .await
                }
                (Ok(plan), How::OneByOne) => {
                    Box::pin(self.reserve_plan(plan, ctx.tier, count)).await?
                }
                (Ok(_), How::Replied(replies)) => {
                    let Some((plan, reply)) = replies.next() else {
                        break;
                    };
                    let out = self.explain(&plan, reply, ctx.tier, count, false, None)?;
                    if out.denial.is_none() {
                        let id = tracing::field::display(&plan.id);
                        tracing::Span::current().record("reservation", id);
                    }
                    out
                }
                (Ok(plan), How::Degraded(error)) => {
                    let (plan, reply, degraded) = self.or_degraded(plan, Err(error.clone())).await;
                    self.explain(&plan, reply?, ctx.tier, count, degraded, None)?
                }
            };
            let allowed = out.denial.is_none();
            outcomes.push((entry.model, out));
            if allowed {
                break;
            }
        }
        Ok(outcomes)
    }

    /// The candidates' plans in one store call ([`Store::reserve_first`]),
    /// each answered as CheckAndReserve answers one model; with the store
    /// failing, the failure policy decides plan by plan. Candidates after
    /// one that could not be planned are not sent: its error answers the
    /// call if every candidate before it is denied.
    async fn together(
        &self,
        entries: Vec<Entry>,
        ctx: &Tried<'_>,
    ) -> Result<Vec<(String, ReserveOutcome)>, EngineError> {
        let plans = batch(&entries);
        let life = |plan: &ReservePlan| {
            Duration::from_millis(plan.lease_ttl_ms + self.settings.retention.record_ms)
        };
        // Until the caller has its answer, a reservation the store may have
        // made is cancelled if this call is dropped: any of the plans may be it.
        let mut guards: Vec<_> = plans
            .iter()
            .map(|p| self.cancels.guard(&p.id, life(p), true))
            .collect();
        let replies = match plans.is_empty() {
            true => Ok(Vec::new()),
            false => {
                self.guarded("reserve", self.store.reserve_first(&plans))
                    .await
            }
        };
        let how = match replies {
            Ok(replies) => {
                // Answered: the caller gets what the store reserved.
                guards.iter_mut().for_each(|g| g.disarm());
                How::Replied(plans.into_iter().zip(replies))
            }
            Err(e) => {
                for (plan, guard) in plans.iter().zip(&mut guards) {
                    self.cancel_if_unanswered(&Err(e.clone()), plan, life(plan), guard);
                }
                How::Degraded(e)
            }
        };
        self.in_order(entries, ctx, how).await
    }
}

/// How [`Engine::in_order`] answers a candidate's plan.
enum How {
    /// Reserved alone, as CheckAndReserve reserves one model.
    OneByOne,
    /// From the store's replies to the plans sent together, in order.
    Replied(std::iter::Zip<std::vec::IntoIter<ReservePlan>, std::vec::IntoIter<ReserveReply>>),
    /// With the store failing: as the failure policy decides (from this
    /// replica's memory under `local`).
    Degraded(StoreError),
}

/// The plans sent together: those of the candidates before the first that
/// could not be planned.
fn batch(entries: &[Entry]) -> Vec<ReservePlan> {
    entries
        .iter()
        .map_while(|e| e.planned.as_ref().ok())
        .filter_map(|planned| planned.as_ref().ok().cloned())
        .collect()
}

/// What the candidates are decided under.
struct Tried<'a> {
    limits: &'a Limits,
    tier: &'a Tier,
    /// Each way of counting the prompt, and its count.
    counted: &'a [(CountedAs, PromptCount)],
}

/// One candidate: its model as sent, its request, which count it shares, and
/// its plan (or why no store could admit it, or the error of planning it).
struct Entry {
    model: String,
    attempt: ReserveRequest,
    counted: usize,
    planned: Result<Result<ReservePlan, Refusal>, EngineError>,
}

/// The answer from the candidates tried: the last, if allowed, with the
/// others skipped; else the first candidate's denial with the earliest retry
/// among all.
fn first_allowed(outcomes: Vec<(String, ReserveOutcome)>) -> FallbackOutcome {
    let mut skipped: Vec<Skipped> = Vec::with_capacity(outcomes.len());
    let mut first: Option<ReserveOutcome> = None;
    for (model, out) in outcomes {
        let Some(denial) = out.denial.clone() else {
            return FallbackOutcome {
                outcome: out,
                chosen_model: Some(model),
                skipped,
            };
        };
        skipped.push(Skipped { model, denial });
        first.get_or_insert(out);
    }
    let mut outcome = first.expect("at least one candidate was tried");
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
    FallbackOutcome {
        outcome,
        chosen_model: None,
        skipped,
    }
}

/// `req` for `model`, without its prompt (counted apart, or shared).
fn for_model(req: &ReserveRequest, model: &str) -> ReserveRequest {
    ReserveRequest {
        tenant: req.tenant.clone(),
        user: req.user.clone(),
        session: req.session.clone(),
        tier: req.tier.clone(),
        model: model.to_owned(),
        prompt: PromptInput::Tokens(0),
        max_output_tokens: req.max_output_tokens,
        min_output_tokens: req.min_output_tokens,
        idempotency_key: req.idempotency_key.clone(),
        lease_ttl_ms: req.lease_ttl_ms,
        priority: req.priority,
        declared: req.declared,
    }
}
