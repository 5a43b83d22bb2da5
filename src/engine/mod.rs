//! The budget engine: takes validated requests (parsed in `api/`: typed ids,
//! counts and usage), counts prompts, plans them against the current limits,
//! asks the store, and turns the store's readings into decisions. Knows
//! nothing of gRPC; `api/` translates around it.
//!
//! - [`reserve`]: CheckAndReserve, from the request to the store's reply;
//!   [`fallback`]: the same over candidate models, the first with room.
//! - [`reply`]: its answer, built from the plan, the reply and the prompt's
//!   count; the decision recorded.
//! - [`settle`]: Commit, Refund, RenewLease.
//! - [`charge`]: charges with no reservation (Envoy's rate limit protocol).
//! - [`shadow`]: quotas in shadow, evaluated and reported but never enforced.
//! - [`status`]: GetStatus and the estimator's state, and its refresh.
//! - [`breaker`]: the circuit breaker in front of the store, its settings and
//!   its probe.
//! - [`policy`]: what the engine does when the store cannot answer.
//! - [`cancel`]: cancelling reservations their caller never received.

mod breaker;
mod cancel;
mod charge;
pub mod fallback;
mod policy;
mod reply;
mod reserve;
mod settle;
mod shadow;
mod status;

pub use breaker::{Breaker, BreakerSettings, BreakerState};
pub use charge::{ChargeInput, ChargeOutcome};
pub use fallback::{FallbackOutcome, Skipped};
pub use policy::FailurePolicy;
pub use reply::ReserveOutcome;
pub use settle::{CommitOutcome, CommitRequest, Completion, Outcome, RefundOutcome, RenewOutcome};
pub use status::{EstimatorView, LevelLeases, StatusOutcome, StatusRequest};

use crate::domain::plan::{LeasePolicy, LevelPlan, ReservePlan};
use crate::domain::{InvalidInput, Limits, Priorities, Tier};
use crate::estimator::{Counter, Multipliers};
use crate::store::keys::{DEFAULT_PREFIX, Keys};
use crate::store::memory::MemoryStore;
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
    store: S,
    /// Where quotas in shadow keep their state: the same backend, other keys.
    shadow: S,
    limits: RwLock<Arc<Limits>>,
    settings: EngineSettings,
    counter: Counter,
    multipliers: Multipliers,
    /// Guards every call to `store`.
    breaker: Breaker,
    /// Decides (and keeps) reservations while `store` is unavailable, under the
    /// `local` and `fail_open` policies.
    local: MemoryStore,
    /// Reservations whose store call failed, to refund once the store answers.
    cancels: cancel::Cancellations,
    /// Models logged as having no price.
    unpriced: Unpriced,
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
            store,
            limits: RwLock::new(limits),
            breaker: Breaker::new(settings.breaker),
            // Degraded decisions queue no alerts: nothing would send them.
            local: MemoryStore::new(
                Keys::new(DEFAULT_PREFIX).expect("the default prefix is valid"),
                crate::store::Retention {
                    alert_queue: 0,
                    ..settings.retention
                },
            ),
            settings,
            counter,
            multipliers,
            cancels: cancel::Cancellations::default(),
            unpriced: Unpriced::default(),
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
    /// Limits set here are the real ones (no longer provisional).
    pub fn set_limits(&self, limits: Arc<Limits>) {
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
        self.set_provisional(false);
    }

    /// The store's circuit breaker state.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Probes the store when the breaker is open and its cool-down has
    /// passed; the server calls this a few times a second, off the request
    /// path. Returns true when a probe ran.
    pub async fn probe_if_due(&self) -> bool {
        if !self.breaker.probe_due() {
            return false;
        }
        let started = std::time::Instant::now();
        let result = self.store.probe().await;
        if let Err(e) = &result
            && !e.is_transient()
        {
            tracing::error!(error = %e, "the store answers, but not as it must; the breaker stays open");
        }
        telemetry::store_call(
            "probe",
            started.elapsed().as_secs_f64(),
            result.as_ref().err().map(|_| "unavailable"),
        );
        self.breaker.probe_result(result.is_ok());
        telemetry::breaker(self.breaker.state());
        true
    }

    /// Opens the breaker with a probe due at once: the store was unreachable
    /// when the service started, so calls follow the failure policy until a
    /// probe finds it.
    pub fn trip_breaker(&self) {
        self.breaker.trip();
        telemetry::breaker(self.breaker.state());
    }

    /// The failure policy.
    pub fn policy(&self) -> FailurePolicy {
        self.settings.policy
    }

    /// Runs one store call through the breaker, timing it. An open breaker fails
    /// the call at once.
    async fn guarded<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(permit) = self.breaker.acquire() else {
            telemetry::store_call(op, 0.0, Some("breaker_open"));
            let refused = StoreError::Unavailable(
                "the store's circuit breaker is open after repeated failures; it probes the store \
                 again shortly"
                    .into(),
            );
            return Err(refused);
        };
        let started = std::time::Instant::now();
        let result = call.await;
        let failed = result.as_ref().is_err_and(StoreError::is_transient);
        self.breaker.record(permit, !failed);
        let kind = match &result {
            Ok(_) => None,
            Err(StoreError::Unavailable(_) | StoreError::Unanswered(_)) => Some("unavailable"),
            Err(StoreError::Protocol(_)) => Some("protocol"),
            Err(StoreError::Settings(_)) => Some("settings"),
        };
        telemetry::store_call(op, started.elapsed().as_secs_f64(), kind);
        telemetry::breaker(self.breaker.state());
        result
    }

    /// A plan for the local store: limits divided by the replica count (`local`)
    /// or none at all (`fail_open`); the id marks the reservation local.
    fn local_plan(&self, plan: &ReservePlan) -> ReservePlan {
        let mut local = plan.clone();
        local.id.local = true;
        local.idempotency_key = None;
        local.levels = self.local_levels(&plan.levels);
        local
    }

    /// What the local store enforces of `levels` while the store is
    /// unavailable: each limit divided by the replica count (`local`), or none
    /// at all (`fail_open`).
    fn local_levels(&self, levels: &[LevelPlan]) -> Vec<LevelPlan> {
        match self.settings.policy {
            FailurePolicy::FailOpen => Vec::new(),
            _ => levels
                .iter()
                .map(|l| l.scaled(self.settings.replicas))
                .collect(),
        }
    }
}
