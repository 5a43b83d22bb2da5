//! Configuration versions over HTTP: the `ETag` a read answers (the
//! configuration version it read) and the precondition a write states
//! (`If-Match`, `If-None-Match`), for the admin API's documents.

use crate::admin::Precondition;
use crate::app::AppError;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;

/// `body` with an `ETag` of configuration version `version`.
pub(super) fn tagged(mut response: Response, version: u64) -> Response {
    if let Ok(v) = HeaderValue::from_str(&format!("\"{version}\"")) {
        response.headers_mut().insert(header::ETAG, v);
    }
    response
}

/// What the writer requires: `If-Match` naming a version (`"7"`, `W/"7"`
/// or `7`: unchanged since) or `*` (exists), or `If-None-Match: *` (does not
/// exist yet); neither: nothing.
pub(super) fn precondition(headers: &HeaderMap) -> Result<Precondition, AppError> {
    let value = |name| headers.get(name).map(|v| v.to_str().unwrap_or("?").trim());
    match (value(header::IF_MATCH), value(header::IF_NONE_MATCH)) {
        (Some(_), Some(_)) => Err(AppError::invalid(
            "send If-Match or If-None-Match, not both",
        )),
        (None, None) => Ok(Precondition::None),
        (None, Some("*")) => Ok(Precondition::Absent),
        (None, Some(other)) => Err(AppError::invalid(format!(
            "If-None-Match {other:?}: only `*` (create, never replace) is taken"
        ))),
        (Some("*"), None) => Ok(Precondition::Exists),
        (Some(text), None) => {
            let bare = text.trim_start_matches("W/").trim_matches('"');
            bare.parse().map(Precondition::Unchanged).map_err(|_| {
                AppError::invalid(format!(
                    "If-Match {text:?} is not a configuration version: send the ETag a GET \
                     answered (\"7\")"
                ))
            })
        }
    }
}
