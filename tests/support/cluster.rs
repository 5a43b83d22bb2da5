//! A local Redis Cluster: `redis-server --cluster-enabled yes` processes on
//! free ports (each port and its cluster bus port, + 10000, free; so at most
//! 55535), joined by `redis-cli --cluster create`, killed on drop. Three
//! masters, with one replica each when a test needs failover.

use super::RedisServer;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running cluster.
pub(crate) struct RedisCluster {
    /// Every node, masters first (as created).
    pub nodes: Vec<RedisServer>,
}

/// A port whose cluster bus port is free too. Both stay below 32768, where
/// Linux starts handing out local ports to outgoing connections: a bus port
/// in that range could be taken by any connection between this check and
/// redis-server's bind (a node that then exits at once, seen in CI).
fn cluster_port() -> u16 {
    for _ in 0..1000 {
        let port = 20_000 + rand::random::<u16>() % 2_768;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

/// One cluster node on a free port pair; another pair when another process
/// took the one picked before the node bound it.
fn node() -> RedisServer {
    for _ in 0..10 {
        let port = cluster_port();
        let conf = format!("nodes-{port}.conf");
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &conf,
            "--cluster-node-timeout",
            "2000",
            // A replica may take over whatever its link's age.
            "--cluster-replica-validity-factor",
            "0",
        ];
        if let Some(node) = RedisServer::try_start_on_with(port, &args) {
            return node;
        }
    }
    panic!("no cluster node started in 10 tries");
}

impl RedisCluster {
    /// Three masters, and with `replicas` one replica each; returns once
    /// every slot is served and every replica follows its master.
    pub(crate) fn start(replicas: bool) -> Self {
        for _attempt in 0..3 {
            if let Some(cluster) = Self::try_start(replicas) {
                return cluster;
            }
        }
        panic!("the Redis Cluster did not form");
    }

    fn try_start(replicas: bool) -> Option<Self> {
        let count = if replicas { 6 } else { 3 };
        let nodes: Vec<RedisServer> = (0..count).map(|_| node()).collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        create
            .args(["--cluster-replicas", if replicas { "1" } else { "0" }])
            .arg("--cluster-yes")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if !create.status().expect("redis-cli runs").success() {
            return None;
        }
        let cluster = RedisCluster { nodes };
        cluster
            .wait_ok(Duration::from_secs(30), usize::from(replicas))
            .then_some(cluster)
    }

    /// Waits until every live node says the cluster is ok, with three masters
    /// and `replicas_each` replicas each.
    fn wait_ok(&self, within: Duration, replicas_each: usize) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let ok = self.nodes.iter().all(|n| {
                let Ok(mut c) = redis::Client::open(n.url()).and_then(|c| c.get_connection())
                else {
                    return true; // a killed node
                };
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .unwrap_or_default();
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut c)
                    .unwrap_or_default();
                let replicas = nodes
                    .lines()
                    .filter(|l| l.contains("slave") && !l.contains("fail"))
                    .count();
                let role: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut c)
                    .unwrap_or_default();
                let synced = !role.contains("role:slave") || role.contains("master_link_status:up");
                info.contains("cluster_state:ok") && replicas >= 3 * replicas_each && synced
            });
            if ok {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// The nodes' URLs, as `cluster_nodes` takes them.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// A cluster client for assertions.
    pub(crate) fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.urls()).expect("cluster client")
    }

    /// The index of the node that is master of `key`'s slot now.
    pub(crate) fn master_of(&self, key: &str) -> usize {
        let slot = self.slot_of(key);
        for (i, n) in self.nodes.iter().enumerate() {
            let Ok(mut c) = redis::Client::open(n.url()).and_then(|c| c.get_connection()) else {
                continue;
            };
            let nodes: String = match redis::cmd("CLUSTER").arg("NODES").query(&mut c) {
                Ok(n) => n,
                Err(_) => continue,
            };
            let me = nodes.lines().find(|l| l.contains("myself"));
            if let Some(line) = me
                && line.contains("master")
                && serves(line, slot)
            {
                return i;
            }
        }
        panic!("no master serves the slot of {key}");
    }

    /// `CLUSTER KEYSLOT key`.
    pub(crate) fn slot_of(&self, key: &str) -> u16 {
        let mut c = self.nodes[0].conn();
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .expect("keyslot")
    }

    /// Kills node `i` (SIGKILL).
    pub(crate) fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Waits until the live nodes say the cluster is ok again and some master
    /// serves `key`'s slot (a replica took over).
    pub(crate) fn wait_failover(&self, key: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let slot = self.slot_of_live(key);
        while Instant::now() < deadline {
            let served = self.nodes.iter().any(|n| {
                let Ok(mut c) = redis::Client::open(n.url()).and_then(|c| c.get_connection())
                else {
                    return false;
                };
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut c)
                    .unwrap_or_default();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && nodes
                        .lines()
                        .any(|l| l.contains("myself") && l.contains("master") && serves(l, slot))
            });
            if served {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn slot_of_live(&self, key: &str) -> u16 {
        for n in &self.nodes {
            if let Ok(mut c) = redis::Client::open(n.url()).and_then(|c| c.get_connection())
                && let Ok(slot) = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut c)
            {
                return slot;
            }
        }
        panic!("no live node")
    }

    /// `INFO commandstats` of every live master: (port, evalsha calls, µs).
    pub(crate) fn masters_commandstats(&self) -> Vec<(u16, u64, u64)> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let Ok(mut c) = redis::Client::open(n.url()).and_then(|c| c.get_connection()) else {
                continue;
            };
            let role: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut c)
                .unwrap_or_default();
            if !role.contains("role:master") {
                continue;
            }
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut c)
                .unwrap_or_default();
            let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
            let field = |name: &str| {
                line.and_then(|l| {
                    l.split([':', ','])
                        .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                        .and_then(|v| v.parse().ok())
                })
                .unwrap_or(0)
            };
            out.push((n.port, field("calls"), field("usec")));
        }
        out
    }
}

/// Whether a `CLUSTER NODES` line's slot ranges include `slot`.
fn serves(line: &str, slot: u16) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let mut ends = range.split('-').filter_map(|v| v.parse::<u16>().ok());
        match (ends.next(), ends.next()) {
            (Some(a), Some(b)) => (a..=b).contains(&slot),
            (Some(a), None) => a == slot,
            _ => false,
        }
    })
}
