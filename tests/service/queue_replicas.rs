//! Waiting in line across replicas: two services on one Redis wait in one
//! line per shared level (`lua/line.lua`). A Commit or Refund on one replica
//! wakes the call first in line on the other; tenants share the account
//! fairly whichever replica their callers reach; a replica that dies
//! leaves no ticket behind (callers that leave: `queue_scale`, `queue_gone`).

use crate::support;

use ctxbudget::pb;
use pb::budget_service_client::BudgetServiceClient;
use std::time::{Duration, Instant};
use support::{Backend, Harness, RedisServer};
use tonic::transport::Channel;

/// An account of one call at a time, and a full-concurrency retry far
/// beyond the tests' waits: a waiting call granted quickly was woken, not
/// retried on its timer.
const ONE_AT_A_TIME: &str = r#"
[reservations]
default_lease_ttl_ms = 30000
max_lease_ttl_ms = 60000
retention_ms = 60000
idempotency_ttl_ms = 60000
retry_jitter_ms = 0
concurrency_retry_ms = 30000

[global]
concurrency = 1

[tiers.open]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { concurrency = 100 }
user = { concurrency = 100 }
"#;

fn call(tenant: &str, user: &str, max_wait_ms: u64) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        max_wait_ms,
        ..support::reserve(tenant, user, "open", 50, 50)
    }
}

/// Two replicas of `config` on one Redis.
async fn two_replicas(config: &str) -> (Harness, Harness) {
    let a = Harness::start(Backend::Redis, config).await;
    let url = a.redis.as_ref().expect("a Redis").url();
    let b = Harness::start_with(support::settings(config, Some(url)), None).await;
    (a, b)
}

async fn take_the_slot(c: &mut BudgetServiceClient<Channel>) -> String {
    let held = c
        .check_and_reserve(call("a", "u", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(held.allowed, "{held:?}");
    held.reservation_id
}

async fn refund(c: &mut BudgetServiceClient<Channel>, id: String) {
    let r = c
        .refund(pb::RefundRequest { reservation_id: id })
        .await
        .expect("refund")
        .into_inner();
    assert_eq!(r.outcome(), pb::Outcome::Applied);
}

/// The tickets in the account's line: its tenants' first tickets in each
/// class, and their others.
pub(crate) fn tickets_waiting(redis: &RedisServer) -> usize {
    let mut conn = redis.conn();
    ["0", "1", "2", "p"]
        .iter()
        .map(|set| {
            redis::cmd("ZCARD")
                .arg(format!("ctxb:{{q:}}:{set}"))
                .query::<usize>(&mut conn)
                .unwrap()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_one_replica_wakes_the_call_waiting_on_the_other() {
    let (a, b) = two_replicas(ONE_AT_A_TIME).await;
    let mut ca = a.client.clone();
    let held = take_the_slot(&mut ca).await;
    let mut cb = b.client.clone();
    let waiting = tokio::spawn(async move {
        cb.check_and_reserve(call("b", "u", 20_000))
            .await
            .unwrap()
            .into_inner()
    });
    // It waits in the shared line.
    let redis = a.redis.as_ref().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while tickets_waiting(redis) == 0 {
        assert!(Instant::now() < until, "the call joined the line in Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    refund(&mut ca, held).await;
    let out = waiting.await.unwrap();
    assert!(out.allowed, "{out:?}");
    // Woken by the refund on the other replica, not by its 30 s retry.
    assert!(
        (300..10_000).contains(&out.waited_ms),
        "waited {} ms",
        out.waited_ms
    );
    assert_eq!(tickets_waiting(redis), 0, "granted, it left the line");
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_share_the_account_whichever_replica_they_reach() {
    let (a, b) = two_replicas(ONE_AT_A_TIME).await;
    // The flood reaches both replicas; x only one, y only the other.
    let per_tenant = crate::queue::grants_per_tenant(&[
        ("flood", &a.client, 3),
        ("flood", &b.client, 3),
        ("x", &a.client, 2),
        ("y", &b.client, 2),
    ])
    .await;
    let total: u32 = per_tenant.values().sum();
    assert!(total >= 30, "the account was used: {per_tenant:?}");
    for tenant in ["flood", "x", "y"] {
        let share = f64::from(per_tenant[tenant]) / f64::from(total);
        assert!(
            (share - 1.0 / 3.0).abs() < 0.1,
            "{tenant} got {share:.2} of the account, not a third: {per_tenant:?}"
        );
    }
    assert_eq!(tickets_waiting(a.redis.as_ref().unwrap()), 0);
    b.stop().await;
    a.stop().await;
}

/// A replica killed with 100 calls waiting for 30 s holds the line up for a
/// few seconds (its owner stops beating), not for their deadlines: the call
/// behind them on the other replica is granted, and no ticket is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_with_calls_waiting_does_not_hold_up_the_line() {
    let n = 100;
    let a = Harness::start(Backend::Redis, ONE_AT_A_TIME).await;
    let redis = a.redis.as_ref().unwrap();
    let config = format!("[store]\ntimeout_ms = 5000\n{ONE_AT_A_TIME}");
    let b = support::process::Service::start("queue-killed", &config, Some(&redis.url()));
    let mut ca = a.client.clone();
    let held = take_the_slot(&mut ca).await;
    // n calls wait on the replica about to die, for 30 s.
    let b_client = support::connect(b.addr).await;
    let mut doomed = Vec::new();
    for i in 0..n {
        let mut c = b_client.clone();
        doomed.push(tokio::spawn(async move {
            c.check_and_reserve(call("b", &format!("u{i}"), 30_000))
                .await
        }));
    }
    let until = Instant::now() + Duration::from_secs(10);
    while tickets_waiting(redis) < n {
        assert!(Instant::now() < until, "all {n} joined");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Then one on the surviving replica, behind them.
    let mut c = a.client.clone();
    let behind = tokio::spawn(async move {
        c.check_and_reserve(call("c", "u", 25_000))
            .await
            .unwrap()
            .into_inner()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(b); // killed
    for d in doomed {
        assert!(
            d.await.unwrap().is_err(),
            "the dead replica's callers lost it"
        );
    }
    refund(&mut ca, held).await;
    // The dead replica stops beating: its tickets are dropped within seconds
    // (not at their 30 s deadlines) and the call behind them is granted.
    let out = behind.await.unwrap();
    assert!(out.allowed, "{out:?}");
    assert!(out.waited_ms < 20_000, "waited {} ms", out.waited_ms);
    let until = Instant::now() + Duration::from_secs(10);
    while tickets_waiting(redis) > 0 {
        assert!(Instant::now() < until, "left: {}", tickets_waiting(redis));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.stop().await;
}
