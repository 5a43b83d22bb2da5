//! `/admin/v1/overrides/{tenant}/block`: block a tenant (or one user of it)
//! and lift the block, through [`crate::admin::blocks`] as `ctxbudget
//! overrides block|unblock` does; checked against `If-Match` and audited like
//! every admin write.

use super::HttpState;
use super::admin::{admin, apply, text};
use super::reply::error;
use super::reply::{path, query};
use crate::admin::blocks;
use crate::app::AppError;
use crate::store::Store;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use std::sync::Arc;

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
fn overrides_only(segment: &str) -> Result<(), AppError> {
    match segment {
        "overrides" => Ok(()),
        _ => Err(AppError::not_found(format!(
            "no route /admin/v1/{segment}/…/block: blocks are kept in overrides \
             (/admin/v1/overrides/{{tenant}}/block)"
        ))),
    }
}

async fn block<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    names: Result<Path<(String, String)>, PathRejection>,
    raw: Body,
) -> Response {
    let run = async {
        let who = admin(&state, &headers)?;
        let (segment, tenant) = path(names)?;
        overrides_only(&segment)?;
        let text = text(raw, &headers, state.max_body).await?;
        let body: BlockBody = serde_json::from_str(&text).map_err(|e| {
            AppError::invalid(format!(
                "the body is no block: {e}; send {{\"reason\": \"…\"}} (and \"user\" to block one user)"
            ))
        })?;
        apply(&state, &headers, &who, |doc| {
            blocks::block(doc, &tenant, body.user.as_deref(), &body.reason)
        })
        .await
    };
    run.await.unwrap_or_else(error)
}

async fn unblock<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    names: Result<Path<(String, String)>, PathRejection>,
    whose: Result<Query<Whose>, QueryRejection>,
) -> Response {
    let run = async {
        let who = admin(&state, &headers)?;
        let (segment, tenant) = path(names)?;
        overrides_only(&segment)?;
        let whose = query(whose, "user (the user whose block to lift)")?;
        apply(&state, &headers, &who, |doc| {
            blocks::unblock(doc, &tenant, whose.user.as_deref())
        })
        .await
    };
    run.await.unwrap_or_else(error)
}
