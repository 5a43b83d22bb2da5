//! Connections to Redis: by default a few lazy multiplexed
//! [`ConnectionManager`]s, used round robin, each pipelining every concurrent
//! call onto one socket and reconnecting by itself after Redis restarts; or a
//! deadpool-redis pool (`pool = "deadpool"`), which PINGs every connection it
//! checks out — one extra round trip per call; `ctxbudget bench` measures both.
//! On a Redis Cluster (`cluster_nodes`), one lazy cluster connection: it keeps
//! one multiplexed connection per node, routes each call by its first key's
//! slot, follows MOVED and ASK, and refreshes the slot map after a failover.
//! This file hands out one connection per call and PINGs them all for the
//! breaker's probe.

use super::RedisSettings;
use super::endpoint::SharedConn;
use super::errors::{Classify, pool_error};
use crate::store::{Detail, StoreError};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How the service holds its Redis connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// Multiplexed connections that pipeline concurrent calls (the default).
    #[default]
    Multiplexed,
    /// A deadpool-redis pool: one call per connection at a time.
    Deadpool,
}

/// The shortest time a probe keeps trying a connection.
const PROBE_WINDOW: Duration = Duration::from_millis(1500);

/// The connections of one store (and of its shadow, which shares them).
pub(super) enum Connections {
    Multiplexed {
        conns: Vec<ConnectionManager>,
        next: AtomicUsize,
    },
    Deadpool(deadpool_redis::Pool),
    Cluster(ClusterConnection),
}

/// One connection for one call: a shared (multiplexed or cluster) one, or
/// one checked out of the pool.
pub(super) enum Conn {
    Shared(SharedConn),
    Pooled(deadpool_redis::Connection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Shared(c) => c.req_packed_command(cmd),
            Conn::Pooled(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Shared(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Pooled(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Shared(c) => c.get_db(),
            Conn::Pooled(c) => c.get_db(),
        }
    }
}

impl Connections {
    /// The connections `settings` ask for, made lazily: none is opened here.
    /// `url` (password hidden) names Redis in errors.
    pub(super) fn open(
        client: &redis::Client,
        settings: &RedisSettings,
        url: &str,
    ) -> Result<Self, StoreError> {
        let count = settings.connections.max(1);
        let settings_error =
            |e: RedisError| StoreError::Settings(Detail::caused_by(format!("{url}: {e}"), e));
        match settings.pool {
            PoolKind::Multiplexed => {
                // The store deadline (`timeout`) governs every call; redis-rs's own
                // 500 ms response timeout would cut calls short under it.
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(None)
                    .set_connection_timeout(Some(settings.timeout.max(Duration::from_secs(1))))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(2));
                let conns = (0..count)
                    .map(|_| {
                        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(settings_error)?;
                Ok(Connections::Multiplexed {
                    conns,
                    next: AtomicUsize::new(0),
                })
            }
            PoolKind::Deadpool => {
                let info = client.get_connection_info().clone();
                let mut cfg = deadpool_redis::Config::from_connection_info(info);
                cfg.pool = Some(deadpool_redis::PoolConfig::new(count));
                let pool = cfg
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .map_err(|e| {
                        StoreError::Settings(Detail::caused_by(format!("{url}: {e}"), e))
                    })?;
                Ok(Connections::Deadpool(pool))
            }
        }
    }

    /// One cluster connection to the nodes of `client` (made lazily, as the
    /// multiplexed ones are). `timeout` bounds each node's connection set-up
    /// and answer; the store deadline still governs every call.
    pub(super) fn cluster(client: &redis::cluster::ClusterClient, timeout: Duration) -> Self {
        let config = redis::cluster::ClusterConfig::new()
            .set_connection_timeout(timeout.max(Duration::from_secs(1)))
            .set_response_timeout(timeout.max(Duration::from_secs(1)));
        Connections::Cluster(client.get_pending_async_connection_with_config(config))
    }

    /// The next connection, round robin (or one checked out of the pool).
    pub(super) async fn next(&self) -> Result<Conn, RedisError> {
        match self {
            Connections::Cluster(c) => Ok(Conn::Shared(SharedConn::Cluster(c.clone()))),
            Connections::Multiplexed { conns, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % conns.len();
                Ok(Conn::Shared(SharedConn::Single(conns[i].clone())))
            }
            Connections::Deadpool(pool) => Ok(Conn::Pooled(pool.get().await.map_err(pool_error)?)),
        }
    }

    /// The first connection (or one checked out of the pool): for the
    /// start-up checks.
    pub(super) async fn first(&self) -> Result<Conn, RedisError> {
        match self {
            Connections::Cluster(c) => Ok(Conn::Shared(SharedConn::Cluster(c.clone()))),
            Connections::Multiplexed { conns, .. } => {
                Ok(Conn::Shared(SharedConn::Single(conns[0].clone())))
            }
            Connections::Deadpool(pool) => Ok(Conn::Pooled(pool.get().await.map_err(pool_error)?)),
        }
    }

    /// PINGs every connection until it answers, for a bounded time: the
    /// breaker's probe, and at start-up, so every connection is made before
    /// the first call. `timeout` is the store deadline.
    pub(super) async fn ping_all(
        &self,
        url: &str,
        timeout: Duration,
        classify: Classify,
    ) -> Result<(), StoreError> {
        // A connection that broke fails its first command and reconnects in
        // the background (with a short backoff): PING each until it answers,
        // for a bounded time, so the breaker half-opens only once every
        // connection real calls will use is back.
        let attempt = timeout.max(Duration::from_millis(200));
        let deadline = tokio::time::Instant::now() + (attempt * 3).max(PROBE_WINDOW);
        match self {
            Connections::Multiplexed { conns, .. } => {
                let pings = conns.iter().map(|conn| async move {
                    ping_until(deadline, attempt, || {
                        let mut conn = conn.clone();
                        async move { redis::cmd("PING").query_async::<()>(&mut conn).await }
                    })
                    .await
                });
                for result in futures_util::future::join_all(pings).await {
                    result.map_err(|e| classify(url, e))?;
                }
            }
            Connections::Cluster(conn) => {
                // PING goes to every master: the probe passes once each answers.
                ping_until(deadline, attempt, || {
                    let mut conn = conn.clone();
                    async move { redis::cmd("PING").query_async::<()>(&mut conn).await }
                })
                .await
                .map_err(|e| classify(url, e))?;
            }
            Connections::Deadpool(pool) => {
                // Checking a connection out PINGs it and replaces a broken one.
                ping_until(deadline, attempt, || async {
                    let mut conn = pool.get().await.map_err(pool_error)?;
                    redis::cmd("PING").query_async::<()>(&mut conn).await
                })
                .await
                .map_err(|e| classify(url, e))?;
            }
        }
        Ok(())
    }

    /// The cluster connection, on a cluster.
    pub(super) fn cluster_connection(&self) -> Option<ClusterConnection> {
        match self {
            Connections::Cluster(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// `3 multiplexed connections`, `deadpool of 8`: for the start-up log.
    pub(super) fn describe(&self) -> String {
        match self {
            Connections::Multiplexed { conns, .. } => {
                format!("{} multiplexed connections", conns.len())
            }
            Connections::Deadpool(pool) => format!("deadpool of {}", pool.status().max_size),
            Connections::Cluster(_) => "a cluster connection".into(),
        }
    }
}

/// Runs `ping` until it succeeds or `deadline` passes, each attempt cut at
/// `attempt`; the last error if it never answered.
async fn ping_until<F, Fut>(
    deadline: tokio::time::Instant,
    attempt: Duration,
    mut ping: F,
) -> Result<(), RedisError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), RedisError>>,
{
    loop {
        let err = match tokio::time::timeout(attempt, ping()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no PING reply within {} ms", attempt.as_millis()),
            )),
        };
        if tokio::time::Instant::now() + Duration::from_millis(50) >= deadline {
            return Err(err);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
