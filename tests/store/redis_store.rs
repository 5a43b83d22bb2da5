//! Behaviour only the Redis store has: key TTLs and layout in a real Redis,
//! script reloading, atomicity against a broken key, replicas sharing one
//! truth, and an unreachable Redis.

use crate::support;

use ctxbudget::domain::{Level, TenantId, UserId};
use ctxbudget::pb::{self, Dimension, Outcome, Reason};
use ctxbudget::store::Scope;
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys};
use redis::Commands;
use std::time::Duration;
use support::{Harness, RedisServer, limit, reserve, settings};
use tonic::Code;

const SHORT: &str = r#"
[reservations]
default_lease_ttl_ms = 400
max_lease_ttl_ms = 1000
retention_ms = 300
idempotency_ttl_ms = 300
retry_jitter_ms = 0
concurrency_retry_ms = 1000

[money]
ledger_hourly_retention = "1h"
ledger_daily_retention = "1d"

[global]
requests = [{ limit = 1000, period = "1s" }]
concurrency = 100

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 5000, period = "1s" }], concurrency = 10 }
user = { requests = [{ limit = 10, period = "1s" }], tokens = [{ limit = 1000, period = "1s" }], concurrency = 5 }
"#;

/// Every key with its PTTL, but the live configuration (`ctxb:cfg*`), which is
/// meant to last, and the usage ledger, kept for its retention.
fn keys_with_ttl(redis: &RedisServer) -> Vec<(String, i64)> {
    let mut conn = redis.conn();
    let keys: Vec<String> = conn.keys("*").unwrap();
    keys.into_iter()
        .filter(|k| !k.starts_with("ctxb:cfg") && !is_ledger(k))
        .map(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut conn).unwrap();
            (k, ttl)
        })
        .collect()
}

fn is_ledger(key: &str) -> bool {
    key.contains(":l:h:") || key.contains(":l:d:")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_has_a_ttl_and_idle_state_disappears() {
    let mut h = Harness::start(support::Backend::Redis, SHORT).await;
    let c = &mut h.client;
    let keyed = pb::CheckAndReserveRequest {
        idempotency_key: "k".into(),
        ..reserve("acme", "alice", "t", 100, 10)
    };
    let a = c.check_and_reserve(keyed).await.unwrap().into_inner();
    let b = c
        .check_and_reserve(reserve("acme", "bob", "t", 100, 10))
        .await
        .unwrap()
        .into_inner();
    let _abandoned = c
        .check_and_reserve(reserve("acme", "carol", "t", 100, 10))
        .await
        .unwrap();
    c.commit(pb::CommitRequest {
        reservation_id: a.reservation_id,
        prompt_tokens: 900,
        completion_tokens: 500,
        ..Default::default()
    })
    .await
    .unwrap();
    c.refund(pb::RefundRequest {
        reservation_id: b.reservation_id,
    })
    .await
    .unwrap();

    let redis = h.redis.as_ref().unwrap();
    let keys = keys_with_ttl(redis);
    assert!(
        keys.len() >= 8,
        "levels, records and the idempotency entry: {keys:?}"
    );
    for (key, ttl) in &keys {
        assert!(*ttl > 0, "{key} has no TTL ({ttl})");
        assert!(
            *ttl <= 5_000,
            "{key} lives longer than its state needs: {ttl} ms"
        );
    }
    // The ledger's rows live until the end of their hour (day) plus its retention.
    let mut conn = redis.conn();
    let ledger: Vec<String> = conn.keys("ctxb:*:l:*").unwrap();
    // (Two of each if the test straddles an hour's end.)
    let hourly = ledger.iter().filter(|k| k.contains(":l:h:")).count();
    assert!(
        (1..=2).contains(&hourly) && (1..=2).contains(&(ledger.len() - hourly)),
        "hourly and daily hashes: {ledger:?}"
    );
    for k in &ledger {
        let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut conn).unwrap();
        let most = if k.contains(":l:h:") {
            2 * 3_600_000
        } else {
            2 * 86_400_000
        };
        assert!(ttl > 0 && ttl <= most, "{k}: TTL {ttl} ms, at most {most}");
    }
    let longest = keys.iter().map(|(_, t)| *t).max().unwrap() as u64;
    tokio::time::sleep(Duration::from_millis(longest + 200)).await;
    let left: Vec<String> = redis.conn().keys("*").unwrap();
    let left: Vec<&String> = left
        .iter()
        .filter(|k| !k.starts_with("ctxb:cfg") && !is_ledger(k))
        .collect();
    assert!(left.is_empty(), "idle state must expire: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_keep_each_tenant_in_one_hash_slot() {
    let mut h = Harness::start(support::Backend::Redis, SHORT).await;
    for (t, u) in [("a}b", "{c}"), ("a:u:x", "y"), ("t", "u")] {
        let r = h
            .client
            .check_and_reserve(reserve(t, u, "t", 1, 1))
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed);
    }
    let redis = h.redis.as_ref().unwrap();
    let keys: Vec<String> = redis.conn().keys("*").unwrap();
    for key in &keys {
        if key == "ctxb:g" || key.starts_with("ctxb:cfg") {
            continue;
        }
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
    }
    // Redis Cluster hashes only what is between the first '{' and the next '}'.
    let tag = |key: &str| key[key.find('{').unwrap()..=key.find('}').unwrap()].to_string();
    let k = Keys::new(DEFAULT_PREFIX).unwrap();
    let tenant = TenantId::parse("a}b").unwrap();
    let user = UserId::parse("{c}").unwrap();
    let tk = k.level(Level::Tenant, Scope::new(&tenant, None));
    let uk = k.level(Level::User, Scope::new(&tenant, Some(&user)));
    assert!(keys.contains(&tk) && keys.contains(&uk), "{keys:?}");
    assert_eq!(tag(&tk), tag(&uk), "a tenant and its users share one slot");
    let records: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains(&tag(&tk)) && k.contains(":r:"))
        .collect();
    assert_eq!(
        records.len(),
        1,
        "the reservation record shares the tenant's slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_script_flush_and_flushall() {
    let mut h = Harness::start(support::Backend::Redis, SHORT).await;
    let ok = h
        .client
        .check_and_reserve(reserve("acme", "alice", "t", 1, 1))
        .await
        .unwrap();
    assert!(ok.into_inner().allowed);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut h.redis.as_ref().unwrap().conn())
        .unwrap();
    let after = h
        .client
        .check_and_reserve(reserve("acme", "alice", "t", 1, 1))
        .await;
    assert!(
        after
            .expect("NOSCRIPT is handled, not returned")
            .into_inner()
            .allowed
    );
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut h.redis.as_ref().unwrap().conn())
        .unwrap();
    let s = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            user_id: "alice".into(),
            tier: "t".into(),
            ..Default::default()
        })
        .await
        .expect("status after FLUSHALL")
        .into_inner();
    assert_eq!(
        limit(&s.limits, pb::Level::User, Dimension::Requests, 1).remaining,
        10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_key_aborts_before_anything_is_written() {
    let mut h = Harness::start(support::Backend::Redis, SHORT).await;
    let keys = Keys::new(DEFAULT_PREFIX).unwrap();
    let tenant = TenantId::parse("acme").unwrap();
    let user = UserId::parse("mallory").unwrap();
    let user_key = keys.level(Level::User, Scope::new(&tenant, Some(&user)));
    let mut conn = h.redis.as_ref().unwrap().conn();
    let _: () = conn.set(&user_key, "not a hash").unwrap();
    let err = h
        .client
        .check_and_reserve(reserve("acme", "mallory", "t", 100, 10))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    let global: Option<String> = conn.hget("ctxb:g", "r1").unwrap();
    let tenant_hash: Option<String> = conn
        .hget(keys.level(Level::Tenant, Scope::new(&tenant, None)), "t1")
        .unwrap();
    assert_eq!(
        (global, tenant_hash),
        (None, None),
        "outer levels were written"
    );
    let records: Vec<String> = conn.keys("ctxb:*:r:*").unwrap();
    assert!(records.is_empty(), "{records:?}");
    let _: () = conn.del(&user_key).unwrap();
    let r = h
        .client
        .check_and_reserve(reserve("acme", "mallory", "t", 100, 10))
        .await
        .unwrap();
    assert!(r.into_inner().allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_truth() {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { requests = [{ limit = 3, period = "1d" }], concurrency = 3 }
"#;
    let redis = RedisServer::start();
    let mut a = Harness::start_with(settings(tier, Some(redis.url())), None).await;
    let mut b = Harness::start_with(settings(tier, Some(redis.url())), None).await;
    let mut allowed = Vec::new();
    for i in 0..6 {
        let c = if i % 2 == 0 {
            &mut a.client
        } else {
            &mut b.client
        };
        let r = c
            .check_and_reserve(reserve("acme", "alice", "t", 1, 1))
            .await
            .unwrap()
            .into_inner();
        if r.allowed {
            allowed.push(r.reservation_id);
        } else {
            assert_eq!(r.reason(), Reason::RpmExceeded);
        }
    }
    assert_eq!(allowed.len(), 3);
    let commit = |id: &str| pb::CommitRequest {
        reservation_id: id.into(),
        prompt_tokens: 1,
        completion_tokens: 1,
        ..Default::default()
    };
    let on_b = b
        .client
        .commit(commit(&allowed[0]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        on_b.outcome(),
        Outcome::Applied,
        "replica B settles A's reservation"
    );
    let on_a = a
        .client
        .commit(commit(&allowed[0]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(on_a.outcome(), Outcome::AlreadySettled);
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_unavailable() {
    let fail_closed = format!("{SHORT}\n[resilience]\npolicy = \"fail_closed\"\n");
    let mut h = Harness::start(support::Backend::Redis, &fail_closed).await;
    drop(h.redis.take());
    let err = h
        .client
        .check_and_reserve(reserve("acme", "alice", "t", 1, 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("retry"), "{}", err.message());
    // Starting while Redis is down is no error: tests/faults.rs
    // `serve_starts_before_redis_and_connects_once_it_answers`.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_that_fails_part_way_changes_nothing_and_applies_once_on_retry() {
    let tier = r#"
[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 1000000, period = "30d" }] }
user = { tokens = [{ limit = 1000000, period = "30d" }], concurrency = 5 }
"#;
    let mut h = Harness::start(support::Backend::Redis, tier).await;
    let r = h
        .client
        .check_and_reserve(reserve("acme", "bob", "t", 990, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed);
    let tenant_remaining = |s: &pb::GetStatusResponse| {
        limit(&s.limits, pb::Level::Tenant, Dimension::Tokens, 2_592_000).remaining
    };
    let status = pb::GetStatusRequest {
        tenant_id: "acme".into(),
        user_id: String::new(),
        tier: "t".into(),
        ..Default::default()
    };
    let before = h
        .client
        .get_status(status.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tenant_remaining(&before), 999_000);

    // Break the user level (the last one the commit touches), then commit.
    let keys = Keys::new(DEFAULT_PREFIX).unwrap();
    let (acme, bob) = (
        TenantId::parse("acme").unwrap(),
        UserId::parse("bob").unwrap(),
    );
    let user_key = keys.level(Level::User, Scope::new(&acme, Some(&bob)));
    let mut conn = h.redis.as_ref().unwrap().conn();
    let saved: Vec<u8> = redis::cmd("DUMP").arg(&user_key).query(&mut conn).unwrap();
    let _: () = conn.del(&user_key).unwrap();
    let _: () = conn.set(&user_key, "not a hash").unwrap();
    let commit = pb::CommitRequest {
        reservation_id: r.reservation_id.clone(),
        prompt_tokens: 5000,
        completion_tokens: 0,
        ..Default::default()
    };
    let err = h.client.commit(commit.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    let after = h
        .client
        .get_status(status.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        tenant_remaining(&after),
        999_000,
        "the tenant level was charged by a failed commit"
    );

    // Repair the user level; the retry applies exactly once.
    let _: () = conn.del(&user_key).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg(&user_key)
        .arg(0)
        .arg(saved)
        .query(&mut conn)
        .unwrap();
    let c = h.client.commit(commit.clone()).await.unwrap().into_inner();
    assert_eq!((c.outcome(), c.token_delta), (Outcome::Applied, 4000));
    let c = h.client.commit(commit).await.unwrap().into_inner();
    assert_eq!(c.outcome(), Outcome::AlreadySettled);
    let settled = h.client.get_status(status).await.unwrap().into_inner();
    assert_eq!(
        tenant_remaining(&settled),
        995_000,
        "charged once: 1000 reserved + 4000 overage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_learn_the_same_multiplier() {
    let tier = r#"
[estimator]
window = 50
min_samples = 10

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
user = { tokens = [{ limit = 100000000, period = "1d" }] }
"#;
    let redis = RedisServer::start();
    let mut a = Harness::start_with(settings(tier, Some(redis.url())), None).await;
    let mut b = Harness::start_with(settings(tier, Some(redis.url())), None).await;
    let request = pb::CheckAndReserveRequest {
        prompt_tokens: None,
        prompt: "Count me, then learn how far off the count was.".into(),
        model: "claude-3-5-sonnet".into(),
        ..reserve("acme", "alice", "t", 0, 10)
    };
    for i in 0..40 {
        let c = if i % 2 == 0 {
            &mut a.client
        } else {
            &mut b.client
        };
        let r = c
            .check_and_reserve(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed);
        // This "model" uses 25% more prompt tokens than o200k_base counts.
        let actual = r.estimated_prompt_tokens * 5 / 4;
        let other = if i % 2 == 0 {
            &mut b.client
        } else {
            &mut a.client
        };
        other
            .commit(pb::CommitRequest {
                reservation_id: r.reservation_id,
                prompt_tokens: actual,
                completion_tokens: 5,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let ask = || pb::GetEstimatorRequest {
        model: "claude-3-5-sonnet".into(),
    };
    let ea = a.client.get_estimator(ask()).await.unwrap().into_inner();
    let eb = b.client.get_estimator(ask()).await.unwrap().into_inner();
    assert_eq!(ea.keys[0].samples, 40);
    assert_eq!(ea.keys[0].multiplier, 1.25);
    assert_eq!(
        ea.keys,
        eb.keys
            .iter()
            .map(|k| pb::EstimatorState {
                refreshed_ms_ago: ea.keys[0].refreshed_ms_ago,
                ..k.clone()
            })
            .collect::<Vec<_>>()
    );
    // Both replicas now reserve with the learned correction.
    let r = b
        .client
        .check_and_reserve(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.estimator_multiplier, 1.25);
    drop(redis);
}

/// Both stores report the same leases reclaimed, per level, when a reserve
/// finds leases that lapsed unsettled: the count behind
/// `ctxbudget_leases_expired_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_stores_count_lapsed_leases_alike() {
    use ctxbudget::domain::plan::{LeasePolicy, Prepared, ReserveRequest, Terms, prepare};
    use ctxbudget::domain::{Priorities, Priority, PromptCount, PromptInput};
    use ctxbudget::store::memory::MemoryStore;
    use ctxbudget::store::redis::{RedisSettings, RedisStore};
    use ctxbudget::store::{Reclaimed, ReserveReply, Store};

    let s = settings(SHORT, None);
    let plan = |user: &str, ttl: u64| {
        let req = ReserveRequest {
            tenant: TenantId::parse("acme").unwrap(),
            user: Some(UserId::parse(user).unwrap()),
            session: None,
            tier: "t".into(),
            model: "m".into(),
            fallbacks: Vec::new(),
            statuses: Default::default(),
            prompt: PromptInput::Tokens(10),
            max_output_tokens: 10,
            min_output_tokens: None,
            idempotency_key: None,
            lease_ttl_ms: Some(ttl),
            priority: Priority::Normal,
            declared: Default::default(),
        };
        let terms = Terms {
            limits: &s.limits,
            tier: s.limits.tier("t").unwrap(),
            leases: LeasePolicy {
                default_ttl_ms: 400,
                max_ttl_ms: 1000,
            },
            priorities: Priorities::default(),
            now_us: 0,
        };
        match prepare(&req, &req.model, &PromptCount::given(10), &terms).unwrap() {
            Prepared::Plan(p) => p,
            Prepared::Refused { .. } => panic!("planned"),
        }
    };
    async fn run<S: Store>(
        store: &S,
        plan: &dyn Fn(&str, u64) -> ctxbudget::domain::ReservePlan,
    ) -> Reclaimed {
        // Three unsettled leases of alice lapse; one of bob stays live.
        for _ in 0..3 {
            assert!(matches!(
                store.reserve(&plan("alice", 100)).await.unwrap(),
                ReserveReply::Allowed { .. }
            ));
        }
        assert!(matches!(
            store.reserve(&plan("bob", 1000)).await.unwrap(),
            ReserveReply::Allowed { .. }
        ));
        tokio::time::sleep(Duration::from_millis(250)).await;
        store
            .reserve(&plan("alice", 1000))
            .await
            .unwrap()
            .reclaimed()
    }
    let memory = MemoryStore::new(Keys::new(DEFAULT_PREFIX).unwrap(), s.retention);
    let from_memory = run(&memory, &plan).await;
    let redis = RedisServer::start();
    let store = RedisStore::connect(
        &RedisSettings {
            url: redis.url(),
            pool: Default::default(),
            connections: 1,
            timeout: Duration::from_secs(5),
            tls: Default::default(),
            cluster_nodes: Vec::new(),
        },
        Keys::new(DEFAULT_PREFIX).unwrap(),
        s.retention,
    )
    .await
    .unwrap();
    let from_redis = run(&store, &plan).await;
    for level in [Level::Global, Level::Tenant, Level::User] {
        assert_eq!(from_memory.at(level), 3, "memory, {level}");
    }
    assert_eq!(from_redis, from_memory, "the stores agree");
}
