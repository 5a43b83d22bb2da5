//! The store as the engine calls it: the budget store wrapped in the layers
//! that keep a decision coming when the store misbehaves. The engine's steps
//! (plan, decide, explain) know none of them; every store call of theirs goes
//! through [`Resilient`]:
//!
//! - **the breaker** ([`Resilient::call`]): every call timed and counted; after
//!   repeated failures calls fail at once until a probe finds the store again;
//! - **degraded decisions** ([`Resilient::reserve`], [`Resilient::status`],
//!   [`Resilient::charge`]): when the store cannot answer and the failure
//!   policy allows, this replica's memory decides, each limit divided by the
//!   replica count (`local`) or none (`fail_open`); a reservation made so is
//!   settled there ([`Resilient::commit`] and the others route by its id);
//! - **cancel on drop** ([`Resilient::reserve`], [`Reserved`]): a
//!   reservation the store may have made but the caller will not get is
//!   queued for refund.
//!
//! Quotas in shadow are the other store the engine keeps; its calls go through
//! the same breaker (`engine/shadow.rs`).

use super::breaker::{Breaker, BreakerState};
use super::cancel::Cancellations;
use super::reply::warn_degraded;
use super::{EngineSettings, FailurePolicy};
use crate::domain::plan::{LevelPlan, ReservePlan};
use crate::domain::{Reading, budget::Usage};
use crate::store::keys::{DEFAULT_PREFIX, Keys};
use crate::store::memory::MemoryStore;
use crate::store::{
    ChargePlan, ChargeReply, RenewReply, Retention, Scope, SettleReply, Settlement, Store,
    StoreError,
};
use crate::telemetry;
use smallvec::SmallVec;
use std::time::Duration;

/// Plans or replies of one CheckAndReserve: one per candidate, held inline
/// for the usual single model.
pub(super) type PerCandidate<T> = SmallVec<[T; 1]>;

/// The budget store behind the breaker, degraded mode and cancel on drop.
pub(super) struct Resilient<S> {
    store: S,
    breaker: Breaker,
    /// Decides (and keeps) reservations while `store` is unavailable, under
    /// the `local` and `fail_open` policies.
    local: MemoryStore,
    /// Reservations whose store call failed, to refund once the store answers.
    pub(super) cancels: Cancellations,
    policy: FailurePolicy,
    /// Replicas sharing the store: the `local` policy divides limits by it.
    replicas: u64,
    /// How long a reservation's record outlives its lease.
    record_ms: u64,
}

/// The store's answer to the plans of one CheckAndReserve, and until the
/// caller has it, the cancellation of the reservation it made: dropped
/// before [`Reserved::answered`], it queues that reservation's refund (the
/// ids are copied only then, off the usual path).
pub(super) struct Reserved<'a> {
    /// The plans the replies answer: the request's, or the local store's when
    /// degraded.
    pub plans: PerCandidate<ReservePlan>,
    /// One reply per plan tried, in order; the last may be allowed.
    pub replies: PerCandidate<crate::store::ReserveReply>,
    /// Decided from this replica's memory.
    pub degraded: bool,
    /// Bit per plan to cancel if dropped now.
    armed: u32,
    cancels: &'a Cancellations,
    record_ms: u64,
}

impl Reserved<'_> {
    /// The caller has its answer: nothing left to cancel.
    pub(super) fn answered(&mut self) {
        self.armed = 0;
    }

    /// How long `plan`'s record lives at most: nothing is left to cancel
    /// after.
    fn life(&self, plan: &ReservePlan) -> Duration {
        Duration::from_millis(plan.lease_ttl_ms + self.record_ms)
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        for (i, plan) in self.plans.iter().enumerate() {
            if self.armed & 1 << i != 0 {
                tracing::debug!(reservation = %plan.id, "the call was dropped before its answer: cancelling");
                self.cancels.push(plan.id.clone(), self.life(plan));
            }
        }
    }
}

impl<S: Store> Resilient<S> {
    /// `store` behind the layers `settings` configure.
    pub(super) fn new(store: S, settings: &EngineSettings) -> Self {
        Resilient {
            store,
            breaker: Breaker::new(settings.breaker),
            // Degraded decisions queue no alerts: nothing would send them.
            local: MemoryStore::new(
                Keys::new(DEFAULT_PREFIX).expect("the default prefix is valid"),
                Retention {
                    alert_queue: 0,
                    ..settings.retention
                },
            ),
            cancels: Cancellations::default(),
            policy: settings.policy,
            replicas: settings.replicas,
            record_ms: settings.retention.record_ms,
        }
    }

    /// The store itself, for callers that describe it or read its ledger.
    pub(super) fn store(&self) -> &S {
        &self.store
    }

    /// The breaker in front of the store.
    pub(super) fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The failure policy.
    pub(super) fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The store's clock (µs), or this replica's for a local reservation.
    pub(super) fn now_us(&self, local: bool) -> i64 {
        match local {
            true => self.local.now_us(),
            false => self.store.now_us(),
        }
    }

    /// Runs one store call through the breaker, timing it. An open breaker
    /// fails the call at once.
    pub(super) async fn call<T>(
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
        let elapsed = started.elapsed();
        telemetry::store_call(op, elapsed.as_secs_f64(), kind);
        telemetry::traces::store_time(elapsed);
        telemetry::breaker(self.breaker.state());
        result
    }

    /// True when `error` is decided around (from this replica's memory) rather
    /// than answered: the store is unreachable and the policy is not
    /// `fail_closed`. Says so in the log and the metrics.
    fn degrades(&self, error: &StoreError) -> bool {
        let degrades = error.is_transient() && self.policy != FailurePolicy::FailClosed;
        if degrades {
            warn_degraded(self.policy.as_str(), &error.to_string());
            telemetry::degraded(self.policy.as_str());
        }
        degrades
    }

    /// What the local store enforces of `levels` while the store is
    /// unavailable: each limit divided by the replica count (`local`), or
    /// none at all (`fail_open`).
    pub(super) fn local_levels(&self, levels: &[LevelPlan]) -> Vec<LevelPlan> {
        match self.policy {
            FailurePolicy::FailOpen => Vec::new(),
            _ => levels.iter().map(|l| l.scaled(self.replicas)).collect(),
        }
    }

    /// A plan for the local store; its id marks the reservation local.
    fn local_plan(&self, plan: &ReservePlan) -> ReservePlan {
        ReservePlan {
            id: crate::domain::ReservationId {
                local: true,
                ..plan.id.clone()
            },
            idempotency_key: None,
            levels: self.local_levels(&plan.levels),
            ..plan.clone()
        }
    }

    /// Reserves the first of `plans` with room (one plan: the store's
    /// `reserve`; several: its `reserve_first`, one script call on Redis).
    /// Until the caller has its answer, a reservation the store may have made
    /// is cancelled if this call is dropped (a client deadline, a reset
    /// stream); with an idempotency key, the caller's retry returns it. When
    /// the store fails, the failure policy decides: an error, or the local
    /// store's decision of the local plans.
    pub(super) async fn reserve(
        &self,
        plans: PerCandidate<ReservePlan>,
    ) -> Result<Reserved<'_>, StoreError> {
        // Armed before the call: dropped while it is awaited, the reply
        // unknown, any of the plans may be the reservation made.
        let armed = plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.idempotency_key.is_none())
            .fold(0, |mask, (i, _)| mask | 1 << i);
        let mut reserved = Reserved {
            plans,
            replies: PerCandidate::new(),
            degraded: false,
            armed,
            cancels: &self.cancels,
            record_ms: self.record_ms,
        };
        let replies = match reserved.plans.as_slice() {
            [] => Ok(PerCandidate::new()),
            [plan] => self
                .call("reserve", self.store.reserve(plan))
                .await
                .map(|reply| smallvec::smallvec![reply]),
            several => self
                .call("reserve", self.store.reserve_first(several))
                .await
                .map(PerCandidate::from_vec),
        };
        let error = match replies {
            Ok(replies) => {
                // Answered: only a reservation made is still the caller's to
                // lose, until its answer is out.
                let made = replies
                    .last()
                    .is_some_and(|r| matches!(r, crate::store::ReserveReply::Allowed { .. }));
                reserved.armed &= match made {
                    true => 1 << (replies.len() - 1),
                    false => 0,
                };
                reserved.replies = replies;
                return Ok(reserved);
            }
            Err(e) => e,
        };
        // Refused by the breaker, or answered with an error (nothing ran), or
        // queued for cancellation just below.
        reserved.armed = 0;
        if matches!(error, StoreError::Unanswered(_) | StoreError::Protocol(_)) {
            // The script may have run, or still run (a frozen store runs it
            // when it wakes), and the caller will not get the reservation:
            // cancel it. Under fail_closed a caller with an idempotency key
            // retries with it and gets it back instead.
            for plan in &reserved.plans {
                if plan.idempotency_key.is_none() || self.policy != FailurePolicy::FailClosed {
                    self.cancels.push(plan.id.clone(), reserved.life(plan));
                }
            }
        }
        if !self.degrades(&error) {
            return Err(error);
        }
        reserved.plans = reserved.plans.iter().map(|p| self.local_plan(p)).collect();
        reserved.replies = match reserved.plans.as_slice() {
            [plan] => smallvec::smallvec![self.local.reserve(plan).await?],
            several => PerCandidate::from_vec(self.local.reserve_first(several).await?),
        };
        reserved.degraded = true;
        Ok(reserved)
    }

    /// The readings of `levels` for `scope` (`full`: with every lease), and
    /// the levels they are of: from this replica's memory, the levels it
    /// enforces, when degraded (true).
    pub(super) async fn status(
        &self,
        scope: Scope<'_>,
        levels: Vec<LevelPlan>,
        full: bool,
    ) -> Result<(Vec<LevelPlan>, Vec<Reading>, bool), StoreError> {
        match self
            .call("status", self.store.status(scope, &levels, full))
            .await
        {
            Ok(readings) => Ok((levels, readings, false)),
            Err(e) if self.degrades_quietly(&e) => {
                let local = self.local_levels(&levels);
                let readings = self.local.status(scope, &local, full).await?;
                Ok((local, readings, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Like [`Self::degrades`], without saying so: a read is not a decision.
    fn degrades_quietly(&self, error: &StoreError) -> bool {
        error.is_transient() && self.policy != FailurePolicy::FailClosed
    }

    /// Charges `charge` (no reservation); degraded, the local store charges
    /// the plan it enforces. The plan the reply is of, the reply, and whether
    /// degraded.
    pub(super) async fn charge(
        &self,
        charge: ChargePlan,
    ) -> Result<(ChargePlan, ChargeReply, bool), StoreError> {
        match self.call("charge", self.store.charge(&charge)).await {
            Ok(reply) => Ok((charge, reply, false)),
            Err(e) if self.degrades(&e) => {
                let local = ChargePlan {
                    levels: self.local_levels(&charge.levels),
                    ..charge
                };
                let reply = self.local.charge(&local).await?;
                Ok((local, reply, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Commits a reservation where it was made.
    pub(super) async fn commit(
        &self,
        s: Settlement<'_>,
        usage: Usage,
    ) -> Result<SettleReply, StoreError> {
        match s.id.local {
            true => self.local.commit(s, usage).await,
            false => self.call("commit", self.store.commit(s, usage)).await,
        }
    }

    /// Refunds a reservation where it was made.
    pub(super) async fn refund(&self, s: Settlement<'_>) -> Result<SettleReply, StoreError> {
        match s.id.local {
            true => self.local.refund(s).await,
            false => self.call("refund", self.store.refund(s)).await,
        }
    }

    /// Renews a reservation's lease where it was made.
    pub(super) async fn renew(
        &self,
        s: Settlement<'_>,
        ttl_ms: u64,
    ) -> Result<RenewReply, StoreError> {
        match s.id.local {
            true => self.local.renew(s, ttl_ms).await,
            false => self.call("renew", self.store.renew(s, ttl_ms)).await,
        }
    }

    /// Probes the store when the breaker is open and its cool-down has
    /// passed. True when a probe ran.
    pub(super) async fn probe_if_due(&self) -> bool {
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

    /// True while the breaker lets calls through.
    pub(super) fn healthy(&self) -> bool {
        self.breaker.state() == BreakerState::Closed
    }
}
