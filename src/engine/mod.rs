//! The budget engine: takes validated requests, counts prompts, plans them
//! against the current limits, asks the store, and turns the store's readings
//! into decisions. Knows nothing of gRPC; `api/` translates around it.
//!
//! - [`reserve`]: CheckAndReserve, from the prompt to the decision.
//! - [`settle`]: Commit, Refund, RenewLease.
//! - [`shadow`]: quotas in shadow, evaluated and reported but never enforced.
//! - [`status`]: GetStatus and the estimator's state, and its refresh.

mod reserve;
mod settle;
mod shadow;
mod status;

pub use reserve::{PromptInput, ReserveInput, ReserveOutcome};
pub use settle::{CommitOutcome, Outcome};
pub use status::{EstimatorView, LevelLeases, StatusOutcome};

use crate::domain::plan::LeasePolicy;
use crate::domain::{InvalidInput, Limits};
use crate::estimator::{Counter, Multipliers};
use crate::store::{Store, StoreError};
use std::sync::{Arc, RwLock};

/// What the engine needs besides the store and limits.
#[derive(Clone, Copy, Debug)]
pub struct EngineSettings {
    /// Lease lengths.
    pub leases: LeasePolicy,
    /// Random jitter added to every retry_after.
    pub retry_jitter_ms: u64,
    /// Longest retry_after suggested for a full concurrency limit.
    pub concurrency_retry_ms: u64,
}

/// A request the engine could not answer with a decision.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is malformed.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The reservation does not exist (any more).
    #[error("{0}")]
    NotFound(String),
    /// The request is well-formed but the state it refers to does not allow it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Decides reservations over a store.
pub struct Engine<S> {
    store: S,
    /// Where quotas in shadow keep their state: the same backend, other keys.
    shadow: S,
    limits: RwLock<Arc<Limits>>,
    settings: EngineSettings,
    counter: Counter,
    multipliers: Multipliers,
}

impl<S: Store> Engine<S> {
    /// An engine over `store` enforcing `limits`, counting prompts with
    /// `counter` and correcting counts with `multipliers`.
    pub fn new(
        store: S,
        limits: Arc<Limits>,
        settings: EngineSettings,
        counter: Counter,
        multipliers: Multipliers,
    ) -> Self {
        Engine {
            shadow: store.shadow(),
            store,
            limits: RwLock::new(limits),
            settings,
            counter,
            multipliers,
        }
    }

    /// The store, for callers that describe or probe it.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the limits in force; calls in flight finish under the old ones.
    pub fn set_limits(&self, limits: Arc<Limits>) {
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
    }
}
