//! The HTTP/JSON face of the service, on a port of its own (`[http] listen`):
//! every `BudgetService` RPC as `POST /v1/<rpc in kebab case>` in protobuf's
//! JSON mapping (`rpc`), answered by the same [`BudgetApi`] methods as gRPC,
//! over the same [`App`] (its tokens, tenant bindings and admission gate);
//! no gRPC type on the way. The admin API under
//! `/admin/v1/` (`admin`, `ledger`, `tenants`), for admin tokens; and the
//! console at `/console` (`console`). Errors and denials
//! become HTTP statuses in one place (`reply`). docs/http-api.md is the
//! reference.

mod admin;
mod blocks;
mod console;
mod ledger;
pub mod openapi;
mod openapi_admin;
mod openapi_parts;
mod precondition;
mod reply;
mod rpc;
mod tenants;

use crate::api::BudgetApi;
use crate::app::App;
use crate::config::LiveDocs;
use crate::store::Store;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// What every HTTP handler shares.
pub struct HttpState<S> {
    /// The application: its engine, tokens and admission gate.
    pub app: Arc<App<S>>,
    /// The budget RPCs over it, as gRPC serves them.
    pub api: Arc<BudgetApi<S>>,
    /// The live configuration: in Redis, or the file's (the in-memory store).
    pub config: LiveDocs,
    /// Largest request body accepted (`[server] max_message_bytes`).
    pub max_body: usize,
    /// The tenants the admin API lists, read now and then.
    tenants: tenants::TenantList,
}

impl<S> HttpState<S> {
    /// The state of a replica serving `app`.
    pub fn new(app: Arc<App<S>>, config: LiveDocs, max_body: usize) -> Self {
        HttpState {
            api: Arc::new(BudgetApi::new(app.clone())),
            app,
            config,
            max_body,
            tenants: tenants::TenantList::default(),
        }
    }
}

/// Every route of the HTTP listener: at most `[server]
/// max_concurrent_streams` requests worked on at once (more wait), and no
/// cross-site browser request that could change anything.
pub fn router<S: Store>(state: HttpState<S>) -> Router {
    let max_body = state.max_body;
    let at_once = state.app.gate().settings().max_concurrent_streams as usize;
    rpc::routes::<S>()
        .merge(admin::routes::<S>())
        .merge(blocks::routes::<S>())
        .merge(ledger::routes::<S>())
        .merge(tenants::routes::<S>())
        .merge(console::routes::<S>())
        .route("/openapi.json", axum::routing::get(openapi_json))
        .fallback(reply::no_route)
        .method_not_allowed_fallback(reply::wrong_method)
        .with_state(Arc::new(state))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(same_origin))
        .layer(tower::limit::ConcurrencyLimitLayer::new(at_once))
}

/// Refuses a request a browser sends from a page of another origin (its
/// `Origin` names another host than `Host`) unless it only reads: with
/// authentication off, a web page a user of the private network opens could
/// otherwise reserve, settle or change quotas. Callers that are not browsers
/// send no `Origin`.
async fn same_origin(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{Method, header};
    let reads = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if let Some(origin) = request.headers().get(header::ORIGIN)
        && !reads
    {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        let from = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, h)| h);
        if from.is_none() || from != host {
            return reply::error(crate::app::AppError::forbidden(format!(
                "a request from a page of another origin ({}) is refused: call the API from a \
                 server, or from the console this service serves",
                origin.to_str().unwrap_or("?")
            )));
        }
    }
    next.run(request).await
}

/// `/openapi.json`: the description of every route (no token needed).
async fn openapi_json() -> axum::response::Response {
    reply::json(axum::http::StatusCode::OK, &openapi::document())
}

/// How long a client may take to send a request's headers before its
/// connection is closed (bodies have `reply::read_body`'s own bound).
const HEADERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown`, then lets the calls in
/// flight finish. Each connection is HTTP/1.1 with keep-alive, and closed
/// when its headers do not arrive within [`HEADERS_WITHIN`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADERS_WITHIN)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on.
                    tracing::warn!(error = %e, "the HTTP listener could not accept a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "an HTTP connection ended in error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
