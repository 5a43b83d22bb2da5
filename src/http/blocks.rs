//! `/admin/v1/overrides/{tenant}/block`: block a tenant (or one user of it)
//! and lift the block, through [`crate::admin::blocks`] as `ctxbudget
//! overrides block|unblock` does; checked against `If-Match` and audited like
//! every admin write.

use super::HttpState;
use super::admin::{admin, config, if_match, load, status, tagged, text};
use super::reply::{error, json};
use crate::admin::AdminError;
use crate::api::auth::Caller;
use crate::config::ConfigDoc;
use crate::store::Store;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use std::sync::Arc;
use tonic::Status;

type St<S> = State<Arc<HttpState<S>>>;

/// The block routes.
pub(super) fn routes<S: Store>() -> Router<Arc<HttpState<S>>> {
    Router::new().route(
        "/admin/v1/{kind}/{name}/block",
        axum::routing::put(block::<S>).delete(unblock::<S>),
    )
}

/// The body of a block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockBody {
    /// Why, shown to every refused caller.
    reason: String,
    /// One user of the tenant; absent: the whole tenant.
    #[serde(default)]
    user: Option<String>,
}

/// `?user=` of an unblock.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Whose {
    #[serde(default)]
    user: Option<String>,
}

/// Only `/admin/v1/overrides/{tenant}/block` exists.
fn overrides_only(segment: &str) -> Result<(), Status> {
    match segment {
        "overrides" => Ok(()),
        _ => Err(Status::not_found(format!(
            "no route /admin/v1/{segment}/…/block: blocks are kept in overrides \
             (/admin/v1/overrides/{{tenant}}/block)"
        ))),
    }
}

/// Writes a block change as `who`, checked against `If-Match`.
async fn write_block<S: Store>(
    state: &HttpState<S>,
    headers: &HeaderMap,
    who: &Caller,
    change: impl FnOnce(&mut ConfigDoc) -> Result<crate::admin::Change, AdminError>,
) -> Result<Response, Status> {
    let read_at = if_match(headers)?;
    let cfg = config(state)?;
    let mut doc = load(cfg).await?;
    let change = change(&mut doc).map_err(status)?;
    let actor = format!("{} (admin API)", who.name);
    let written = crate::admin::write(cfg, change, &actor, read_at)
        .await
        .map_err(status)?;
    Ok(tagged(json(StatusCode::OK, &written), written.version))
}

async fn block<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    Path((segment, tenant)): Path<(String, String)>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let who = admin(&state, &headers)?;
        overrides_only(&segment)?;
        let text = text(raw, &headers, state.max_body)?;
        let body: BlockBody = serde_json::from_str(&text).map_err(|e| {
            Status::invalid_argument(format!(
                "the body is no block: {e}; send {{\"reason\": \"…\"}} (and \"user\" to block one user)"
            ))
        })?;
        write_block(&state, &headers, &who, |doc| {
            crate::admin::blocks::block(doc, &tenant, body.user.as_deref(), &body.reason)
        })
        .await
    };
    run.await.unwrap_or_else(error)
}

async fn unblock<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    Path((segment, tenant)): Path<(String, String)>,
    Query(whose): Query<Whose>,
) -> Response {
    let run = async {
        let who = admin(&state, &headers)?;
        overrides_only(&segment)?;
        write_block(&state, &headers, &who, |doc| {
            crate::admin::blocks::unblock(doc, &tenant, whose.user.as_deref())
        })
        .await
    };
    run.await.unwrap_or_else(error)
}
