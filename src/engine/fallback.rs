//! CheckAndReserve with fallback candidates: each model in order, reserved
//! as CheckAndReserve reserves one, until one has room. A denied candidate
//! holds nothing (a reservation is all or nothing), so trying the next one
//! leaves no trace but its denial; an operator's block ends the search.

use super::reply::ReserveOutcome;
use super::{Engine, EngineError};
use crate::domain::plan::ReserveRequest;
use crate::domain::{Denial, Reason};
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
        let mut skipped: Vec<Skipped> = Vec::with_capacity(candidates.len());
        let mut first: Option<ReserveOutcome> = None;
        for model in candidates {
            let mut attempt = req.clone();
            attempt.model.clone_from(&model);
            let out = Box::pin(self.reserve(attempt)).await?;
            let Some(denial) = out.denial.clone() else {
                return Ok(FallbackOutcome {
                    outcome: out,
                    chosen_model: Some(model),
                    skipped,
                });
            };
            let blocked = denial.reason == Reason::Blocked;
            skipped.push(Skipped { model, denial });
            first.get_or_insert(out);
            if blocked {
                break;
            }
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
