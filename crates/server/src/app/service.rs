//! [`App`]: every operation a front door may ask of the engine, for a
//! caller. Each checks the caller's tenant binding before the engine sees
//! the request (a reservation's tenant is in its id), so no front door can
//! forget it, and answers the engine's outcome or an [`AppError`].
//!
//! Engine calls are awaited boxed: an engine future is a few KB, and each
//! layer above it would hold and copy it again; boxed, it is copied once.

use super::admission::{Gate, Slot};
use super::caller::{Auth, Caller, check_tenant};
use super::error::AppError;
use crate::domain::ReservationId;
use crate::domain::plan::ReserveRequest;
use crate::engine::{
    ChargeInput, ChargeOutcome, CommitOutcome, CommitRequest, Engine, EstimatorView, RefundOutcome,
    RenewOutcome, ReserveOutcome, StatusOutcome, StatusRequest,
};
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;

/// The application over one engine: its callers' tokens, its admission gate,
/// and the operations.
pub struct App<S> {
    engine: Arc<Engine<S>>,
    auth: Arc<Auth>,
    gate: Arc<Gate>,
}

impl<S> App<S> {
    /// `engine`, for callers of `auth`, decisions admitted by `gate`.
    pub fn new(engine: Arc<Engine<S>>, auth: Arc<Auth>, gate: Arc<Gate>) -> Arc<Self> {
        Arc::new(App { engine, auth, gate })
    }

    /// The engine, for what is no caller's operation (the admin API's store
    /// reads, the live limits).
    pub fn engine(&self) -> &Arc<Engine<S>> {
        &self.engine
    }

    /// The accepted tokens: every front door authenticates by them.
    pub fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    /// The admission gate: every front door takes a decision's slot from it.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }
}

impl<S: Store> App<S> {
    /// CheckAndReserve: the decision on `req`, for `caller`, waiting in
    /// line up to `max_wait` when only the shared account denies it; the
    /// call's admission `slot` is given back while it waits.
    pub async fn reserve(
        &self,
        caller: Option<&Caller>,
        req: ReserveRequest,
        max_wait: Duration,
        slot: Option<&Slot>,
    ) -> Result<ReserveOutcome, AppError> {
        check_tenant(caller, req.tenant.as_str())?;
        super::trace::asked(req.tenant.as_str(), &req.tier);
        let waiting = || {
            if let Some(slot) = slot {
                slot.release();
            }
        };
        let out = Box::pin(self.engine.reserve_within(req, max_wait, waiting)).await?;
        super::trace::decided(&out);
        Ok(out)
    }

    /// Commit: settles `req.id` with the real usage.
    pub async fn commit(
        &self,
        caller: Option<&Caller>,
        req: CommitRequest,
    ) -> Result<CommitOutcome, AppError> {
        check_tenant(caller, req.id.tenant.as_str())?;
        super::trace::settling(&req.id, true);
        Ok(Box::pin(self.engine.commit(req)).await?)
    }

    /// Refund: returns what `id` holds.
    pub async fn refund(
        &self,
        caller: Option<&Caller>,
        id: &ReservationId,
    ) -> Result<RefundOutcome, AppError> {
        check_tenant(caller, id.tenant.as_str())?;
        super::trace::settling(id, true);
        Ok(Box::pin(self.engine.refund(id)).await?)
    }

    /// RenewLease: extends `id`'s lease by `lease_ttl_ms` (or the default).
    pub async fn renew(
        &self,
        caller: Option<&Caller>,
        id: &ReservationId,
        lease_ttl_ms: Option<u64>,
    ) -> Result<RenewOutcome, AppError> {
        check_tenant(caller, id.tenant.as_str())?;
        super::trace::settling(id, false);
        Ok(Box::pin(self.engine.renew(id, lease_ttl_ms)).await?)
    }

    /// GetStatus: the limits of `req`'s tenant (and user, session).
    pub async fn status(
        &self,
        caller: Option<&Caller>,
        req: &StatusRequest,
    ) -> Result<StatusOutcome, AppError> {
        check_tenant(caller, req.tenant.as_str())?;
        Ok(Box::pin(self.engine.status(req)).await?)
    }

    /// GetEstimator: the learned multipliers (of `model`, or all). Any
    /// authenticated caller may read them: they name no tenant.
    pub async fn estimators(&self, model: Option<&str>) -> Result<Vec<EstimatorView>, AppError> {
        Ok(Box::pin(self.engine.estimators(model)).await?)
    }

    /// May `caller` charge `tenant` on `tier`? The check of a charge, made
    /// for each of a call's charges before the first is taken (Envoy's
    /// descriptors: all or none).
    pub fn check_charge(
        &self,
        caller: Option<&Caller>,
        tenant: &str,
        tier: &str,
    ) -> Result<(), AppError> {
        check_tenant(caller, tenant)?;
        Ok(self.engine.check_tier(tier, tenant)?)
    }

    /// A charge of requests or tokens at every level of `input`'s tenant
    /// (Envoy's rate limit descriptors).
    pub async fn charge(
        &self,
        caller: Option<&Caller>,
        input: ChargeInput,
    ) -> Result<ChargeOutcome, AppError> {
        check_tenant(caller, input.tenant.as_str())?;
        Ok(Box::pin(self.engine.charge(input)).await?)
    }
}
