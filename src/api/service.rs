//! The `ctxbudget.v1.BudgetService` implementation: validate (every field
//! parsed by `convert`, once), call the engine, convert back, time the call.
//!
//! Engine calls are awaited boxed: an engine future is a few KB, and each layer
//! above it (the handler's block, `timed`, tonic's boxed future) would hold and
//! copy it again; boxed, it is copied once.

use super::http::HttpAnswer;
use super::{auth, candidates, convert};
use crate::domain::ReservationId;
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
    /// Serves `engine`. Callers are authenticated in front of it
    /// ([`auth::interceptor`]); the handlers check tenants.
    pub fn new(engine: Arc<Engine<S>>) -> Self {
        BudgetApi { engine }
    }
}

/// PERMISSION_DENIED unless the authenticated caller may act for the tenant
/// the request names (when it names one).
fn admit<T>(request: &Request<T>, tenant: Option<&str>) -> Result<(), Status> {
    match tenant {
        Some(t) => auth::check_tenant(request, t),
        None => Ok(()),
    }
}

/// The tenant a reservation id names, if it parses (a malformed id is the
/// engine's INVALID_ARGUMENT to give, once the caller is authenticated).
fn tenant_of(reservation_id: &str) -> Option<String> {
    ReservationId::parse(reservation_id)
        .ok()
        .map(|id| id.tenant.to_string())
}

/// The span every log line of one RPC carries: the RPC's name and, for calls
/// about a reservation, its id (CheckAndReserve records it once it has one).
/// A malformed id is cut short: logs stay bounded whatever a client sends.
pub(crate) fn span(rpc: &'static str, reservation: Option<&str>) -> tracing::Span {
    let span = tracing::info_span!("rpc", rpc, reservation = tracing::field::Empty);
    if let Some(id) = reservation {
        let shown = match id.char_indices().nth(MAX_LOGGED_ID) {
            Some((end, _)) => &id[..end],
            None => id,
        };
        span.record("reservation", shown);
    }
    span
}

/// Longest reservation id written to a log (valid ids are far shorter).
const MAX_LOGGED_ID: usize = 160;

/// Runs one RPC body in its span, records its duration and code, and maps errors.
async fn timed<T>(
    rpc: &'static str,
    span: tracing::Span,
    body: impl Future<Output = Result<T, EngineError>>,
) -> Result<Response<T>, Status> {
    timed_with(rpc, span, body).await
}

/// [`timed`] for a body whose errors are statuses already, or become them.
pub(crate) async fn timed_with<T, E: Into<Status>>(
    rpc: &'static str,
    span: tracing::Span,
    body: impl Future<Output = Result<T, E>>,
) -> Result<Response<T>, Status> {
    use tracing::Instrument;
    let started = Instant::now();
    let result = body.instrument(span.clone()).await.map_err(Into::into);
    // No await below: the guard cannot cross one.
    let _entered = span.enter();
    let code = result
        .as_ref()
        .map_or_else(Status::code, |_| tonic::Code::Ok);
    telemetry::rpc(rpc, code, started.elapsed().as_secs_f64());
    if let Err(status) = &result {
        tracing::debug!(code = ?status.code(), message = status.message(), "rpc failed");
    }
    result.map(Response::new)
}

/// A CheckAndReserve answered: the response, and for the HTTP API how HTTP
/// states it.
pub struct Reserved {
    /// The response.
    pub response: pb::CheckAndReserveResponse,
    /// Its HTTP status and headers (docs/http.md), when asked for.
    pub http: Option<HttpAnswer>,
}

impl<S: Store> BudgetApi<S> {
    /// CheckAndReserve, for gRPC (`http` false) or the HTTP API, which also
    /// needs the answer's HTTP status and headers: made from the decision
    /// here, where the limits are still the domain's.
    pub async fn reserve(
        &self,
        request: Request<pb::CheckAndReserveRequest>,
        http: bool,
    ) -> Result<Response<Reserved>, Status> {
        admit(&request, Some(&request.get_ref().tenant_id))?;
        timed("CheckAndReserve", span("CheckAndReserve", None), async {
            let mut r = request.into_inner();
            // Candidates named: the response says which was chosen.
            let named = !r.candidate_models.is_empty();
            let fallbacks = candidates::fallbacks(&mut r)?;
            let mut req = convert::reserve_request(r)?;
            req.fallbacks = fallbacks;
            let out = Box::pin(self.engine.reserve(req)).await?;
            let http = http.then(|| HttpAnswer::of(&out));
            let response = match named {
                true => candidates::fallback_response(out),
                false => convert::reserve_response(out),
            };
            Ok(Reserved { response, http })
        })
        .await
    }
}

#[tonic::async_trait]
impl<S: Store> BudgetService for BudgetApi<S> {
    async fn check_and_reserve(
        &self,
        request: Request<pb::CheckAndReserveRequest>,
    ) -> Result<Response<pb::CheckAndReserveResponse>, Status> {
        let reserved = self.reserve(request, false).await?;
        Ok(reserved.map(|r| r.response))
    }

    async fn commit(
        &self,
        request: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        let tenant = tenant_of(&request.get_ref().reservation_id);
        admit(&request, tenant.as_deref())?;
        let span = span("Commit", Some(&request.get_ref().reservation_id));
        timed("Commit", span, async {
            let req = convert::commit_request(request.into_inner())?;
            let c = Box::pin(self.engine.commit(req)).await?;
            tracing::debug!(outcome = ?c.outcome, token_delta = c.token_delta, "commit");
            Ok(convert::commit_response(c))
        })
        .await
    }

    async fn refund(
        &self,
        request: Request<pb::RefundRequest>,
    ) -> Result<Response<pb::RefundResponse>, Status> {
        let tenant = tenant_of(&request.get_ref().reservation_id);
        admit(&request, tenant.as_deref())?;
        let span = span("Refund", Some(&request.get_ref().reservation_id));
        timed("Refund", span, async {
            let id = ReservationId::parse(&request.get_ref().reservation_id)?;
            let r = Box::pin(self.engine.refund(&id)).await?;
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

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let tenant = tenant_of(&request.get_ref().reservation_id);
        admit(&request, tenant.as_deref())?;
        let span = span("RenewLease", Some(&request.get_ref().reservation_id));
        timed("RenewLease", span, async {
            let r = request.get_ref();
            let id = ReservationId::parse(&r.reservation_id)?;
            let r = Box::pin(self.engine.renew(&id, r.lease_ttl_ms)).await?;
            tracing::debug!(outcome = ?r.outcome, expires_in_ms = r.expires_in_ms, "renew");
            Ok(convert::renew_response(r))
        })
        .await
    }

    async fn get_estimator(
        &self,
        request: Request<pb::GetEstimatorRequest>,
    ) -> Result<Response<pb::GetEstimatorResponse>, Status> {
        admit(&request, None)?;
        timed("GetEstimator", span("GetEstimator", None), async {
            let model = convert::optional_model(request.into_inner().model)?;
            let views = Box::pin(self.engine.estimators(model.as_deref())).await?;
            Ok(convert::estimator_response(views))
        })
        .await
    }

    async fn get_status(
        &self,
        request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        admit(&request, Some(&request.get_ref().tenant_id))?;
        timed("GetStatus", span("GetStatus", None), async {
            let req = convert::status_request(request.into_inner())?;
            let out = Box::pin(self.engine.status(&req)).await?;
            Ok(convert::status_response(out))
        })
        .await
    }
}
