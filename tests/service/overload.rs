//! Overload: a replica works on at most `[server] max_in_flight` calls at
//! once; the rest wait `queue_ms` at most and are shed with
//! RESOURCE_EXHAUSTED and a retry hint (or DEADLINE_EXCEEDED when their own
//! deadline runs out first), none of their work started, while health still
//! answers. The calls in flight are held by a frozen Redis.

use crate::support;

use ctxbudget::pb;
use support::RedisServer;
use support::process::Service;
use tonic::Code;

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
max_in_flight = 2
queue_ms = 20
shed_retry_ms = 75

[store]
timeout_ms = 30000

[global]

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 1000000, period = "1m" }] }
"#;

fn ask() -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        tenant_id: "acme".into(),
        tier: "t".into(),
        model: "gpt-4o".into(),
        prompt_tokens: Some(10),
        max_output_tokens: 10,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_limit_in_flight_are_shed_before_any_work() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let redis = RedisServer::start();
    let svc = Service::start("overload", CONFIG, Some(&redis.url()));
    let c = support::connect(svc.addr).await;
    // The store answers before it freezes: the tenant's key exists.
    let r = c
        .clone()
        .check_and_reserve(ask())
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed);
    assert_eq!(svc.metric("ctxbudget_in_flight_limit", &[]), Some(2.0));
    redis.freeze();
    // Two calls take the two slots and wait on the frozen store.
    let held: Vec<_> = (0..2)
        .map(|_| {
            let mut c = c.clone();
            tokio::spawn(async move { c.check_and_reserve(ask()).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while svc.metric("ctxbudget_in_flight", &[]) != Some(2.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the slots never filled"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Eight more are shed while the two still wait: nothing was reserved.
    let shed = futures_util::future::join_all((0..8).map(|_| {
        let mut c = c.clone();
        async move { c.check_and_reserve(ask()).await.unwrap_err() }
    }))
    .await;
    for status in &shed {
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("max_in_flight")
                && status.message().contains("retry after 75 ms")
        );
        assert_eq!(
            status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .and_then(|v| v.to_str().ok()),
            Some("75")
        );
    }
    assert!(
        held.iter().all(|h| !h.is_finished()),
        "the two are still held"
    );
    assert_eq!(
        svc.metric("ctxbudget_shed_total", &[("reason", "full")]),
        Some(8.0)
    );
    // A caller whose deadline is shorter than twice the queue waits half of
    // it, then hears DEADLINE_EXCEEDED (or, on a machine too busy to answer
    // in the other half, its own client gives up first: CANCELLED).
    let mut hurried = tonic::Request::new(ask());
    hurried.set_timeout(std::time::Duration::from_millis(30));
    let status = c.clone().check_and_reserve(hurried).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    assert_eq!(
        svc.metric("ctxbudget_shed_total", &[("reason", "deadline")]),
        Some(1.0)
    );
    // Health is never shed.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", svc.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(health.is_ok(), "{health:?}");
    // The store answers again: the two held calls complete, the slots free.
    redis.thaw();
    for h in held {
        let r = h.await.unwrap().unwrap().into_inner();
        assert!(r.allowed, "{r:?}");
    }
    let r = c
        .clone()
        .check_and_reserve(ask())
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed);
}
