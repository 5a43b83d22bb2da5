//! The `ctxbudget.v1.BudgetService` implementation: validate, call the engine,
//! convert back, time the call.

use super::{convert, to_status};
use crate::domain::TenantId;
use crate::engine::{Engine, EngineError};
use crate::pb;
use crate::pb::budget_service_server::BudgetService;
use crate::store::Store;
use crate::telemetry;
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status};

/// The gRPC face of an [`Engine`].
pub struct BudgetApi<S> {
    engine: Arc<Engine<S>>,
}

impl<S> BudgetApi<S> {
    /// Serves `engine`.
    pub fn new(engine: Arc<Engine<S>>) -> Self {
        BudgetApi { engine }
    }
}

/// The last 8 characters of a reservation id: enough to match log lines, not
/// enough to settle someone else's reservation (the id works as a bearer token).
fn short_id(id: &str) -> &str {
    let start = id.len().saturating_sub(8);
    id.get(start..).unwrap_or("")
}

/// Runs one RPC body, records its duration and code, and maps errors.
async fn timed<T>(
    rpc: &'static str,
    body: impl Future<Output = Result<T, EngineError>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = body.await.map_err(to_status);
    let code = result
        .as_ref()
        .map_or_else(Status::code, |_| tonic::Code::Ok);
    telemetry::rpc(rpc, code, started.elapsed().as_secs_f64());
    if let Err(status) = &result {
        tracing::debug!(rpc, code = ?status.code(), message = status.message(), "rpc failed");
    }
    result.map(Response::new)
}

#[tonic::async_trait]
impl<S: Store> BudgetService for BudgetApi<S> {
    async fn check_and_reserve(
        &self,
        request: Request<pb::CheckAndReserveRequest>,
    ) -> Result<Response<pb::CheckAndReserveResponse>, Status> {
        timed("CheckAndReserve", async {
            let req = convert::reserve_request(request.into_inner())?;
            let out = self.engine.reserve(req).await?;
            Ok(convert::reserve_response(out))
        })
        .await
    }

    async fn commit(
        &self,
        request: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        timed("Commit", async {
            let r = request.into_inner();
            let c = self
                .engine
                .commit(&r.reservation_id, r.prompt_tokens, r.completion_tokens)
                .await?;
            tracing::debug!(
                reservation = %short_id(&r.reservation_id),
                outcome = ?c.outcome,
                token_delta = c.token_delta,
                "commit"
            );
            Ok(pb::CommitResponse {
                outcome: convert::outcome(c.outcome) as i32,
                token_delta: c.token_delta,
                estimation_ratio: c.estimation_ratio,
                estimation_error_tokens: c.estimation_error_tokens,
            })
        })
        .await
    }

    async fn refund(
        &self,
        request: Request<pb::RefundRequest>,
    ) -> Result<Response<pb::RefundResponse>, Status> {
        timed("Refund", async {
            let r = request.into_inner();
            let (outcome, refunded_tokens) = self.engine.refund(&r.reservation_id).await?;
            tracing::debug!(reservation = %short_id(&r.reservation_id), ?outcome, refunded_tokens, "refund");
            Ok(pb::RefundResponse {
                outcome: convert::outcome(outcome) as i32,
                refunded_tokens,
            })
        })
        .await
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        timed("RenewLease", async {
            let r = request.into_inner();
            let (outcome, expires_in_ms) =
                self.engine.renew(&r.reservation_id, r.lease_ttl_ms).await?;
            Ok(pb::RenewLeaseResponse {
                outcome: convert::outcome(outcome) as i32,
                expires_in_ms,
            })
        })
        .await
    }

    async fn get_estimator(
        &self,
        request: Request<pb::GetEstimatorRequest>,
    ) -> Result<Response<pb::GetEstimatorResponse>, Status> {
        timed("GetEstimator", async {
            let r = request.into_inner();
            let model = (!r.model.is_empty()).then_some(r.model.as_str());
            let views = self.engine.estimators(model).await?;
            Ok(convert::estimator_response(views))
        })
        .await
    }

    async fn get_status(
        &self,
        request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        timed("GetStatus", async {
            let r = request.into_inner();
            let tenant = TenantId::parse(&r.tenant_id)?;
            let user = convert::optional_user(&r.user_id)?;
            convert::check_tier(&r.tier)?;
            let out = self.engine.status(&tenant, user.as_ref(), &r.tier).await?;
            Ok(convert::status_response(out))
        })
        .await
    }
}
