//! What the HTTP API answers, in one place: JSON bodies, request bodies read
//! within their bound, and every error of the application mapped to its HTTP
//! status with a JSON error that says what to do (docs/http-api.md#errors).

use crate::api::http::error_status;
use crate::app::{AppError, ErrorKind};
use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `value` as a JSON body with `status`.
pub(super) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(e) => error(AppError::internal(format!(
            "cannot write the answer as JSON: {e}; report this to the operator"
        ))),
    }
}

/// The JSON error of `e`: `{"error": {"code", "status", "message"}}` with
/// the HTTP status of its kind (`api::http::error_status`), `Retry-After`
/// when retrying helps and `WWW-Authenticate` when a token is missing.
pub(super) fn error(e: AppError) -> Response {
    let http =
        StatusCode::from_u16(error_status(e.kind())).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({
        "error": {
            "code": http.as_u16(),
            "status": e.kind().code_name(),
            "message": e.message(),
        }
    });
    let mut response = json(http, &body);
    let headers = response.headers_mut();
    let retry_ms = match e.kind() {
        ErrorKind::Exhausted => Some(e.retry_after_ms().unwrap_or(1000)),
        ErrorKind::Unavailable => Some(e.retry_after_ms().unwrap_or(1000)),
        _ => e.retry_after_ms(),
    };
    if let Some(ms) = retry_ms {
        headers.insert(header::RETRY_AFTER, ms.div_ceil(1000).max(1).into());
    }
    if e.kind() == ErrorKind::Unauthenticated {
        headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// How long a request body may take to arrive.
const BODY_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The request body, read — after the caller was authenticated — within
/// `limit` bytes and [`BODY_WITHIN`]: OUT_OF_RANGE (413) past the limit,
/// whether the length was announced or not.
pub(super) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, AppError> {
    let announced: Option<u64> = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let too_large = |found| AppError::too_large(found, limit);
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(too_large(announced));
    }
    let read = Limited::new(body, limit).collect();
    match tokio::time::timeout(BODY_WITHIN, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large(announced)),
        Ok(Err(e)) => Err(AppError::invalid(format!(
            "cannot read the request body: {e}"
        ))),
        Err(_) => Err(AppError::new(
            ErrorKind::DeadlineExceeded,
            format!(
                "the request body did not arrive within {} s; nothing was done: send it whole",
                BODY_WITHIN.as_secs()
            ),
        )),
    }
}

/// `bytes` as a `T` in protobuf's JSON mapping (`what` names it in errors);
/// an empty body is `{}`.
pub(super) fn parse<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, AppError> {
    let text: &[u8] = match bytes.iter().all(u8::is_ascii_whitespace) {
        true => b"{}",
        false => bytes,
    };
    serde_json::from_slice(text).map_err(|e| {
        AppError::invalid(format!(
            "the body is not a {what} in protobuf's JSON mapping: {e}; send a JSON object \
             of its fields (lowerCamelCase or the proto's names, enums as names, 64-bit \
             integers as numbers or strings), see docs/http-api.md"
        ))
    })
}

/// 404 for a path no route serves.
pub(super) async fn no_route(uri: axum::http::Uri) -> Response {
    error(AppError::not_found(format!(
        "no route {}: the API is POST /v1/check-and-reserve, /v1/commit, /v1/refund, \
         /v1/renew-lease, /v1/get-status and /v1/get-estimator; the admin API is under \
         /admin/v1/, the console at /console, the API's description at /openapi.json \
         (docs/http-api.md)",
        uri.path()
    )))
}

/// 405 for a method a route does not take.
pub(super) async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let mut response = error(AppError::new(
        ErrorKind::Unsupported,
        format!(
            "{method} {} is not served: the RPCs take POST with a JSON body; see /openapi.json \
         for each route's methods (docs/http-api.md)",
            uri.path()
        ),
    ));
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

/// Paging and search of a list.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Page {
    /// Only names containing this (case-insensitive).
    #[serde(default)]
    pub(super) search: Option<String>,
    /// Items to skip.
    #[serde(default)]
    pub(super) offset: usize,
    /// Items to return (at most 1000; default 100).
    #[serde(default)]
    pub(super) limit: Option<usize>,
}

impl Page {
    /// The page of `items` (name, value) this asks for, and how many match.
    pub(super) fn of<T>(
        &self,
        items: impl Iterator<Item = (String, T)>,
    ) -> (usize, Vec<(String, T)>) {
        let needle = self.search.as_deref().unwrap_or("").to_lowercase();
        let matching: Vec<(String, T)> = items
            .filter(|(name, _)| needle.is_empty() || name.to_lowercase().contains(&needle))
            .collect();
        let total = matching.len();
        let limit = self.limit.unwrap_or(100).clamp(1, 1000);
        (
            total,
            matching.into_iter().skip(self.offset).take(limit).collect(),
        )
    }
}

/// A path's segments, or INVALID_ARGUMENT (after the caller was checked).
pub(super) fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, AppError> {
    p.map(|Path(t)| t)
        .map_err(|e| AppError::invalid(format!("the path: {}", e.body_text())))
}

/// A query string as `T`, or INVALID_ARGUMENT saying what it takes.
pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>, takes: &str) -> Result<T, AppError> {
    q.map(|Query(t)| t)
        .map_err(|e| AppError::invalid(format!("{}; it takes {takes}", e.body_text())))
}
