//! The `ctxbudget.v1.BudgetService` RPCs over the [`App`]: each message
//! converted to the domain's request once (`convert`), the operation run for
//! the caller, the outcome converted back once. The HTTP API calls the same
//! methods with the messages it read as JSON; the tonic service below adds
//! only the caller from the request's extensions and the error's `Status`.

use super::caller::caller_of;
use super::{candidates, convert};
use crate::app::{App, AppError, Caller, Slot, span, timed};
use crate::domain::ReservationId;
use crate::engine::ReserveOutcome;
use crate::pb;
use crate::pb::budget_service_server::BudgetService;
use crate::store::Store;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The BudgetService RPCs of an [`App`].
pub struct BudgetApi<S> {
    app: Arc<App<S>>,
}

impl<S> BudgetApi<S> {
    /// Serves `app`. Callers are authenticated in front of it
    /// ([`super::interceptor`], or the HTTP API's headers).
    pub fn new(app: Arc<App<S>>) -> Self {
        BudgetApi { app }
    }
}

impl<S: Store> BudgetApi<S> {
    /// CheckAndReserve for `caller`, holding `slot` of the admission gate
    /// (given back while it waits in line); `also` reads the outcome before
    /// it becomes the response (the HTTP API's status and headers, made
    /// while the limits are still the domain's).
    pub async fn check_and_reserve<A>(
        &self,
        caller: Option<&Caller>,
        slot: Option<&Slot>,
        mut r: pb::CheckAndReserveRequest,
        also: impl FnOnce(&ReserveOutcome) -> A,
    ) -> Result<(pb::CheckAndReserveResponse, A), AppError> {
        timed("CheckAndReserve", span("CheckAndReserve", None), async {
            // Candidates named: the response says which was chosen.
            let named = !r.candidate_models.is_empty();
            let fallbacks = candidates::fallbacks(&mut r)?;
            let max_wait = convert::max_wait(r.max_wait_ms)?;
            let mut req = convert::reserve_request(r)?;
            req.fallbacks = fallbacks;
            let out = self.app.reserve(caller, req, max_wait, slot).await?;
            let also = also(&out);
            let response = match named {
                true => candidates::fallback_response(out),
                false => convert::reserve_response(out),
            };
            Ok((response, also))
        })
        .await
    }

    /// Commit for `caller`.
    pub async fn commit(
        &self,
        caller: Option<&Caller>,
        r: pb::CommitRequest,
    ) -> Result<pb::CommitResponse, AppError> {
        let span = span("Commit", Some(&r.reservation_id));
        timed("Commit", span, async {
            let req = convert::commit_request(r)?;
            let c = self.app.commit(caller, req).await?;
            tracing::debug!(outcome = ?c.outcome, token_delta = c.token_delta, "commit");
            Ok(convert::commit_response(c))
        })
        .await
    }

    /// Refund for `caller`.
    pub async fn refund(
        &self,
        caller: Option<&Caller>,
        r: pb::RefundRequest,
    ) -> Result<pb::RefundResponse, AppError> {
        let span = span("Refund", Some(&r.reservation_id));
        timed("Refund", span, async {
            let id = ReservationId::parse(&r.reservation_id)?;
            let r = self.app.refund(caller, &id).await?;
            tracing::debug!(
                outcome = ?r.outcome,
                refunded_tokens = r.refunded_tokens,
                cost_micros = r.cost_micros,
                "refund"
            );
            Ok(convert::refund_response(r))
        })
        .await
    }

    /// RenewLease for `caller`.
    pub async fn renew_lease(
        &self,
        caller: Option<&Caller>,
        r: pb::RenewLeaseRequest,
    ) -> Result<pb::RenewLeaseResponse, AppError> {
        let span = span("RenewLease", Some(&r.reservation_id));
        timed("RenewLease", span, async {
            let id = ReservationId::parse(&r.reservation_id)?;
            let r = self.app.renew(caller, &id, r.lease_ttl_ms).await?;
            tracing::debug!(outcome = ?r.outcome, expires_in_ms = r.expires_in_ms, "renew");
            Ok(convert::renew_response(r))
        })
        .await
    }

    /// GetEstimator (any authenticated caller).
    pub async fn get_estimator(
        &self,
        r: pb::GetEstimatorRequest,
    ) -> Result<pb::GetEstimatorResponse, AppError> {
        timed("GetEstimator", span("GetEstimator", None), async {
            let model = convert::optional_model(r.model)?;
            let views = self.app.estimators(model.as_deref()).await?;
            Ok(convert::estimator_response(views))
        })
        .await
    }

    /// GetStatus for `caller`.
    pub async fn get_status(
        &self,
        caller: Option<&Caller>,
        r: pb::GetStatusRequest,
    ) -> Result<pb::GetStatusResponse, AppError> {
        timed("GetStatus", span("GetStatus", None), async {
            let req = convert::status_request(r)?;
            let out = self.app.status(caller, &req).await?;
            Ok(convert::status_response(out))
        })
        .await
    }
}

/// A gRPC answer: the response, or the error's status.
fn answer<T>(result: Result<T, AppError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl<S: Store> BudgetService for BudgetApi<S> {
    async fn check_and_reserve(
        &self,
        request: Request<pb::CheckAndReserveRequest>,
    ) -> Result<Response<pb::CheckAndReserveResponse>, Status> {
        let (_, extensions, r) = request.into_parts();
        let slot = extensions.get::<Arc<Slot>>().map(|s| &**s);
        let reserved = self
            .check_and_reserve(caller_of(&extensions), slot, r, |_| ())
            .await;
        answer(reserved.map(|(response, ())| response))
    }

    async fn commit(
        &self,
        request: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        let (_, extensions, r) = request.into_parts();
        answer(self.commit(caller_of(&extensions), r).await)
    }

    async fn refund(
        &self,
        request: Request<pb::RefundRequest>,
    ) -> Result<Response<pb::RefundResponse>, Status> {
        let (_, extensions, r) = request.into_parts();
        answer(self.refund(caller_of(&extensions), r).await)
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let (_, extensions, r) = request.into_parts();
        answer(self.renew_lease(caller_of(&extensions), r).await)
    }

    async fn get_estimator(
        &self,
        request: Request<pb::GetEstimatorRequest>,
    ) -> Result<Response<pb::GetEstimatorResponse>, Status> {
        answer(self.get_estimator(request.into_inner()).await)
    }

    async fn get_status(
        &self,
        request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        let (_, extensions, r) = request.into_parts();
        answer(self.get_status(caller_of(&extensions), r).await)
    }
}
