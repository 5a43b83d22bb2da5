//! The budget engine: takes validated requests (parsed in `api/`: typed ids,
//! counts and usage), counts prompts, plans them against the current limits,
//! asks the store, and turns the store's readings into decisions. Knows
//! nothing of gRPC; `api/` translates around it.
//!
//! - [`reserve`]: CheckAndReserve, one pipeline for one model or several
//!   fallback candidates (a single model is a one-element list): admit,
//!   count, plan every candidate ([`prepare`]), reserve the first with room
//!   in one store call, check the quota in shadow, answer.
//! - [`reply`]: its answer, built from the plan, the reply and the prompt's
//!   count; the decision recorded.
//! - [`resilient`]: the store as the engine calls it, wrapped in the breaker,
//!   degraded (local) decisions and cancel on drop; no step above knows them.
//! - [`settle`]: Commit, Refund, RenewLease.
//! - [`charge`]: charges with no reservation (Envoy's rate limit protocol).
//! - [`shadow`]: quotas in shadow, evaluated and reported but never enforced.
//! - [`status`]: GetStatus and the estimator's state, and its refresh.
//! - [`breaker`]: the circuit breaker's states and settings.
//! - [`policy`]: what the engine does when the store cannot answer.
//! - [`cancel`]: cancelling reservations their caller never received.
//!
//! # The surface
//!
//! | | [`Engine`]'s methods |
//! |---|---|
//! | decide | `reserve` (one model or candidates), `commit`, `refund`, `renew`, `charge` (Envoy's rate limit service) |
//! | read | `status`, `estimators`, `limits`, `store`, `policy`, `breaker_state`, `is_provisional`, `cancellations_pending`, `check_tier` |
//! | run | `new`, `set_limits`, `set_provisional`, `trip_breaker`; the server's background loops `probe_if_due`, `refresh_estimators`, `run_cancellations`, `run_lines` |

mod breaker;
mod cancel;
mod charge;
mod lines;
mod policy;
mod prepare;
mod reply;
mod reserve;
mod resilient;
mod settle;
mod shadow;
mod status;
mod waiting;

pub use breaker::{Breaker, BreakerSettings, BreakerState};
pub use charge::{ChargeInput, ChargeOutcome};
pub use policy::FailurePolicy;
pub use reply::{ReserveOutcome, Skipped};
pub use reserve::MAX_CANDIDATES;
pub use settle::{CommitOutcome, CommitRequest, Completion, Outcome, RefundOutcome, RenewOutcome};
pub use status::{EstimatorView, LevelLeases, StatusOutcome, StatusRequest};

use crate::domain::plan::LeasePolicy;
use crate::domain::{InvalidInput, Limits, Priorities, Tier};
use crate::estimator::{Counter, Multipliers};
use crate::store::{Retention, Store, StoreError};
use crate::telemetry;
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
    /// What happens when the store cannot answer.
    pub policy: FailurePolicy,
    /// Replicas sharing the store: the `local` policy divides limits by it.
    pub replicas: u64,
    /// The store's circuit breaker.
    pub breaker: BreakerSettings,
    /// Retention of the local (degraded-mode) store.
    pub retention: Retention,
    /// The share of every limit each priority class must leave.
    pub priorities: Priorities,
    /// Refuse requests for models without a price where spend limits apply.
    pub require_price: bool,
    /// Calls one shared level's line holds (`[queue] max_queued`).
    pub max_queued: usize,
}

/// Models already logged as having no price: each is said once (at most
/// [`Self::CAP`] remembered, so hostile model names cannot grow it).
#[derive(Default)]
pub(crate) struct Unpriced(std::sync::Mutex<std::collections::HashSet<String>>);

impl Unpriced {
    const CAP: usize = 1000;

    /// True the first time `model` is seen.
    pub(crate) fn note(&self, model: &str) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(model) || seen.len() >= Self::CAP {
            return false;
        }
        seen.insert(model.to_owned())
    }
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
    /// The budget store, behind the breaker, degraded mode and cancel on drop.
    budget: resilient::Resilient<S>,
    /// Where quotas in shadow keep their state: the same backend, other keys.
    shadow: S,
    limits: RwLock<Arc<Limits>>,
    settings: EngineSettings,
    counter: Counter,
    multipliers: Multipliers,
    /// Models logged as having no price.
    unpriced: Unpriced,
    /// Calls waiting in line for a shared level (`reserve_within`).
    queues: lines::Queues,
    /// The limits in force are the file's, standing in until the store's
    /// configuration is loaded (the store did not answer at start-up).
    provisional: std::sync::atomic::AtomicBool,
}

/// The refusal of a request of `tenant` (and `user`) whose scope an operator
/// blocked (`ctxbudget overrides block`), if it is.
fn blocked(limits: &Limits, tenant: &str, user: Option<&str>) -> Option<crate::domain::Denial> {
    let refusal = limits.overrides.get(tenant)?.blocks.refusal(tenant, user)?;
    Some(crate::domain::Denial::blocked(&refusal))
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
            budget: resilient::Resilient::new(store, &settings),
            limits: RwLock::new(limits),
            settings,
            counter,
            multipliers,
            unpriced: Unpriced::default(),
            queues: lines::Queues::default(),
            provisional: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Marks the limits in force as the file's, standing in until the store's
    /// configuration is loaded: a tier they lack may exist in the store, so it
    /// is refused as UNAVAILABLE (retry), not INVALID_ARGUMENT.
    pub fn set_provisional(&self, provisional: bool) {
        self.provisional
            .store(provisional, std::sync::atomic::Ordering::Relaxed);
    }

    /// True while the limits in force are the file's, standing in until the
    /// store's configuration is loaded.
    pub fn is_provisional(&self) -> bool {
        self.provisional.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The tier `tenant` has under `limits`, overrides applied. A tier the
    /// limits lack is INVALID_ARGUMENT, or UNAVAILABLE while they are
    /// provisional (the tier may exist in the store's configuration).
    fn resolve_tier(
        &self,
        limits: &Limits,
        tier: &str,
        tenant: &str,
    ) -> Result<Arc<Tier>, EngineError> {
        let unknown = match limits.resolve_known(tier, tenant) {
            Ok(found) => return Ok(found),
            Err(unknown) => unknown,
        };
        if self.provisional.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(EngineError::Store(StoreError::Unavailable(
                format!(
                    "tier {tier:?} is not among the configuration file's tiers ({}), and the \
                 configuration in Redis has not been loaded yet (Redis does not answer)",
                    limits.tier_names()
                )
                .into(),
            )));
        }
        Err(unknown.into())
    }

    /// Checks that `tier` names a tier for `tenant` (an override may name it),
    /// as a request for it would: INVALID_ARGUMENT otherwise.
    pub fn check_tier(&self, tier: &str, tenant: &str) -> Result<(), EngineError> {
        self.resolve_tier(&self.limits(), tier, tenant).map(drop)
    }

    /// The store, for callers that describe or probe it.
    pub fn store(&self) -> &S {
        self.budget.store()
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the limits in force; calls in flight finish under the old ones.
    /// Limits set here are the real ones (no longer provisional).
    pub fn set_limits(&self, limits: Arc<Limits>) {
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
        self.set_provisional(false);
    }

    /// The store's circuit breaker state.
    pub fn breaker_state(&self) -> BreakerState {
        self.budget.breaker().state()
    }

    /// Probes the store when the breaker is open and its cool-down has
    /// passed; the server calls this a few times a second, off the request
    /// path. Returns true when a probe ran.
    pub async fn probe_if_due(&self) -> bool {
        self.budget.probe_if_due().await
    }

    /// Opens the breaker with a probe due at once: the store was unreachable
    /// when the service started, so calls follow the failure policy until a
    /// probe finds it.
    pub fn trip_breaker(&self) {
        self.budget.breaker().trip();
        telemetry::breaker(self.breaker_state());
    }

    /// The failure policy.
    pub fn policy(&self) -> FailurePolicy {
        self.budget.policy()
    }
}
