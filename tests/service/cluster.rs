//! The service on a local Redis Cluster (`[store] cluster_nodes`): two
//! replicas sharing a global limit without a hot key, and a master killed
//! under load.

use crate::support::cluster::RedisCluster;
use crate::support::{self, Harness, reserve};
use ctxbudget::config::{FileConfig, Flags, Settings};
use ctxbudget::pb::{self, Level, Outcome, Reason};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tonic::Code;

type Client = pb::budget_service_client::BudgetServiceClient<tonic::transport::Channel>;

const GLOBAL_100_PER_HOUR: &str = r#"
[global]
requests = [{ limit = 100, period = "1h" }]

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 1000, period = "1m" }] }
user = { requests = [{ limit = 1000, period = "1m" }] }
"#;

/// The test defaults plus `toml`, on the cluster at `nodes`.
fn cluster_settings(toml: &str, nodes: Vec<String>) -> Settings {
    let file = FileConfig::built_in()
        .overlay(FileConfig::parse(support::TEST_RESERVATIONS, "test defaults").unwrap())
        .overlay(FileConfig::parse(toml, "test config").expect("test config parses"));
    file.settings(Flags {
        redis_cluster_nodes: nodes,
        ..Flags::default()
    })
    .expect("test config is valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_grant_exactly_the_global_limit_over_200_tenants() {
    let cluster = RedisCluster::start(false);
    let a = Harness::start_with(cluster_settings(GLOBAL_100_PER_HOUR, cluster.urls()), None).await;
    let b = Harness::start_with(cluster_settings(GLOBAL_100_PER_HOUR, cluster.urls()), None).await;
    let clients = [a.client.clone(), b.client.clone()];
    // 2,000 reservations, 200 tenants, alternating replicas, 64 in flight.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut calls = Vec::new();
    for i in 0..2000usize {
        let mut client = clients[i % 2].clone();
        let gate = gate.clone();
        calls.push(tokio::spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let tenant = format!("tenant-{}", i % 200);
            client
                .check_and_reserve(reserve(&tenant, "u", "t", 10, 10))
                .await
                .expect("every call is answered")
                .into_inner()
        }));
    }
    let mut granted = [0usize; 2];
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.await.unwrap();
        match r.allowed {
            true => granted[i % 2] += 1,
            false => {
                assert_eq!(r.limiting_level(), Level::Global, "{r:#?}");
                assert_eq!(r.reason(), Reason::RpmExceeded, "{r:#?}");
                assert!(r.retry_after_ms > 0, "a global denial says when: {r:#?}");
            }
        }
    }
    assert_eq!(
        granted[0] + granted[1],
        100,
        "exactly the global limit across both replicas: {granted:?}"
    );
    assert!(
        granted[0] > 0 && granted[1] > 0,
        "both replicas granted: {granted:?}"
    );
    // No script touched two slots, and the tenants' keys spread over the masters.
    let stats = cluster.masters_commandstats();
    assert_eq!(stats.len(), 3);
    assert!(
        stats.iter().all(|(_, calls, _)| *calls > 100),
        "every master ran scripts: {stats:?}"
    );
}

const FAILOVER: &str = r#"
[store]
timeout_ms = 1000

# Leases outlive the test however slow the machine: the replays are live.
[reservations]
default_lease_ttl_ms = 300000
max_lease_ttl_ms = 300000
idempotency_ttl_ms = 300000
retention_ms = 300000
retry_jitter_ms = 0
concurrency_retry_ms = 1000

[resilience]
policy = "fail_closed"

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
user = { requests = [{ limit = 100000, period = "1m" }] }
"#;

/// One tenant's calls through a failover: each reservation under its own
/// idempotency key, retried with that key until answered; the grants.
async fn reserve_through(
    client: &mut Client,
    tenant: &str,
    key: &str,
    unavailable: &mut usize,
) -> pb::CheckAndReserveResponse {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut r = reserve(tenant, "u", "t", 10, 10);
        r.idempotency_key = key.to_string();
        match client.check_and_reserve(r).await {
            Ok(resp) => return resp.into_inner(),
            Err(s) => {
                assert_eq!(
                    s.code(),
                    Code::Unavailable,
                    "fail_closed answers UNAVAILABLE: {s:?}"
                );
                assert!(!s.message().is_empty());
                *unavailable += 1;
                assert!(Instant::now() < deadline, "the service never recovered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_over_and_nothing_is_settled_twice() {
    let mut cluster = RedisCluster::start(true);
    let h = Harness::start_with(cluster_settings(FAILOVER, cluster.urls()), None).await;
    let mut client = h.client.clone();
    let tenant = "acme";
    // The master holding the tenant's slot (tenant ids travel base64url-encoded).
    let victim = cluster.master_of("{YWNtZQ}");
    let mut granted: HashMap<String, String> = HashMap::new();
    let mut unavailable = 0;
    let mut before_kill = Vec::new();
    for i in 0..400 {
        if i == 200 {
            // The first 200 on the replica before the kill: a write of our
            // own on the victim, then WAIT until a replica has everything up
            // to it (a fixed pause was too short on a busy machine).
            let mut conn = cluster.nodes[victim].conn();
            let _: () = redis::cmd("SET")
                .arg("{YWNtZQ}:replicated")
                .arg(1)
                .query(&mut conn)
                .unwrap();
            let acked: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(30_000)
                .query(&mut conn)
                .unwrap();
            assert!(acked >= 1, "a replica has the first 200");
            before_kill = granted.keys().cloned().collect();
            cluster.kill(victim);
        }
        let key = format!("k{i}");
        let r = reserve_through(&mut client, tenant, &key, &mut unavailable).await;
        assert!(r.allowed, "{r:#?}");
        granted.insert(key, r.reservation_id);
    }
    assert!(unavailable > 0, "the kill was felt");
    assert!(
        cluster.wait_failover("{YWNtZQ}", Duration::from_secs(30)),
        "a replica took over"
    );
    // Granted before the kill and replicated: the same key returns the same
    // reservation, never a second one.
    for key in &before_kill {
        let mut r = reserve(tenant, "u", "t", 10, 10);
        r.idempotency_key = key.clone();
        let again = client.check_and_reserve(r).await.unwrap().into_inner();
        assert!(again.replayed, "{key}: {again:#?}");
        assert_eq!(&again.reservation_id, &granted[key]);
    }
    // Each reservation settles once: a second commit never applies again.
    let mut lost = 0;
    for id in granted.values() {
        let commit = |id: &str| pb::CommitRequest {
            reservation_id: id.to_string(),
            prompt_tokens: 10,
            completion_tokens: 5,
            ..Default::default()
        };
        match client.commit(commit(id)).await {
            Ok(first) => assert_eq!(first.into_inner().outcome(), Outcome::Applied),
            // Written on the old master within its replication lag, and lost.
            Err(s) if s.code() == Code::NotFound => lost += 1,
            Err(s) => panic!("{id}: {s:?}"),
        }
        match client.commit(commit(id)).await {
            Ok(second) => assert_eq!(
                second.into_inner().outcome(),
                Outcome::AlreadySettled,
                "{id} settled twice"
            ),
            Err(s) => assert_eq!(s.code(), Code::NotFound, "{id}: {s:?}"),
        }
    }
    assert!(lost <= 200, "only writes near the kill can be lost: {lost}");
}
