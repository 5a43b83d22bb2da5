//! A grant that finds its caller gone: a waiting call whose granting
//! reservation is on its way to Redis when its caller disconnects. The
//! reservation is made (nobody will receive it) and refunded at once by the
//! engine's cancel on drop, not held until its 60 s lease lapses; the
//! ticket leaves the line.

use crate::support;

use crate::queue_scale::until_metric;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ctxbudget::pb;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::RedisServer;
use support::hold::HoldingProxy;
use support::process::Service;

/// An account of one call at a time, leases far longer than the test, no
/// retry on a timer (a waiting call is woken by the refund), and a store
/// deadline longer than the call is held.
const ONE_AT_A_TIME: &str = r#"
[store]
timeout_ms = 5000

[reservations]
default_lease_ttl_ms = 60000
max_lease_ttl_ms = 60000
concurrency_retry_ms = 30000
retry_jitter_ms = 0

[global]
concurrency = 1

[tiers.open]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { concurrency = 100 }
user = { concurrency = 100 }
"#;

fn call(tenant: &str, max_wait_ms: u64) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        max_wait_ms,
        ..support::reserve(tenant, "u", "open", 50, 50)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_caller_left_while_it_was_made_is_refunded_at_once() {
    let redis = RedisServer::start();
    let upstream = SocketAddr::from(([127, 0, 0, 1], redis.port));
    let proxy = HoldingProxy::start(upstream).await;
    let service = Service::start("queue-gone", ONE_AT_A_TIME, Some(&proxy.url()));
    let mut c = support::connect(service.addr).await;
    let held = c
        .check_and_reserve(call("a", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(held.allowed, "{held:?}");
    // Tenant `gone` waits for the slot, on a connection of its own.
    let mut own = support::connect(service.addr).await;
    let waiter = tokio::spawn(async move { own.check_and_reserve(call("gone", 20_000)).await });
    until_metric(&service, "ctxbudget_queue_waiting", &[], |n| n == 1.0).await;
    // The refund wakes it; its reservation, the only call naming its
    // tenant's keys, is held on its way to Redis.
    proxy.arm(&format!("{{{}}}", URL_SAFE_NO_PAD.encode("gone")));
    c.refund(pb::RefundRequest {
        reservation_id: held.reservation_id,
    })
    .await
    .unwrap();
    proxy.held(Duration::from_secs(10)).await;
    waiter.abort();
    let cancelled = [("outcome", "cancelled")];
    until_metric(
        &service,
        "ctxbudget_queue_wait_seconds_count",
        &cancelled,
        |n| n == 1.0,
    )
    .await;
    // Now Redis makes the reservation: the account's slot is taken for a
    // caller who is not there. It comes back at once.
    proxy.release();
    let released = Instant::now();
    loop {
        let next = c
            .check_and_reserve(call("c", 0))
            .await
            .unwrap()
            .into_inner();
        if next.allowed {
            break;
        }
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "the slot is still held {:?} after the grant: {next:?}",
            released.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // It was granted, and refunded as nobody's.
    assert_eq!(
        service.metric("ctxbudget_cancellations_total", &cancelled),
        Some(1.0)
    );
    let until = Instant::now() + Duration::from_secs(10);
    while crate::queue_replicas::tickets_waiting(&redis) > 0 {
        assert!(Instant::now() < until, "the ticket left the line");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
