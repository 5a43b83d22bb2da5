//! Blocking a tenant or a user now (`ctxbudget overrides block`): every API
//! refuses the blocked scope — CheckAndReserve with REASON_BLOCKED, the
//! operator's reason and no retry; ShouldRateLimit with OVER_LIMIT — while
//! Commit, Refund and RenewLease of reservations made before the block still
//! settle. On every store: from the file on memory, live through the CLI on
//! Redis and on a cluster.

use crate::envoy::{ask, descriptor, envoy_client, request};
use crate::support;

use ctxbudget::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ctxbudget::pb::{self, Level, Outcome, Reason};
use std::time::{Duration, Instant};
use support::{Backend, Harness, reserve};

on_every_store!(a_blocked_scope_is_refused_everywhere_and_old_reservations_settle);

const CONFIG: &str = r#"
[envoy]
default_tier = "free"

[tiers.free]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100, period = "1h" }], tokens = [{ limit = 100000, period = "1m" }] }
user = { requests = [{ limit = 50, period = "1h" }] }
"#;

const FROM_FILE: &str = r#"
[overrides.acme]
blocked_users = { mallory = "abuse report 42" }

[overrides.shut]
blocked = "unpaid invoice"
"#;

async fn try_reserve(h: &mut Harness, tenant: &str, user: &str) -> pb::CheckAndReserveResponse {
    h.client
        .check_and_reserve(reserve(tenant, user, "free", 10, 10))
        .await
        .unwrap()
        .into_inner()
}

/// Waits (up to 10 s) until a request of (tenant, user) is blocked or not.
async fn until_blocked(h: &mut Harness, tenant: &str, user: &str, blocked: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = try_reserve(h, tenant, user).await;
        if (r.reason() == Reason::Blocked) == blocked {
            if !r.allowed {
                return;
            }
            // An allowed probe is given back.
            h.client
                .refund(pb::RefundRequest {
                    reservation_id: r.reservation_id,
                })
                .await
                .unwrap();
            return;
        }
        assert!(Instant::now() < deadline, "the block never changed: {r:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_blocked(r: &pb::CheckAndReserveResponse, level: Level, reason: &str) {
    assert!(!r.allowed, "{r:#?}");
    assert_eq!(r.reason(), Reason::Blocked, "{r:#?}");
    assert_eq!(r.limiting_level(), level);
    assert_eq!(r.retry_after_ms, 0, "waiting cannot help");
    assert!(r.reservation_id.is_empty());
    assert!(
        r.detail.contains(reason),
        "the operator's reason: {}",
        r.detail
    );
}

async fn a_blocked_scope_is_refused_everywhere_and_old_reservations_settle(backend: Backend) {
    if let Backend::Memory = backend {
        return blocked_from_the_file().await;
    }
    let mut h = Harness::start(backend, CONFIG).await;
    let mut envoy = envoy_client(&h).await;
    // Three reservations before the block, to settle three ways after it.
    let mut before = Vec::new();
    for _ in 0..3 {
        let r = try_reserve(&mut h, "acme", "alice").await;
        assert!(r.allowed, "{r:#?}");
        before.push(r.reservation_id);
    }

    // Bad input is refused and writes nothing.
    let err = h.ctl(&["overrides", "block", "acme", "--reason", ""]).await;
    assert!(
        err.unwrap_err().to_string().contains("reason"),
        "an empty reason"
    );
    let err = h.ctl(&["overrides", "unblock", "acme"]).await.unwrap_err();
    assert!(err.to_string().contains("not blocked"), "{err}");

    h.ctl(&["overrides", "block", "acme", "--reason", "unpaid invoice"])
        .await
        .unwrap();
    until_blocked(&mut h, "acme", "bob", true).await;
    let r = try_reserve(&mut h, "acme", "alice").await;
    assert_blocked(&r, Level::Tenant, "unpaid invoice");
    let d = descriptor(&[("tenant", "acme"), ("user", "alice")], None);
    let e = ask(&mut envoy, request("llm", vec![d.clone()])).await;
    assert_eq!(e.overall_code(), Code::OverLimit, "{e:#?}");
    assert!(
        e.response_headers_to_add
            .iter()
            .all(|h| h.key != "retry-after"),
        "no retry for a block: {e:#?}"
    );
    // Another tenant is not touched.
    assert!(try_reserve(&mut h, "other", "alice").await.allowed);

    // What was reserved before the block still settles.
    let commit = h
        .client
        .commit(pb::CommitRequest {
            reservation_id: before[0].clone(),
            prompt_tokens: 10,
            completion_tokens: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(commit.outcome(), Outcome::Applied);
    let renew = h
        .client
        .renew_lease(pb::RenewLeaseRequest {
            reservation_id: before[1].clone(),
            lease_ttl_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renew.outcome(), Outcome::Applied);
    let refund = h
        .client
        .refund(pb::RefundRequest {
            reservation_id: before[2].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refund.outcome(), Outcome::Applied);

    // A new deal does not lift the block; unblock does.
    let dir = crate::operations::temp_dir("blocks");
    let deal = crate::operations::document(
        &dir,
        "deal.toml",
        "tenant = { requests = [{ limit = 500, period = \"1h\" }] }\n",
    );
    h.ctl(&["overrides", "set", "--tenant", "acme", &deal])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        try_reserve(&mut h, "acme", "alice").await.reason(),
        Reason::Blocked
    );
    h.ctl(&["overrides", "unblock", "acme"]).await.unwrap();
    until_blocked(&mut h, "acme", "alice", false).await;

    // One user: only that user.
    h.ctl(&[
        "overrides",
        "block",
        "acme",
        "--user",
        "mallory",
        "--reason",
        "abuse report 42",
    ])
    .await
    .unwrap();
    until_blocked(&mut h, "acme", "mallory", true).await;
    let r = try_reserve(&mut h, "acme", "mallory").await;
    assert_blocked(&r, Level::User, "abuse report 42");
    assert!(try_reserve(&mut h, "acme", "alice").await.allowed);
    let d = descriptor(&[("tenant", "acme"), ("user", "mallory")], None);
    assert_eq!(
        ask(&mut envoy, request("llm", vec![d]))
            .await
            .overall_code(),
        Code::OverLimit
    );
    // `--tenant`, as the other `overrides` verbs take it, works too.
    h.ctl(&[
        "overrides",
        "unblock",
        "--tenant",
        "acme",
        "--user",
        "mallory",
    ])
    .await
    .unwrap();
    until_blocked(&mut h, "acme", "mallory", false).await;
    let _ = std::fs::remove_dir_all(dir);
    h.stop().await;
}

/// The memory store has no shared configuration: a block comes from the file.
async fn blocked_from_the_file() {
    let mut h = Harness::start(Backend::Memory, &format!("{CONFIG}{FROM_FILE}")).await;
    let mut envoy = envoy_client(&h).await;
    let r = try_reserve(&mut h, "shut", "alice").await;
    assert_blocked(&r, Level::Tenant, "unpaid invoice");
    let r = try_reserve(&mut h, "acme", "mallory").await;
    assert_blocked(&r, Level::User, "abuse report 42");
    assert!(try_reserve(&mut h, "acme", "alice").await.allowed);
    let d = descriptor(&[("tenant", "shut")], None);
    let e = ask(&mut envoy, request("llm", vec![d])).await;
    assert_eq!(e.overall_code(), Code::OverLimit, "{e:#?}");
    assert_eq!(e.statuses[0].limit_remaining, 0);
    h.stop().await;
}
