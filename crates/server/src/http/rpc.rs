//! `POST /v1/<rpc>`: each `BudgetService` RPC, its request and response in
//! protobuf's JSON mapping. A call is authenticated on its headers by the
//! application's tokens, a CheckAndReserve takes a slot of the shared
//! admission gate, and only then is the body read and the RPC run by the
//! same [`crate::api::BudgetApi`] methods gRPC's service calls: an
//! unauthenticated caller cannot make the server buffer a body. A
//! CheckAndReserve that is denied answers its JSON with the denial's status
//! and headers (docs/http.md). A request's W3C `traceparent` makes its
//! operation's span a child of the caller's trace.

use super::HttpState;
use super::reply::{error, json, parse, read_body};
use crate::api::http::HttpAnswer;
use crate::app::{AppError, Caller, Slot, trace};
use crate::pb;
use crate::store::Store;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;

type St<S> = State<Arc<HttpState<S>>>;

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

/// The caller behind the `authorization` header, or UNAUTHENTICATED.
pub(super) fn caller<S>(
    state: &HttpState<S>,
    headers: &HeaderMap,
) -> Result<Option<Caller>, AppError> {
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    state.app.auth().authenticate(header)
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
    F: FnOnce(Option<Caller>, Req) -> Fut,
    Fut: Future<Output = Result<Resp, AppError>>,
{
    let run = async {
        let caller = caller(state, headers)?;
        let message: Req = parse(&read_body(raw, headers, state.max_body).await?, what)?;
        call(caller, message).await
    };
    match trace::within(trace::parent_of(headers), run).await {
        Ok(response) => json(StatusCode::OK, &response),
        Err(e) => error(e),
    }
}

async fn check_and_reserve<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    raw: Body,
) -> Response {
    let run = async {
        let caller = caller(&state, &headers)?;
        let slot = Slot::new(state.app.gate().admit(None).await?);
        let bytes = read_body(raw, &headers, state.max_body).await?;
        let message: pb::CheckAndReserveRequest = parse(&bytes, "CheckAndReserveRequest")?;
        state
            .api
            .check_and_reserve(caller.as_ref(), Some(&slot), message, HttpAnswer::of)
            .await
    };
    let (reserved, http) = match trace::within(trace::parent_of(&headers), run).await {
        Ok(answered) => answered,
        Err(e) => return error(e),
    };
    let status = StatusCode::from_u16(http.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut response = json(status, &reserved);
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
    let call = |caller: Option<Caller>, r| async move { api.commit(caller.as_ref(), r).await };
    unary(&state, &headers, raw, "CommitRequest", call).await
}

async fn refund<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    let call = |caller: Option<Caller>, r| async move { api.refund(caller.as_ref(), r).await };
    unary(&state, &headers, raw, "RefundRequest", call).await
}

async fn renew_lease<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    let call = |caller: Option<Caller>, r| async move { api.renew_lease(caller.as_ref(), r).await };
    unary(&state, &headers, raw, "RenewLeaseRequest", call).await
}

async fn get_status<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    let call = |caller: Option<Caller>, r| async move { api.get_status(caller.as_ref(), r).await };
    unary(&state, &headers, raw, "GetStatusRequest", call).await
}

async fn get_estimator<S: Store>(State(state): St<S>, headers: HeaderMap, raw: Body) -> Response {
    let api = state.api.clone();
    let call = |_: Option<Caller>, r| async move { api.get_estimator(r).await };
    unary(&state, &headers, raw, "GetEstimatorRequest", call).await
}
