//! Where Redis is — one server or a Redis Cluster's seed nodes — and one
//! shared, lazily made connection to it for the callers that are not the
//! budget store (the live configuration, the operator CLI).

use super::{RedisTls, open_client, open_cluster_client, redact_url};
use crate::store::{Detail, StoreError};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

/// One Redis, or a Redis Cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `redis://…` or `rediss://…`.
    Single(String),
    /// The seed nodes of a cluster.
    Cluster(Vec<String>),
}

impl Endpoint {
    /// The cluster when `cluster_nodes` names any node, else `url` if given.
    pub fn of(url: Option<&str>, cluster_nodes: &[String]) -> Option<Endpoint> {
        match (cluster_nodes.is_empty(), url) {
            (false, _) => Some(Endpoint::Cluster(cluster_nodes.to_vec())),
            (true, Some(url)) if !url.is_empty() => Some(Endpoint::Single(url.to_owned())),
            _ => None,
        }
    }

    /// True for a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Endpoint::Cluster(_))
    }

    /// For logs and errors: passwords hidden.
    pub fn shown(&self) -> String {
        match self {
            Endpoint::Single(url) => redact_url(url),
            Endpoint::Cluster(nodes) => {
                let nodes: Vec<String> = nodes.iter().map(|n| redact_url(n)).collect();
                format!("Redis Cluster {}", nodes.join(","))
            }
        }
    }

    /// A lazy connection (none is opened here), and for one Redis its client
    /// (for a subscription of its own). Only wrong settings are errors.
    pub fn connect(
        &self,
        tls: &RedisTls,
    ) -> Result<(SharedConn, Option<redis::Client>), StoreError> {
        match self {
            Endpoint::Single(url) => {
                let client = open_client(url, tls)?;
                // A Redis that is down is reached once it answers (the manager
                // reconnects by itself, briefly backing off, so a call during an
                // outage fails within a few seconds).
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(2));
                let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)
                    .map_err(|e| {
                        StoreError::Settings(Detail::caused_by(format!("{}: {e}", self.shown()), e))
                    })?;
                Ok((SharedConn::Single(conn), Some(client)))
            }
            Endpoint::Cluster(nodes) => {
                let client = open_cluster_client(nodes, tls)?;
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(Duration::from_secs(1))
                    .set_response_timeout(Duration::from_secs(2));
                let conn = client.get_pending_async_connection_with_config(config);
                Ok((SharedConn::Cluster(conn), None))
            }
        }
    }
}

/// A connection to an [`Endpoint`], cheap to clone.
#[derive(Clone)]
pub enum SharedConn {
    /// To one Redis.
    Single(ConnectionManager),
    /// To a cluster: routed by each command's first key.
    Cluster(ClusterConnection),
}

impl ConnectionLike for SharedConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            SharedConn::Single(c) => c.req_packed_command(cmd),
            SharedConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            SharedConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            SharedConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            SharedConn::Single(c) => c.get_db(),
            SharedConn::Cluster(c) => c.get_db(),
        }
    }
}

/// The live masters in a `CLUSTER NODES` reply, as (host, port).
pub fn cluster_masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (addr, flags) = (fields.get(1)?, fields.get(2)?);
            if !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let addr = addr.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.to_string(), port.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::cluster_masters;

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let nodes = "a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b 127.0.0.1:7001@17001 slave a 0 0 1 connected\n\
                     c 127.0.0.1:7002@17002 master,fail - 0 0 2 disconnected 5461-10922\n";
        assert_eq!(
            cluster_masters(nodes),
            vec![("127.0.0.1".to_string(), 7000)]
        );
    }
}
