//! What the bench reads from Redis itself: the script calls and CPU in
//! `INFO commandstats`, and the version for the machine line.

use super::{BenchError, err};
use crate::store::redis::cluster_masters;

/// The scheme of a Redis Cluster store spec: `redis-cluster://h:p,h:p,…`.
pub(super) const CLUSTER_SCHEME: &str = "redis-cluster://";

/// The node URLs of a `redis-cluster://` spec; `None` for any other spec.
pub(super) fn cluster_nodes(spec: &str) -> Option<Vec<String>> {
    let nodes = spec.strip_prefix(CLUSTER_SCHEME)?;
    Some(
        nodes
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| match n.contains("://") {
                true => n.to_string(),
                false => format!("redis://{n}"),
            })
            .collect(),
    )
}

/// (address, evalsha calls, usec) of every master of the cluster one of
/// `nodes` belongs to, from each master's `INFO commandstats`.
pub(super) async fn masters_commandstats(
    nodes: &[String],
) -> Result<Vec<(String, u64, u64)>, BenchError> {
    let mut listing = None;
    for node in nodes {
        let Ok(client) = redis::Client::open(node.as_str()) else {
            continue;
        };
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await
            && let Ok(text) = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut conn)
                .await
        {
            listing = Some(text);
            break;
        }
    }
    let listing = listing.ok_or_else(|| BenchError("no cluster node answers".into()))?;
    let mut out = Vec::new();
    for (host, port) in cluster_masters(&listing) {
        let addr = format!("{host}:{port}");
        let (calls, usec) = commandstats(&format!("redis://{addr}")).await?;
        out.push((addr, calls, usec));
    }
    out.sort();
    Ok(out)
}

/// (calls, usec) of `evalsha` from `INFO commandstats`.
pub(super) async fn commandstats(url: &str) -> Result<(u64, u64), BenchError> {
    let client = redis::Client::open(url).map_err(err)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(err)?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    Ok(parse_evalsha(&info))
}

/// (calls, usec) of the `cmdstat_evalsha` line; zeros when there is none.
fn parse_evalsha(info: &str) -> (u64, u64) {
    let Some(line) = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")) else {
        return (0, 0);
    };
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// Cores and CPU model, and the Redis version when `redis` answers.
pub(super) async fn machine(redis: Option<&str>) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mut facts = format!("{cores} cores, {cpu}");
    let first = redis.map(|r| {
        cluster_nodes(r)
            .and_then(|n| n.into_iter().next())
            .unwrap_or(r.to_string())
    });
    if let Some(url) = first.as_deref()
        && let Some(version) = redis_version(url).await
    {
        facts.push_str(&format!(", Redis {version}"));
    }
    facts
}

/// `redis_version` from `INFO server`, when Redis answers.
async fn redis_version(url: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let info = redis::cmd("INFO")
        .arg("server")
        .query_async::<String>(&mut conn)
        .await
        .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_parse() {
        let info = "# Commandstats\r\ncmdstat_get:calls=1,usec=2\r\ncmdstat_evalsha:calls=10,usec=300,usec_per_call=30.00\r\n";
        assert_eq!(parse_evalsha(info), (10, 300));
    }
}
