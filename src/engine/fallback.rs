//! CheckAndReserve with fallback candidates: each model in order, reserved
//! as CheckAndReserve reserves one, until one has room. A denied candidate
//! holds nothing (a reservation is all or nothing), so trying the next one
//! leaves no trace but its denial. The tier is resolved and a block (which
//! holds for every model) checked once, and the prompt counted once per
//! tokenizer and estimator key.

use super::reply::ReserveOutcome;
use super::{Engine, EngineError};
use crate::domain::plan::ReserveRequest;
use crate::domain::{Denial, PromptCount, PromptInput};
use crate::estimator::Method;

/// How a candidate's prompt is counted: its tokenizer and estimator key.
type CountedAs = (Method, String);
use crate::store::Store;

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
        let mut skipped: Vec<Skipped> = Vec::with_capacity(candidates.len());
        let mut first: Option<ReserveOutcome> = None;
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
            let count = &counted[i].1;
            let out = Box::pin(self.reserve_counted(&attempt, &limits, &tier, count)).await?;
            let Some(denial) = out.denial.clone() else {
                return Ok(FallbackOutcome {
                    outcome: out,
                    chosen_model: Some(model),
                    skipped,
                });
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
        Ok(FallbackOutcome {
            outcome,
            chosen_model: None,
            skipped,
        })
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
    }
}
