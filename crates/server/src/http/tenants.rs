//! `/admin/v1/tenants`: the tenants an operator can look at, and one tenant
//! as the console shows it. The list is every tenant with ledger rows (its
//! daily rows, kept `[money] ledger_days`) or an override, searched and paged
//! on the server (read at most every few seconds). One tenant is its
//! GetStatus on a tier (limits, leases in flight), its users nearest their
//! limits (those with usage today, at most [`USERS_READ`]), and its cost by
//! day this month, for the burn-down.

use super::HttpState;
use super::admin::{admin, status};
use super::reply::{Page, error, json, path, query};
use crate::admin::usage::UsageQuery;
use crate::app::{AppError, Caller};
use crate::domain::Clock;
use crate::domain::budget::ledger::Period;
use crate::domain::usage::By;
use crate::domain::{TenantId, UserId};
use crate::pb;
use crate::store::Store;
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type St<S> = State<Arc<HttpState<S>>>;

/// The most users of one tenant read for "nearest their limits".
pub(super) const USERS_READ: usize = 200;

/// How long a tenant list is reused before the store is listed again.
const LIST_FOR: Duration = Duration::from_secs(5);

/// The tenants' routes.
pub(super) fn routes<S: Store>() -> Router<Arc<HttpState<S>>> {
    Router::new()
        .route("/admin/v1/tenants", get(list::<S>))
        .route("/admin/v1/tenants/{tenant}", get(one::<S>))
}

/// The tenant list, listed at most every [`LIST_FOR`].
#[derive(Default)]
pub(super) struct TenantList {
    cached: Mutex<Option<(Instant, Arc<Vec<String>>)>>,
}

impl TenantList {
    async fn get<S: Store>(&self, state: &HttpState<S>) -> Result<Arc<Vec<String>>, AppError> {
        if let Some((at, list)) = &*self.cached.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < LIST_FOR
        {
            return Ok(list.clone());
        }
        let mut names: BTreeSet<String> = state
            .app
            .engine()
            .store()
            .ledger_keys(false)
            .await?
            .into_iter()
            .map(|(t, _)| t.as_str().to_owned())
            .collect();
        names.extend(state.app.engine().limits().overrides.keys().cloned());
        let list = Arc::new(names.into_iter().collect::<Vec<_>>());
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), list.clone()));
        Ok(list)
    }
}

async fn list<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    page: Result<Query<Page>, QueryRejection>,
) -> Response {
    let run = async {
        admin(&state, &headers)?;
        let page = query(page, "search, offset and limit")?;
        let all = state.tenants.get(&state).await?;
        let limits = state.app.engine().limits();
        let (total, items) = page.of(all.iter().map(|t| (t.clone(), ())));
        let items: Vec<serde_json::Value> = items
            .into_iter()
            .map(|(tenant, ())| {
                let deal = limits.overrides.get(&tenant);
                serde_json::json!({
                    "tenant": tenant,
                    "override": deal.is_some(),
                    "blocked": deal.and_then(|o| o.blocks.tenant.clone()),
                })
            })
            .collect();
        Ok(json(
            StatusCode::OK,
            &serde_json::json!({ "total": total, "items": items }),
        ))
    };
    run.await.unwrap_or_else(error)
}

/// `?tier=` of one tenant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnTier {
    tier: String,
}

/// One user and how near its tightest limit it is.
#[derive(Serialize)]
struct Nearest {
    user: String,
    /// The largest used share of any of its limits (1: at the limit).
    used: f64,
    status: serde_json::Value,
}

async fn one<S: Store>(
    State(state): St<S>,
    headers: HeaderMap,
    tenant: Result<Path<String>, PathRejection>,
    tier: Result<Query<OnTier>, QueryRejection>,
) -> Response {
    let run = async {
        let who = admin(&state, &headers)?;
        let tenant = path(tenant)?;
        let OnTier { tier } = query(
            tier,
            "tier: name the tier the tenant's calls use (?tier=…), as GetStatus does",
        )?;
        let id = TenantId::parse(&tenant)
            .map_err(|e| AppError::invalid(format!("tenant: {}", e.message)))?;
        let tenant_status = get_status(&state, &who, &tenant, &tier, "").await?;
        let today = crate::domain::SystemClock.now_us();
        let users = nearest(&state, &who, &id, &tier, today).await?;
        let month = month_so_far(&state, &id, today).await?;
        let body = serde_json::json!({
            "tenant": tenant,
            "tier": tier,
            "status": tenant_status,
            "users": users,
            "month": month,
        });
        Ok(json(StatusCode::OK, &body))
    };
    run.await.unwrap_or_else(error)
}

/// GetStatus of `tenant` (and `user`) on `tier`, as its JSON mapping.
async fn get_status<S: Store>(
    state: &HttpState<S>,
    who: &Caller,
    tenant: &str,
    tier: &str,
    user: &str,
) -> Result<serde_json::Value, AppError> {
    let request = pb::GetStatusRequest {
        tenant_id: tenant.into(),
        user_id: user.into(),
        tier: tier.into(),
        ..Default::default()
    };
    let response = state.api.get_status(Some(who), request).await?;
    serde_json::to_value(&response).map_err(|e| AppError::internal(e.to_string()))
}

/// The tenant's users with usage today, nearest their limits first (ten).
async fn nearest<S: Store>(
    state: &HttpState<S>,
    who: &Caller,
    tenant: &TenantId,
    tier: &str,
    now_us: i64,
) -> Result<Vec<Nearest>, AppError> {
    let (_, today) = Period::of(now_us as f64);
    let rows = state.app.engine().store().ledger(tenant, &[today]).await?;
    let users: BTreeSet<UserId> = rows.into_iter().flatten().filter_map(|r| r.user).collect();
    let mut out = Vec::new();
    for user in users.into_iter().take(USERS_READ) {
        let status = get_status(state, who, tenant.as_str(), tier, user.as_str()).await?;
        out.push(Nearest {
            used: used_share(&status, "LEVEL_USER"),
            user: user.as_str().to_owned(),
            status,
        });
    }
    out.sort_by(|a, b| b.used.total_cmp(&a.used));
    out.truncate(10);
    Ok(out)
}

/// The largest used share among `status`'s limits of `level`.
fn used_share(status: &serde_json::Value, level: &str) -> f64 {
    let num = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.parse::<f64>().unwrap_or(0.0),
        other => other.as_f64().unwrap_or(0.0),
    };
    status["limits"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["level"] == level)
        .map(|l| {
            let limit = num(&l["limit"]);
            match limit > 0.0 {
                true => (limit - num(&l["remaining"])) / limit,
                false => 0.0,
            }
        })
        .fold(0.0, f64::max)
}

/// The tenant's usage by day from the first of this month (UTC).
async fn month_so_far<S: Store>(
    state: &HttpState<S>,
    tenant: &TenantId,
    now_us: i64,
) -> Result<serde_json::Value, AppError> {
    use chrono::Datelike;
    let now = chrono::DateTime::from_timestamp_micros(now_us).unwrap_or_default();
    let first = now.date_naive().with_day(1).unwrap_or(now.date_naive());
    let query = UsageQuery {
        tenant: tenant.clone(),
        user: None,
        model: None,
        from: first.to_string(),
        to: (now.date_naive() + chrono::Days::new(1)).to_string(),
        by: By::Day,
    };
    let limits = state.app.engine().limits();
    let report = crate::admin::usage::report(state.app.engine().store(), Some(&limits), &query)
        .await
        .map_err(status)?;
    serde_json::to_value(&report).map_err(|e| AppError::internal(e.to_string()))
}
