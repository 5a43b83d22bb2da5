//! Bootstrap: builds the store and engine from settings and serves gRPC (and
//! with `[http] listen`, the HTTP API) on a
//! listener until `shutdown` resolves. Tests call [`run`] with a port-0 listener.
//! The services and the listener's TLS are in `grpc`; the refusal of an
//! oversized request, in words that name the setting, in `message_limit`.

use crate::app::{App, Auth, Gate};
use crate::config::{FileDocs, LiveDocs, Settings};
use crate::engine::{Engine, EngineSettings};
use crate::estimator::{Counter, Multipliers};
use crate::gateway::LiveMap;
use crate::gateway::ext_proc::LiveReading;
use crate::http::HttpState;
use crate::reload::{self, Live};

mod admission;
mod grpc;
mod startup;
pub use startup::RedisStart;
use startup::{load_when_reachable, redis_start};
mod health;
mod message_limit;
mod traced;
use crate::store::cluster::ClusterStore;
use crate::store::config_repo::ConfigStore;
use crate::store::keys::Keys;
use crate::store::memory::MemoryStore;
use crate::store::redis::{Endpoint, RedisSettings, RedisStore};
use crate::store::{Store, StoreError};
use grpc::{Faces, routes};
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

/// The server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store could not be reached at startup.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The gRPC transport failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Reflection could not be built from the embedded descriptors.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// Invalid settings.
    #[error("{0}")]
    Settings(String),
}

/// Serves on `listener` with the store `settings` name until `shutdown`. A
/// Redis that does not answer yet is no start-up error: the replica serves by
/// its failure policy and connects once Redis answers. Wrong settings are.
pub async fn run(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let keys = Keys::new(&settings.key_prefix).map_err(|e| ServeError::Settings(e.to_string()))?;
    let Some(endpoint) = Endpoint::of(settings.redis_url.as_deref(), &settings.cluster_nodes)
    else {
        let store = MemoryStore::new(keys, settings.retention);
        return serve(store, &settings, listener, shutdown, None).await;
    };
    let redis = redis_settings(&settings);
    let cfg = ConfigStore::connect(&endpoint, &settings.redis_tls, &settings.key_prefix).await?;
    if endpoint.is_cluster() {
        let store = ClusterStore::new(RedisStore::connect(&redis, keys, settings.retention).await?);
        let (settings, start) = redis_start(settings, cfg, store.reachable()).await?;
        serve(store, &settings, listener, shutdown, Some(start)).await
    } else {
        let store = RedisStore::connect(&redis, keys, settings.retention).await?;
        let (settings, start) = redis_start(settings, cfg, store.reachable()).await?;
        serve(store, &settings, listener, shutdown, Some(start)).await
    }
}

/// The Redis (or Redis Cluster) store settings of `settings`.
pub fn redis_settings(settings: &Settings) -> RedisSettings {
    RedisSettings {
        url: settings.redis_url.clone().unwrap_or_default(),
        pool: settings.pool,
        connections: settings.connections,
        timeout: settings.store_timeout,
        tls: settings.redis_tls.clone(),
        cluster_nodes: settings.cluster_nodes.clone(),
    }
}

/// An engine over `store` as `settings` configure it.
pub fn engine<S: Store>(store: S, settings: &Settings) -> Engine<S> {
    Engine::new(
        store,
        settings.limits.clone(),
        engine_settings(settings),
        Counter::new(settings.models.clone(), settings.count_workers),
        Multipliers::new(settings.adaptive),
    )
}

/// The engine settings part of [`Settings`].
pub fn engine_settings(settings: &Settings) -> EngineSettings {
    EngineSettings {
        leases: settings.leases,
        retry_jitter_ms: settings.retry_jitter_ms,
        concurrency_retry_ms: settings.concurrency_retry_ms,
        policy: settings.policy,
        replicas: settings.replicas,
        breaker: settings.breaker,
        retention: settings.retention,
        priorities: settings.priorities,
        require_price: settings.require_price,
        max_queued: settings.max_queued,
    }
}

/// Serves an engine over `store`.
pub async fn serve<S: Store>(
    store: S,
    settings: &Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    redis: Option<RedisStart>,
) -> Result<(), ServeError> {
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Settings(e.to_string()))?;
    tracing::info!(
        listen = %addr,
        store = %store.describe(),
        tiers = %settings.limits.tier_names(),
        "ctxbudget serving gRPC on {addr}"
    );
    let engine = started_engine(store, settings, redis.as_ref());
    let auth = authentication(settings, addr);
    // Load the tokenizers in the background: the first long prompt should not pay.
    tokio::task::spawn_blocking(crate::estimator::count::warm_up);
    let (live, config) = live(&engine, settings, redis.as_ref());
    let mut tasks = background_tasks(&live, settings, &auth, redis);
    let (reporting, health_service) = health::start(engine.clone()).await;
    tasks.push(reporting);
    let faces = Faces {
        envoy_map: live.envoy_map,
        ext_proc: live.ext_proc,
    };
    let app = App::new(engine.clone(), auth, Gate::new(settings.admission));
    // One shutdown for both listeners; sent also when gRPC stops by itself.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stop = Arc::new(stop);
    let on_signal = stop.clone();
    tasks.push(tokio::spawn(async move {
        shutdown.await;
        let _ = on_signal.send(true);
    }));
    let http = match settings.http_listen {
        Some(addr) => {
            let body = settings.max_message_bytes;
            let state = HttpState::new(app.clone(), config, body);
            match serve_http(addr, state, until(stopped.clone())).await {
                Ok(task) => Some(task),
                Err(e) => {
                    tasks.iter().for_each(|t| t.abort());
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let served = match routes(&app, faces, settings, health_service) {
        Ok(routes) => serve_grpc(routes, listener, until(stopped)).await,
        Err(e) => Err(e),
    };
    let _ = stop.send(true);
    finish(http, tasks).await;
    served?;
    tracing::info!("ctxbudget stopped");
    Ok(())
}

/// What configuration changes apply to, and where the admin API reads the
/// configuration: Redis, or without it the file's documents.
fn live<S: Store>(
    engine: &Arc<Engine<S>>,
    settings: &Settings,
    redis: Option<&RedisStart>,
) -> (Live<S>, LiveDocs) {
    let config = match redis {
        Some(r) => LiveDocs::Redis(Box::new(r.config.clone())),
        None => LiveDocs::File(Arc::new(FileDocs::new(settings.seed.clone()))),
    };
    let live = Live {
        engine: engine.clone(),
        envoy_map: Arc::new(LiveMap::new(&settings.envoy)),
        ext_proc: Arc::new(LiveReading::new(&settings.ext_proc)),
        alerts: Arc::new(tokio::sync::watch::Sender::new(settings.alerts.clone())),
        file_docs: match &config {
            LiveDocs::File(docs) => Some(docs.clone()),
            LiveDocs::Redis(_) => None,
        },
    };
    (live, config)
}

/// Serves the gRPC `routes` on `listener` until `shutdown`.
async fn serve_grpc(
    routes: tonic::transport::server::Router,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    routes
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
        .map_err(ServeError::from)
}

/// Once gRPC has stopped: lets the HTTP listener's calls in flight finish
/// (for at most ten seconds), then stops the background tasks.
async fn finish(
    http: Option<tokio::task::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    if let Some(mut http) = http
        && tokio::time::timeout(std::time::Duration::from_secs(10), &mut http)
            .await
            .is_err()
    {
        http.abort();
    }
    for task in tasks {
        task.abort();
    }
}

/// The tokens callers present, with a warning when there are none.
fn authentication(settings: &Settings, addr: std::net::SocketAddr) -> Arc<Auth> {
    let auth = Arc::new(Auth::new(settings.tokens.clone()));
    if !auth.enabled() {
        let http = settings
            .http_listen
            .map_or(String::new(), |h| format!(" or http://{h}/v1/"));
        tracing::warn!(
            "no [auth] tokens configured: any client that reaches {addr}{http} may reserve and \
             settle"
        );
    }
    auth
}

/// Resolves once the shutdown watch says stop.
async fn until(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The engine over `store`, its breaker open while Redis has not answered,
/// provisional while its configuration is not loaded.
fn started_engine<S: Store>(
    store: S,
    settings: &Settings,
    redis: Option<&RedisStart>,
) -> Arc<Engine<S>> {
    let engine = Arc::new(engine(store, settings));
    if redis.is_some_and(|r| !r.reachable) {
        engine.trip_breaker();
    }
    if redis.is_some_and(|r| !r.loaded) {
        engine.set_provisional(true);
    }
    engine
}

/// Binds the HTTP listener at `addr` and serves the HTTP API on it until
/// `shutdown`.
async fn serve_http<S: Store>(
    addr: std::net::SocketAddr,
    state: HttpState<S>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| ServeError::Settings(format!("cannot listen on {addr} for HTTP: {e}")))?;
    let shown = listener.local_addr().map_or(addr, |a| a);
    tracing::info!(listen = %shown, "serving the HTTP/JSON API on http://{shown}/v1/");
    let router = crate::http::router(state);
    Ok(tokio::spawn(async move {
        if let Err(e) = crate::http::serve(listener, router, shutdown).await {
            tracing::error!(error = %e, "the HTTP listener failed");
        }
    }))
}

/// The tasks beside the gRPC service: the engine's own, the SIGHUP reload,
/// and with Redis the configuration watch (or, when Redis has not answered
/// yet, the load that precedes it).
fn background_tasks<S: Store>(
    live: &Live<S>,
    settings: &Settings,
    auth: &Arc<Auth>,
    redis: Option<RedisStart>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = engine_tasks(&live.engine);
    match Keys::new(&settings.key_prefix) {
        Ok(keys) => tasks.push(tokio::spawn(crate::alerts::run(
            live.engine.clone(),
            keys,
            live.alerts.subscribe(),
        ))),
        Err(e) => tracing::error!(error = %e, "no threshold alerts: the key prefix is refused"),
    }
    tasks.push(tokio::spawn(reload::on_sighup(
        live.clone(),
        settings.config_path.clone(),
        redis.as_ref().map(|r| r.config.clone()),
        auth.clone(),
    )));
    if let Some(start) = redis {
        tasks.push(match start.loaded {
            true => tokio::spawn(reload::watch_redis(live.clone(), start.config)),
            false => tokio::spawn(load_when_reachable(
                live.clone(),
                start.config,
                settings.clone(),
            )),
        });
    }
    tasks
}

/// Keeps this replica's estimator multipliers in step with the samples every
/// replica's Commits add to the store: twice a second, so never older than 1 s.
async fn refresh_estimators<S: Store>(engine: Arc<Engine<S>>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        match engine.refresh_estimators().await {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "could not refresh the estimator multipliers; keeping the last ones");
            }
            Err(_) => {}
        }
    }
}

/// Starts what an engine needs running beside it: the estimator refresh, the
/// store probe while the breaker is open, the cancellation queue, and the
/// lines of waiting calls. Every
/// long-lived engine runs these (the server, the bench's in-process ones).
pub fn engine_tasks<S: Store>(engine: &Arc<Engine<S>>) -> Vec<tokio::task::JoinHandle<()>> {
    let cancels = engine.clone();
    let lines = engine.clone();
    vec![
        tokio::spawn(refresh_estimators(engine.clone())),
        tokio::spawn(probe_store(engine.clone())),
        tokio::spawn(async move { cancels.run_cancellations().await }),
        tokio::spawn(async move { lines.run_lines().await }),
    ]
}

/// Probes the store while the breaker is open (see [`Engine::probe_if_due`]).
async fn probe_store<S: Store>(engine: Arc<Engine<S>>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        engine.probe_if_due().await;
    }
}
