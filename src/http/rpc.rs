//! `POST /v1/<rpc>`: each `BudgetService` RPC, its request and response in
//! protobuf's JSON mapping. A call is authenticated on its headers (as the
//! gRPC interceptor does), a CheckAndReserve takes a slot of the shared
//! admission gate, and only then is the body read and the RPC run as on
//! gRPC: an unauthenticated caller cannot make the server buffer a body. A
//! CheckAndReserve that is denied answers its JSON with the denial's status
//! and headers (docs/http.md).

use super::HttpState;
use super::reply::{error, json, parse, read_body};
use crate::api::auth::Caller;
use crate::pb;
use crate::pb::budget_service_server::BudgetService;
use crate::store::Store;
use axum::Router;
use axum::body::Body as RawBody;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tonic::Status;

type St<S> = State<Arc<HttpState<S>>>;
type Body = RawBody;

/// The RPC routes.
pub(super) fn routes<S: Store>() -> Router<Arc<HttpState<S>>> {
    Router::new()
        .route("/v1/check-and-reserve", post(check_and_reserve::<S>))
        .route("/v1/commit", post(commit::<S>))
        .route("/v1/refund", post(refund::<S>))
        .route("/v1/renew-lease", post(renew_lease::<S>))
        .route("/v1/get-status", post(get_status::<S>))
        .route("/v1/get-estimator", post(get_estimator::<S>))
}

/// The caller behind the `authorization` header, or UNAUTHENTICATED
/// (counted as on gRPC).
pub(super) fn caller<S>(
    state: &HttpState<S>,
    headers: &HeaderMap,
) -> Result<Option<Caller>, Status> {
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    state
        .auth
        .authenticate_header(header)
        .inspect_err(|status| {
            crate::telemetry::auth_refused(status.code());
        })
}

/// `message` as the gRPC request the service takes, carrying `caller`.
fn request<T>(message: T, caller: Option<Caller>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    request
}

/// One RPC other than CheckAndReserve: authenticate, read the body as `Req`,
/// call, answer its JSON.
async fn unary<S, Req, Resp, F, Fut>(
    state: &HttpState<S>,
    headers: &HeaderMap,
    raw: Body,
    what: &str,
    call: F,
) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let run = async {
        let caller = caller(state, headers)?;
        let message: Req = parse(&read_body(raw, headers, state.max_body).await?, what)?;
        call(request(message, caller)).await
    };
    match run.await {
        Ok(response) => json(StatusCode::OK, response.get_ref()),
        Err(status) => error(status),
    }
}

async fn check_and_reserve<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    raw: Body,
) -> Response {
    let run = async {
        let caller = caller(&state, &headers)?;
        let _slot = state.gate.admit(None).await?;
        let bytes = read_body(raw, &headers, state.max_body).await?;
        let message: pb::CheckAndReserveRequest = parse(&bytes, "CheckAndReserveRequest")?;
        state.api.reserve(request(message, caller), true).await
    };
    let reserved = match run.await {
        Ok(reserved) => reserved.into_inner(),
        Err(status) => return error(status),
    };
    let http = reserved
        .http
        .unwrap_or_else(|| crate::api::http::HttpAnswer {
            status: 200,
            headers: Vec::new(),
        });
    let status = StatusCode::from_u16(http.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut response = json(status, &reserved.response);
    for (name, value) in http.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
    response
}

async fn commit<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    unary(
        &state,
        &headers,
        raw,
        "CommitRequest",
        |r: tonic::Request<pb::CommitRequest>| async move { api.commit(r).await },
    )
    .await
}

async fn refund<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    unary(
        &state,
        &headers,
        raw,
        "RefundRequest",
        |r: tonic::Request<pb::RefundRequest>| async move { api.refund(r).await },
    )
    .await
}

async fn renew_lease<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    unary(
        &state,
        &headers,
        raw,
        "RenewLeaseRequest",
        |r: tonic::Request<pb::RenewLeaseRequest>| async move { api.renew_lease(r).await },
    )
    .await
}

async fn get_status<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    unary(
        &state,
        &headers,
        raw,
        "GetStatusRequest",
        |r: tonic::Request<pb::GetStatusRequest>| async move { api.get_status(r).await },
    )
    .await
}

async fn get_estimator<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    unary(
        &state,
        &headers,
        raw,
        "GetEstimatorRequest",
        |r: tonic::Request<pb::GetEstimatorRequest>| async move { api.get_estimator(r).await },
    )
    .await
}
