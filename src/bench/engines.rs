//! What the bench builds to drive, in this process: an engine over the memory
//! store or over Redis, and a whole service on a free port that answers health
//! checks before the bench sends it load.

use super::{BenchError, err};
use crate::config::Settings;
use crate::engine::Engine;
use crate::server;
use crate::store::keys::Keys;
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisSettings, RedisStore, redact_url};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long an embedded service may take to serve.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// An engine over a fresh memory store, with its background tasks running.
pub(super) fn memory_engine(settings: &Settings) -> Arc<Engine<MemoryStore>> {
    let keys = Keys::new(&settings.key_prefix).expect("validated prefix");
    let store = MemoryStore::new(keys, settings.retention);
    let engine = Arc::new(server::engine(store, settings));
    // Detached: they end with the bench's runtime.
    drop(server::engine_tasks(&engine));
    engine
}

/// An engine over Redis at `url`, its keys under `prefix`; an error when Redis
/// does not answer.
pub(super) async fn redis_engine(
    settings: &Settings,
    url: &str,
    prefix: &str,
    connections: usize,
) -> Result<Arc<Engine<RedisStore>>, BenchError> {
    let redis = RedisSettings {
        url: url.to_string(),
        pool: settings.pool,
        connections,
        timeout: settings.store_timeout.max(Duration::from_secs(2)),
        tls: settings.redis_tls.clone(),
        cluster_nodes: Vec::new(),
    };
    let keys = Keys::new(prefix).map_err(err)?;
    let store = RedisStore::connect(&redis, keys, settings.retention)
        .await
        .map_err(err)?;
    if !store.reachable() {
        return Err(BenchError(format!(
            "{} does not answer; start Redis first",
            redact_url(url)
        )));
    }
    let engine = Arc::new(server::engine(store, settings));
    // Detached: they end with the bench's runtime.
    drop(server::engine_tasks(&engine));
    Ok(engine)
}

/// A free local address for a listener the service binds itself.
pub(super) async fn free_port() -> Result<SocketAddr, BenchError> {
    let probe = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    probe.local_addr().map_err(err)
}

/// Starts a service on a free local port and waits until it serves; sending on
/// the returned channel stops it.
pub(super) async fn embedded_server(
    settings: Settings,
) -> Result<(SocketAddr, oneshot::Sender<()>), BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let (tx, rx) = oneshot::channel::<()>();
    let (ready_tx, ready_rx) = oneshot::channel::<Result<(), String>>();
    tokio::spawn(async move {
        let result = server::run(settings, listener, async {
            let _ = rx.await;
        })
        .await;
        let _ = ready_tx.send(result.map_err(|e| e.to_string()));
    });
    wait_serving(addr, ready_rx).await?;
    Ok((addr, tx))
}

/// Waits until the service on `addr` reports health SERVING, or `stopped`
/// says why it could not start.
async fn wait_serving(
    addr: SocketAddr,
    mut stopped: oneshot::Receiver<Result<(), String>>,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if let Ok(result) = stopped.try_recv() {
            let why = result.err().unwrap_or_else(|| "it stopped".into());
            return Err(BenchError(format!(
                "the embedded service did not start: {why}"
            )));
        }
        if serving(addr).await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError(
                "the embedded service did not become ready in 15 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One health check of the service on `addr`: true when it answers SERVING.
async fn serving(addr: SocketAddr) -> Result<bool, BenchError> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).map_err(err)?;
    let Ok(channel) = endpoint.connect().await else {
        return Ok(false);
    };
    let check = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    Ok(check.is_ok_and(|r| r.get_ref().status() == ServingStatus::Serving))
}
