//! The console: a single page for operators and finance, served at
//! `/console` from files built into the binary (`crates/server/src/http/console/`; no
//! build step, nothing fetched at run time). The page itself holds no
//! secret: it asks for an admin token and calls the admin API with it. Beside
//! it, two admin routes it reads: `/admin/v1/metrics` (this replica's own
//! counters, in Prometheus's text format) and `/admin/v1/service` (the
//! store, its health, the configuration version).

use super::HttpState;
use super::admin::admin;
use super::reply::{error, json};
use crate::app::{AppError, ErrorKind};
use crate::config::LiveDocs;
use crate::store::Store;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use std::sync::Arc;

type St<S> = State<Arc<HttpState<S>>>;

const INDEX: &str = include_str!("console/index.html");
const APP: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");

/// The console's routes.
pub(super) fn routes<S: Store>() -> Router<Arc<HttpState<S>>> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route(
            "/console/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/console/app.js",
            get(|| async { asset(APP, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/console/style.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route("/admin/v1/metrics", get(metrics::<S>))
        .route("/admin/v1/service", get(service::<S>))
}

/// A built-in file, never cached stale across an upgrade.
fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

async fn metrics<S: Store>(State(state): St<S>, headers: HeaderMap) -> Response {
    let run = || {
        admin(&state, &headers)?;
        let text = crate::telemetry::render().ok_or_else(|| {
            AppError::new(
                ErrorKind::Unavailable,
                "this replica records no metrics (it serves no HTTP port)",
            )
        })?;
        let mut response = (StatusCode::OK, text).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        Ok(response)
    };
    run().unwrap_or_else(error)
}

async fn service<S: Store>(State(state): St<S>, headers: HeaderMap) -> Response {
    let run = || {
        admin(&state, &headers)?;
        let limits = state.app.engine().limits();
        let body = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "store": state.app.engine().store().describe(),
            "breaker": state.app.engine().breaker_state().as_str(),
            "live_configuration": matches!(state.config, LiveDocs::Redis(_)),
            "config_version": limits.version,
            "tiers": limits.tiers.keys().collect::<Vec<_>>(),
            "model_groups": limits.models.keys().collect::<Vec<_>>(),
        });
        Ok::<_, AppError>(json(StatusCode::OK, &body))
    };
    run().unwrap_or_else(error)
}
