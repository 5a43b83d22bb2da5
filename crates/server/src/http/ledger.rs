//! `/admin/v1/usage` and `/admin/v1/reconcile`: the ledger for finance, from
//! the replica's own store (so on the in-memory store too), as
//! `ctxbudget usage` and `ctxbudget reconcile` read it ([`crate::admin`]).
//!
//! - `GET /admin/v1/usage?tenant=&from=&to=[&user=][&model=][&by=day][&format=csv]`
//! - `POST /admin/v1/reconcile?from=&to=[&max_drift=1%][&columns=][&tenant=a,b]`
//!   with the provider's CSV export as the body.

use super::HttpState;
use super::admin::{admin, status};
use super::reply::{error, json, query, read_body};
use crate::admin::reconcile::{ReconcileQuery, parse_max_drift, read_export};
use crate::admin::usage::{UsageQuery, csv};
use crate::app::AppError;
use crate::domain::reconcile::Columns;
use crate::domain::usage::By;
use crate::domain::{TenantId, UserId};
use crate::store::Store;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use std::sync::Arc;

type St<S> = State<Arc<HttpState<S>>>;

/// The ledger's routes.
pub(super) fn routes<S: Store>() -> Router<Arc<HttpState<S>>> {
    Router::new()
        .route("/admin/v1/usage", get(usage::<S>))
        .route("/admin/v1/reconcile", post(reconcile::<S>))
}

/// `?…` of `/admin/v1/usage`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageParams {
    tenant: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    model: Option<String>,
    from: String,
    to: String,
    #[serde(default)]
    by: Option<String>,
    #[serde(default)]
    format: Option<String>,
}

fn invalid(what: &str, e: impl std::fmt::Display) -> AppError {
    AppError::invalid(format!("{what}: {e}"))
}

async fn usage<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    q: Result<Query<UsageParams>, QueryRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let p = query(
            q,
            "tenant, from, to, and optionally user, model, by (hour, day, month), format (json, csv)",
        )?;
        let query = UsageQuery {
            tenant: TenantId::parse(&p.tenant).map_err(|e| invalid("tenant", e.message))?,
            user: p
                .user
                .as_deref()
                .filter(|u| !u.is_empty())
                .map(UserId::parse)
                .transpose()
                .map_err(|e| invalid("user", e.message))?,
            model: p.model.filter(|m| !m.is_empty()),
            from: p.from,
            to: p.to,
            by: p
                .by
                .as_deref()
                .unwrap_or("day")
                .parse::<By>()
                .map_err(|e| invalid("by", e))?,
        };
        let limits = state.app.engine().limits();
        let report = crate::admin::usage::report(state.app.engine().store(), Some(&limits), &query)
            .await
            .map_err(status)?;
        match p.format.as_deref().unwrap_or("json") {
            "json" => Ok(json(StatusCode::OK, &report)),
            "csv" => {
                let mut out = Vec::new();
                csv(&report.lines, &mut out)
                    .map_err(|e| AppError::internal(format!("cannot write CSV: {e}")))?;
                let name = format!(
                    "attachment; filename=\"usage-{}-{}-{}.csv\"",
                    report.tenant, report.from, report.to
                );
                let mut response = (StatusCode::OK, out).into_response();
                let h = response.headers_mut();
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv"));
                if let Ok(v) = HeaderValue::from_str(&name) {
                    h.insert(header::CONTENT_DISPOSITION, v);
                }
                Ok(response)
            }
            other => Err(invalid("format", format!("{other:?}: json or csv"))),
        }
    };
    run.await.unwrap_or_else(error)
}

/// `?…` of `/admin/v1/reconcile`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileParams {
    from: String,
    to: String,
    #[serde(default)]
    max_drift: Option<String>,
    #[serde(default)]
    columns: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
}

async fn reconcile<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    q: Result<Query<ReconcileParams>, QueryRejection>,
    body: Body,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let p = query(
            q,
            "from, to, and optionally max_drift, columns, tenant (comma-separated)",
        )?;
        let body = read_body(body, &headers, state.max_body).await?;
        let columns = Columns::with_mapping(p.columns.as_deref().unwrap_or(""))
            .map_err(|e| invalid("columns", e))?;
        let theirs = read_export(&body[..], &columns, "the export").map_err(status)?;
        let query = ReconcileQuery {
            from: p.from,
            to: p.to,
            max_drift: parse_max_drift(p.max_drift.as_deref().unwrap_or("1%"))
                .map_err(|e| invalid("max_drift", e))?,
            tenants: p
                .tenant
                .as_deref()
                .unwrap_or("")
                .split(',')
                .filter(|t| !t.trim().is_empty())
                .map(|t| TenantId::parse(t.trim()).map_err(|e| invalid("tenant", e.message)))
                .collect::<Result<_, _>>()?,
        };
        let limits = state.app.engine().limits();
        let done =
            crate::admin::reconcile::reconcile(state.app.engine().store(), &limits, &query, theirs)
                .await
                .map_err(status)?;
        Ok(json(StatusCode::OK, &done.report(&query)))
    };
    run.await.unwrap_or_else(error)
}
