//! `/admin/v1/…`: the live configuration over HTTP, for tools (a portal, a
//! billing system, Terraform) and the console. Every route takes an admin
//! token (`role = "admin"`); a caller's token is refused 403. Changes go
//! through [`crate::admin`], as the CLI's do: the same validation, versions,
//! audit and live reload. A GET answers the configuration version in
//! `ETag`; a write with `If-Match` naming a version after which its document
//! changed is refused 412 and changes nothing.
//!
//! | route | verbs |
//! |---|---|
//! | `/admin/v1/{tiers,models,prices,overrides}` | GET: list (`search`, `offset`, `limit`) |
//! | `/admin/v1/{kind}/{name}` | GET, PUT (the document), DELETE |
//! | `/admin/v1/{kind}/{name}/history` | GET |
//! | `/admin/v1/{envoy,ext-proc,global}` | GET, PUT, DELETE (back to the defaults) |
//! | `/admin/v1/{envoy,ext-proc,global}/history` | GET |
//! | `/admin/v1/overrides/{tenant}/block` | PUT `{"reason", "user"?}`: block the tenant or a user; DELETE (`?user=`): lift it |
//! | `/admin/v1/history` | GET: every change (`limit`) |

use super::HttpState;
use super::precondition::{precondition, tagged};
use super::reply::{Page, error, json, path, query, read_body};
use crate::admin::documents::{self, Kind};
use crate::admin::{AdminError, history};
use crate::app::Caller;
use crate::app::{AppError, ErrorKind};
use crate::config::{ConfigDoc, LiveDocs};
use crate::store::Store;
use crate::store::config_repo::ConfigStore;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use serde::Deserialize;
use std::sync::Arc;

type St<S> = State<Arc<HttpState<S>>>;

/// The admin routes of the live configuration.
pub(super) fn routes<S: Store>() -> Router<Arc<HttpState<S>>> {
    Router::new()
        .route("/admin/v1/history", get(all_history::<S>))
        .route(
            "/admin/v1/{kind}",
            get(list::<S>)
                .put(put_single::<S>)
                .delete(delete_single::<S>),
        )
        .route(
            "/admin/v1/{kind}/{name}",
            get(get_one::<S>).put(put_one::<S>).delete(delete_one::<S>),
        )
        .route("/admin/v1/{kind}/{name}/history", get(one_history::<S>))
}

/// The admin caller behind the headers (the application's
/// [`crate::app::Auth::authenticate_admin`]).
pub(super) fn admin<S>(state: &HttpState<S>, headers: &HeaderMap) -> Result<Caller, AppError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    state.app.auth().authenticate_admin(header)
}

/// The live configuration's store, for a write, or FAILED_PRECONDITION on a
/// replica whose configuration is its file (the in-memory store).
pub(super) fn config<S>(state: &HttpState<S>) -> Result<&ConfigStore, AppError> {
    match &state.config {
        LiveDocs::Redis(cfg) => Ok(cfg),
        LiveDocs::File(_) => Err(AppError::new(
            ErrorKind::Conflict,
            "this replica runs on the in-memory store, whose configuration is its file: edit \
             the file and send the service SIGHUP (the admin API changes the live \
             configuration in Redis)",
        )),
    }
}

/// The status of an admin error.
pub(super) fn status(e: AdminError) -> AppError {
    match e {
        AdminError::Invalid(m) => AppError::invalid(m),
        AdminError::NotFound(m) => AppError::not_found(m),
        // Answered 412 Precondition Failed.
        AdminError::Precondition(m) => AppError::new(ErrorKind::Stale, m),
        AdminError::Store(e) => AppError::from(e),
    }
}

/// The kind a path segment names, or NOT_FOUND listing them.
fn kind(segment: &str) -> Result<Kind, AppError> {
    Kind::of_segment(segment).ok_or_else(|| {
        let kinds: Vec<&str> = documents::KINDS.iter().map(|k| k.segment()).collect();
        AppError::not_found(format!(
            "no route /admin/v1/{segment}: the documents are {}; beside them usage, reconcile, \
             history, tenants, metrics and service (see /openapi.json)",
            kinds.join(", ")
        ))
    })
}

/// The configuration as stored now.
pub(super) async fn load(cfg: &ConfigStore) -> Result<ConfigDoc, AppError> {
    let stored = cfg.load().await.map_err(|e| status(e.into()))?;
    ConfigDoc::from_stored(stored).map_err(|e| status(e.into()))
}

/// The configuration in force, for a read: as stored in Redis, or the
/// file's documents as last loaded (version: the loads since start).
async fn in_force<S>(state: &HttpState<S>) -> Result<Arc<ConfigDoc>, AppError> {
    match &state.config {
        LiveDocs::Redis(cfg) => load(cfg).await.map(Arc::new),
        LiveDocs::File(docs) => Ok(docs.get()),
    }
}

async fn list<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    segment: Result<Path<String>, PathRejection>,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let segment = path(segment)?;
        let kind = kind(&segment)?;
        let doc = in_force(&state).await?;
        if !kind.named() {
            let document = documents::get(&doc, kind, "").map_err(status)?;
            return Ok(tagged(json(StatusCode::OK, &document), doc.version));
        }
        let page = query(page, "search, offset and limit")?;
        // The page chosen by name, then only its documents made JSON.
        let names = documents::names(&doc, kind).into_iter().map(|n| (n, ()));
        let (total, chosen) = page.of(names);
        let items = chosen
            .into_iter()
            .map(|(name, ())| {
                let document = documents::get(&doc, kind, &name).map_err(status)?;
                Ok(serde_json::json!({ "name": name, "document": document }))
            })
            .collect::<Result<Vec<_>, AppError>>()?;
        let body = serde_json::json!({
            "version": doc.version,
            "total": total,
            "offset": page.offset,
            "items": items,
        });
        Ok(tagged(json(StatusCode::OK, &body), doc.version))
    };
    run.await.unwrap_or_else(error)
}

async fn get_one<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    names: Result<Path<(String, String)>, PathRejection>,
    last: Result<Query<Last>, QueryRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let (segment, name) = path(names)?;
        let kind = kind(&segment)?;
        if !kind.named() && name == "history" {
            let last = query(last, "limit")?;
            return history_of(&state, Some(&kind.field("").name()), last).await;
        }
        let doc = in_force(&state).await?;
        let document = documents::get(&doc, kind, &name).map_err(status)?;
        Ok(tagged(json(StatusCode::OK, &document), doc.version))
    };
    run.await.unwrap_or_else(error)
}

/// The name a route gives a document of `kind` ("" for a single section),
/// or INVALID_ARGUMENT for the wrong shape of path.
fn named(kind: Kind, segment: &str, name: Option<&str>) -> Result<String, AppError> {
    match (kind.named(), name) {
        (true, Some(n)) => Ok(n.to_owned()),
        (false, None) => Ok(String::new()),
        (true, None) => Err(AppError::invalid(format!(
            "name the document: /admin/v1/{segment}/{{name}}"
        ))),
        (false, Some(_)) => Err(AppError::invalid(format!(
            "{segment} is one document: /admin/v1/{segment}"
        ))),
    }
}

/// Makes the change `build` makes, as `who`, under the request's
/// precondition; answers the change (201 when it created the document) with
/// the version it made in `ETag`.
pub(super) async fn apply<S: Store>(
    state: &HttpState<S>,
    headers: &HeaderMap,
    who: &Caller,
    build: impl FnMut(&mut ConfigDoc) -> Result<crate::admin::Change, AdminError>,
) -> Result<Response, AppError> {
    let precondition = precondition(headers)?;
    let cfg = config(state)?;
    let actor = format!("{} (admin API)", who.name);
    let written = crate::admin::apply(cfg, &actor, precondition, build)
        .await
        .map_err(status)?;
    let code = match (&written.old, &written.new) {
        (None, Some(_)) => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok(tagged(json(code, &written), written.version))
}

/// A document's text from the body (JSON or TOML), read after the caller
/// was checked.
pub(super) async fn text(raw: Body, headers: &HeaderMap, limit: usize) -> Result<String, AppError> {
    let bytes = read_body(raw, headers, limit).await?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| AppError::invalid("the document is not UTF-8 text: send JSON (or TOML)"))
}

/// PUT or DELETE (`raw` `None`) of a document.
async fn change<S: Store>(
    state: &HttpState<S>,
    headers: &HeaderMap,
    segment: &str,
    name: Option<&str>,
    raw: Option<Body>,
) -> Result<Response, AppError> {
    let who = admin(state, headers)?;
    let kind = kind(segment)?;
    let name = named(kind, segment, name)?;
    let text = match raw {
        Some(raw) => Some(text(raw, headers, state.max_body).await?),
        None => None,
    };
    apply(state, headers, &who, |doc| match &text {
        Some(text) => documents::set(doc, kind, &name, text),
        None => documents::delete(doc, kind, &name),
    })
    .await
}

async fn put_one<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    names: Result<Path<(String, String)>, PathRejection>,
    raw: Body,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let (segment, name) = path(names)?;
        change(&state, &headers, &segment, Some(&name), Some(raw)).await
    };
    run.await.unwrap_or_else(error)
}

async fn delete_one<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    names: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let (segment, name) = path(names)?;
        change(&state, &headers, &segment, Some(&name), None).await
    };
    run.await.unwrap_or_else(error)
}

async fn put_single<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    segment: Result<Path<String>, PathRejection>,
    raw: Body,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let segment = path(segment)?;
        change(&state, &headers, &segment, None, Some(raw)).await
    };
    run.await.unwrap_or_else(error)
}

async fn delete_single<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    segment: Result<Path<String>, PathRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let segment = path(segment)?;
        change(&state, &headers, &segment, None, None).await
    };
    run.await.unwrap_or_else(error)
}

/// `?limit=` of a history.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Last {
    #[serde(default = "hundred")]
    limit: usize,
}

fn hundred() -> usize {
    100
}

/// The newest `last.limit` changes (at most 10,000), of document `field`
/// only when given.
async fn history_of<S>(
    state: &HttpState<S>,
    field: Option<&str>,
    last: Last,
) -> Result<Response, AppError> {
    let LiveDocs::Redis(cfg) = &state.config else {
        // A file's documents have no change log: nothing was changed here.
        return Ok(json(StatusCode::OK, &serde_json::json!([])));
    };
    let shown = history::history(cfg, field, last.limit.min(10_000))
        .await
        .map_err(|e| status(e.into()))?;
    Ok(json(StatusCode::OK, &shown))
}

async fn one_history<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    names: Result<Path<(String, String)>, PathRejection>,
    last: Result<Query<Last>, QueryRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let (segment, name) = path(names)?;
        let last = query(last, "limit")?;
        let field = kind(&segment)?.field(&name).name();
        history_of(&state, Some(&field), last).await
    };
    run.await.unwrap_or_else(error)
}

async fn all_history<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    last: Result<Query<Last>, QueryRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let last = query(last, "limit")?;
        history_of(&state, None, last).await
    };
    run.await.unwrap_or_else(error)
}
