//! Redis faults, with the real binary and a redis-server the test controls:
//! frozen (SIGSTOP), killed and restarted, flushed (SCRIPT FLUSH, FLUSHALL),
//! and out of memory under `noeviction`. For each: every call answers within
//! the store deadline plus a margin, decisions follow the failure policy, the
//! breaker opens and closes, leases from before the fault expire by their TTL,
//! and nothing panics.
//!
//! The margin is generous (a debug build on a shared 2-core machine): it bounds
//! a hang, not speed — a call waiting on a frozen Redis would take seconds.
#![allow(
    clippy::too_many_lines,
    reason = "a test is one scenario, read from start to end"
)]

mod support;

use ctxbudget::pb;
use pb::budget_service_client::BudgetServiceClient;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::RedisServer;
use support::process::Service;
use tonic::Code;
use tonic::transport::Channel;

type Client = BudgetServiceClient<Channel>;

/// The store deadline these tests configure.
const DEADLINE: Duration = Duration::from_millis(100);
/// Slack on top of the deadline for scheduling on a busy machine.
const MARGIN: Duration = Duration::from_millis(1000);
/// The lease of a reservation that names none.
const LEASE: Duration = Duration::from_millis(2000);

/// Limits and a quick breaker; `policy` picks the failure policy.
fn config(policy: &str) -> String {
    format!(
        r#"
[store]
timeout_ms = {deadline}

[resilience]
policy = "{policy}"
replicas = 2
breaker_window_ms = 2000
breaker_min_calls = 5
breaker_failure_rate = 0.5
breaker_cool_down_ms = 300
breaker_probes = 2
breaker_close_after = 2

[reservations]
default_lease_ttl_ms = {lease}
max_lease_ttl_ms = 60000
retention_ms = 60000
idempotency_ttl_ms = 60000
retry_jitter_ms = 0
concurrency_retry_ms = 1000

[global]
concurrency = 1000

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = {{ requests = [{{ limit = 100000, period = "1m" }}], concurrency = 500 }}
user = {{ requests = [{{ limit = 100000, period = "1m" }}], concurrency = 4 }}

[tiers.small]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = {{ requests = [{{ limit = 10, period = "1h" }}] }}
"#,
        deadline = DEADLINE.as_millis(),
        lease = LEASE.as_millis(),
    )
}

fn reserve(tenant: &str, user: &str, tier: &str) -> pb::CheckAndReserveRequest {
    support::reserve(tenant, user, tier, 10, 10)
}

/// One call the load made.
#[derive(Debug)]
struct Call {
    rpc: &'static str,
    started: Instant,
    took: Duration,
    /// Reserve: (allowed, degraded). Commit: (true, already settled).
    result: Result<(bool, bool), Code>,
    /// The error's message, if it failed.
    message: String,
    /// Commit: when its reservation was asked for.
    reserved_at: Option<Instant>,
    /// Commit: the last attempt for its reservation (the gateway gave up
    /// retrying, or it answered).
    last: bool,
}

/// Gateways in a loop: reserve, then commit — retrying the commit while the
/// store is unavailable, as a gateway should, so no usage is lost.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Call>>>,
}

/// Runs `call` with a hard cap, so a hang is recorded instead of blocking.
async fn timed<T>(
    rpc: &'static str,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    result: impl Fn(&T) -> (bool, bool),
) -> (Call, Option<T>) {
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), call).await;
    let took = started.elapsed();
    let (result, body, message) = match r {
        Ok(Ok(response)) => {
            let body = response.into_inner();
            (Ok(result(&body)), Some(body), String::new())
        }
        Ok(Err(status)) => (Err(status.code()), None, status.message().to_string()),
        Err(_) => (Err(Code::DeadlineExceeded), None, String::new()),
    };
    (
        Call {
            rpc,
            started,
            took,
            result,
            message,
            reserved_at: None,
            last: false,
        },
        body,
    )
}

impl Load {
    fn start(client: &Client, tenant: &str, gateways: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..gateways)
            .map(|g| {
                let mut c = client.clone();
                let stop = stop.clone();
                let tenant = tenant.to_string();
                tokio::spawn(async move {
                    let mut calls = Vec::new();
                    let mut commits = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let reserved_at = Instant::now();
                        let (call, body) = timed(
                            "CheckAndReserve",
                            c.check_and_reserve(reserve(&tenant, &format!("u{g}"), "t")),
                            |r: &pb::CheckAndReserveResponse| (r.allowed, r.degraded),
                        )
                        .await;
                        calls.push(call);
                        if let Some(r) = body.filter(|r| r.allowed) {
                            commits.push(tokio::spawn(commit_until_done(
                                c.clone(),
                                r.reservation_id,
                                reserved_at,
                            )));
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    for commit in commits {
                        calls.extend(commit.await.expect("a commit task panicked"));
                    }
                    calls
                })
            })
            .collect();
        Load { stop, tasks }
    }

    async fn stop(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.expect("a load task panicked"));
        }
        all
    }
}

/// Commits a reservation, retrying while the store is unavailable (as a
/// gateway should: usage is never dropped), for up to 15 seconds.
async fn commit_until_done(
    mut c: Client,
    reservation_id: String,
    reserved_at: Instant,
) -> Vec<Call> {
    let mut calls = Vec::new();
    for _ in 0..300 {
        let (call, _) = timed(
            "Commit",
            c.commit(pb::CommitRequest {
                reservation_id: reservation_id.clone(),
                prompt_tokens: 10,
                completion_tokens: 5,
                ..Default::default()
            }),
            |r: &pb::CommitResponse| (true, r.outcome() == pb::Outcome::AlreadySettled),
        )
        .await;
        let mut call = call;
        call.reserved_at = Some(reserved_at);
        let retry = call.result == Err(Code::Unavailable);
        calls.push(call);
        if !retry {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(final_attempt) = calls.last_mut() {
        final_attempt.last = true;
    }
    calls
}

/// Every reservation's Commit ended applied (or already applied by an
/// earlier attempt that timed out): no usage was lost.
/// Commits each reservation (10 + 5 tokens); each must apply.
async fn commit_all(c: &mut Client, ids: Vec<String>, what: &str) {
    for id in ids {
        let done = c
            .commit(pb::CommitRequest {
                reservation_id: id.clone(),
                prompt_tokens: 10,
                completion_tokens: 5,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{what}: {id}: {e:?}"))
            .into_inner();
        assert_eq!(done.outcome(), pb::Outcome::Applied, "{what}: {id}");
    }
}

fn assert_every_commit_landed(calls: &[Call]) {
    let lost: Vec<_> = calls
        .iter()
        .filter(|c| c.rpc == "Commit" && c.last && c.result.is_err())
        .collect();
    assert!(lost.is_empty(), "commits that never landed: {lost:?}");
    assert!(
        calls.iter().any(|c| c.rpc == "Commit" && c.last),
        "commits were made"
    );
}

/// Every call answered within the deadline plus the margin.
fn assert_bounded(calls: &[Call]) {
    assert!(!calls.is_empty(), "the load made calls");
    let slowest = calls.iter().max_by_key(|c| c.took).unwrap();
    assert!(
        slowest.took <= DEADLINE + MARGIN,
        "a call took {:?} (deadline {DEADLINE:?} + margin {MARGIN:?}): {slowest:?}",
        slowest.took
    );
}

/// The log holds no panic and the process is still up.
fn assert_healthy(svc: &mut Service) {
    let log = svc.log();
    assert!(!log.contains("panicked"), "a panic:\n{log}");
    assert!(svc.alive(), "the service died:\n{log}");
}

async fn health(addr: std::net::SocketAddr) -> Option<i32> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .ok()?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "ctxbudget.v1.BudgetService".into(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
}

async fn wait_health(addr: std::net::SocketAddr, want: i32, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let got = health(addr).await;
        if got == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: health is {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

async fn tenant_leases(c: &mut Client, tenant: &str, user: &str) -> u64 {
    let s = c
        .get_status(pb::GetStatusRequest {
            tenant_id: tenant.into(),
            user_id: user.into(),
            tier: "t".into(),
            ..Default::default()
        })
        .await
        .expect("status")
        .into_inner();
    let level = if user.is_empty() {
        pb::Level::Tenant
    } else {
        pb::Level::User
    };
    s.leases
        .iter()
        .find(|l| l.level() == level)
        .map_or(0, |l| l.active)
}

/// Waits (blocking the test thread is fine: the service is another process).
fn breaker(svc: &Service, state: f64, what: &str) {
    svc.wait_metric(
        "ctxbudget_breaker_state",
        &[],
        Duration::from_secs(10),
        what,
        |v| v == state,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_is_bridged_by_local_decisions_and_recovers() {
    let redis = RedisServer::start();
    let mut svc = Service::start("frozen", &config("local"), Some(&redis.url()));
    let mut c = support::connect(svc.addr).await;
    let load = Load::start(&c, "load", 3);
    tokio::time::sleep(Duration::from_millis(500)).await;

    redis.freeze();
    let frozen_at = Instant::now();
    breaker(&svc, 2.0, "the breaker opens while Redis is frozen");
    // Local decisions: the tenant's 10 requests an hour, split between 2
    // replicas, allow 5 here — flagged degraded.
    let mut local_ids = Vec::new();
    let mut denied = 0;
    for _ in 0..10 {
        let r = c
            .check_and_reserve(reserve("small-co", "", "small"))
            .await
            .expect("the local policy answers without Redis")
            .into_inner();
        assert!(r.degraded, "{r:?}");
        if r.allowed {
            local_ids.push(r.reservation_id);
        } else {
            assert_eq!(r.reason(), pb::Reason::RpmExceeded);
            assert!(r.retry_after_ms > 0, "tells when to retry: {r:?}");
            denied += 1;
        }
    }
    assert_eq!((local_ids.len(), denied), (5, 5), "limit 10 / 2 replicas");
    let status = c
        .get_status(pb::GetStatusRequest {
            tenant_id: "small-co".into(),
            user_id: String::new(),
            tier: "small".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(status.degraded, "status says it is read from this replica");
    tokio::time::sleep(Duration::from_millis(2000).saturating_sub(frozen_at.elapsed())).await;

    redis.thaw();
    let thawed_at = Instant::now();
    breaker(&svc, 0.0, "the breaker closes once Redis answers");
    let r = c
        .check_and_reserve(reserve("after", "", "small"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed && !r.degraded, "decided by Redis again: {r:?}");
    // Reservations made locally settle locally.
    commit_all(
        &mut c,
        local_ids,
        "a degraded reservation commits after recovery",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = load.stop().await;

    assert_bounded(&calls);
    let reserves: Vec<_> = calls
        .iter()
        .filter(|c| c.rpc == "CheckAndReserve")
        .collect();
    assert!(
        reserves.iter().all(|c| c.result.is_ok()),
        "no reservation failed under `local`: {:?}",
        reserves.iter().find(|c| c.result.is_err())
    );
    assert!(
        reserves.iter().any(|c| c.result == Ok((true, true))),
        "some were degraded"
    );
    assert!(
        reserves
            .iter()
            .any(|c| c.started > thawed_at && matches!(c.result, Ok((_, false)))),
        "Redis decided again after the thaw"
    );
    let commits: Vec<_> = calls.iter().filter(|c| c.rpc == "Commit").collect();
    let failed: Vec<_> = commits
        .iter()
        .filter(|c| c.result.is_err() && c.result != Err(Code::Unavailable))
        .collect();
    assert!(
        failed.is_empty(),
        "commits fail only as UNAVAILABLE: {failed:?}"
    );

    // Leases from before the freeze (reservations whose answer timed out ran
    // once Redis thawed) expire by their TTL: none is left once it passes.
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    assert_eq!(
        tenant_leases(&mut c, "load", "").await,
        0,
        "no leaked lease"
    );
    assert!(
        svc.metric("ctxbudget_degraded_decisions_total", &[("policy", "local")])
            .unwrap_or(0.0)
            >= 10.0
    );
    assert_healthy(&mut svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_closed_then_recovers_and_old_leases_expire() {
    // Append-only with fsync on every write: the restarted Redis has its data.
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut svc = Service::start("killed", &config("fail_closed"), Some(&redis.url()));
    let mut c = support::connect(svc.addr).await;
    // A gateway takes 3 of the user's 4 slots, then crashes: never settled.
    // Long leases: their level must outlive the outage and the recovery (a
    // level key lives 2 leases + 1 s past its last write; leases that go with
    // an expired key are never reclaimed, so never counted).
    let mut crashed = Vec::new();
    for _ in 0..3 {
        let mut request = reserve("crash", "gw", "t");
        request.lease_ttl_ms = Some(30_000);
        let r = c.check_and_reserve(request).await.unwrap().into_inner();
        assert!(r.allowed);
        crashed.push(r.reservation_id);
    }
    assert_eq!(tenant_leases(&mut c, "crash", "gw").await, 3);
    let load = Load::start(&c, "load", 3);
    tokio::time::sleep(Duration::from_millis(300)).await;

    redis.kill();
    breaker(&svc, 2.0, "the breaker opens when Redis is gone");
    wait_health(
        svc.addr,
        NOT_SERVING,
        Duration::from_secs(5),
        "fail_closed reports",
    )
    .await;
    let err = c
        .check_and_reserve(reserve("crash", "other", "t"))
        .await
        .expect_err("fail_closed refuses without Redis");
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("retry"), "says what to do: {err:?}");

    redis.restart();
    let restarted_at = Instant::now();
    wait_health(svc.addr, SERVING, Duration::from_secs(15), "recovers").await;
    breaker(&svc, 0.0, "the breaker closes");
    // The breaker half-opened only once every pooled connection answered a
    // PING, so no call after it closes meets a connection still reconnecting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let recovered_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let calls = load.stop().await;

    assert_bounded(&calls);
    let unexpected: Vec<_> = calls
        .iter()
        .filter(|c| c.result.is_err() && c.result != Err(Code::Unavailable))
        .collect();
    assert!(unexpected.is_empty(), "only UNAVAILABLE: {unexpected:?}");
    assert_every_commit_landed(&calls);
    // Once recovered, no call meets a missing script or a connection still
    // reconnecting. (On a loaded machine a call may still outlast the 100 ms
    // deadline — Redis here fsyncs every write — and a few such may open the
    // breaker again: those are the deadline doing its job.)
    let late: Vec<_> = calls
        .iter()
        .filter(|c| c.started >= recovered_at && c.result.is_err())
        .filter(|c| {
            !(c.message.contains("did not answer within")
                || c.message.contains("circuit breaker is open"))
        })
        .collect();
    assert!(
        late.is_empty(),
        "no error once recovered (scripts reloaded, connections back): {late:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.started > restarted_at && c.result == Ok((true, false))),
        "served by the restarted Redis"
    );

    // The crashed gateway's leases survived the restart (they renew); cut
    // short, they lapse by TTL and the next reservations reclaim them.
    for id in &crashed {
        let renewed = c
            .renew_lease(pb::RenewLeaseRequest {
                reservation_id: id.clone(),
                lease_ttl_ms: Some(200),
            })
            .await
            .expect("renew")
            .into_inner();
        assert_eq!(renewed.outcome(), pb::Outcome::Applied, "survived: {id}");
    }
    // Durability is proven: from here the test counts reclaimed leases, and a
    // reserve whose fsync outlasts the 100 ms deadline on a busy disk (CI
    // building beside it) would lose the count. Fsync once a second instead.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendfsync")
        .arg("everysec")
        .query(&mut redis.conn())
        .expect("config set");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let expired_before = svc
        .metric("ctxbudget_leases_expired_total", &[("level", "user")])
        .unwrap_or(0.0);
    for i in 0..4 {
        let r = c
            .check_and_reserve(reserve("crash", "gw", "t"))
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed && !r.degraded, "slot {i} is free again: {r:?}");
    }
    // Exactly these 3 at the user level (the count per level is checked
    // against both stores in tests/redis_store.rs).
    let expired = svc
        .metric("ctxbudget_leases_expired_total", &[("level", "user")])
        .unwrap_or(0.0)
        - expired_before;
    assert_eq!(expired, 3.0, "3 lapsed leases reclaimed, counted {expired}");
    assert!(
        svc.metric("ctxbudget_store_errors_total", &[("kind", "breaker_open")])
            .unwrap_or(0.0)
            > 0.0,
        "calls failed fast while open"
    );
    assert_healthy(&mut svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_allows_everything_flagged_degraded() {
    let mut redis = RedisServer::start();
    let mut svc = Service::start("open", &config("fail_open"), Some(&redis.url()));
    let mut c = support::connect(svc.addr).await;
    redis.kill();
    for i in 0..15 {
        let started = Instant::now();
        let r = c
            .check_and_reserve(reserve("small-co", "", "small"))
            .await
            .expect("fail_open answers")
            .into_inner();
        assert!(started.elapsed() <= DEADLINE + MARGIN);
        assert!(
            r.allowed && r.degraded,
            "call {i}: over the limit of 10, still allowed: {r:?}"
        );
        let done = c
            .refund(pb::RefundRequest {
                reservation_id: r.reservation_id,
            })
            .await
            .expect("a degraded reservation refunds")
            .into_inner();
        assert_eq!(done.outcome(), pb::Outcome::Applied);
    }
    breaker(&svc, 2.0, "the breaker opens");
    assert_healthy(&mut svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_flushall_mid_run_reach_no_client() {
    let redis = RedisServer::start();
    // What is tested is that no flush reaches a client, not the deadline: on
    // a busy 2-core machine a call (and the script reloads after SCRIPT
    // FLUSH) can outlast 100 ms, so this run allows a second.
    let config = config("fail_closed").replace("timeout_ms = 100\n", "timeout_ms = 1000\n");
    assert!(
        config.contains("timeout_ms = 1000"),
        "the deadline is raised"
    );
    let mut svc = Service::start("flush", &config, Some(&redis.url()));
    let c = support::connect(svc.addr).await;
    let load = Load::start(&c, "load", 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut redis.conn())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let flushed_at = Instant::now();
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    let flush_done = Instant::now();
    // Longer than the configuration version check: the emptied configuration
    // is noticed, refused, and the last good one kept.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls = load.stop().await;

    assert_bounded(&calls);
    for call in &calls {
        match (call.rpc, call.result) {
            ("CheckAndReserve", Ok((true, false))) | ("Commit", Ok(_)) => {}
            // Reservations taken before FLUSHALL are gone with it.
            ("Commit", Err(Code::NotFound)) if call.reserved_at.is_some_and(|t| t < flush_done) => {
            }
            _ => panic!("unexpected: {call:?}"),
        }
    }
    let landed = calls
        .iter()
        .filter(|c| c.rpc == "Commit" && c.last && c.result.is_ok())
        .count();
    assert!(landed > 0, "commits applied");
    assert!(
        calls
            .iter()
            .any(|c| c.started > flushed_at + Duration::from_millis(1200) && c.result.is_ok()),
        "still deciding with the last good configuration"
    );
    assert_eq!(svc.metric("ctxbudget_breaker_state", &[]), Some(0.0));
    assert!(
        svc.log().contains("invalid"),
        "the emptied configuration is reported"
    );
    assert_healthy(&mut svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_fails_by_policy_and_never_resets_a_counter() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let mut svc = Service::start("oom", &config("fail_closed"), Some(&redis.url()));
    let mut c = support::connect(svc.addr).await;
    let remaining = |s: &[pb::LimitStatus]| {
        support::limit(s, pb::Level::Tenant, pb::Dimension::Requests, 3600).remaining
    };
    let mut held = Vec::new();
    for _ in 0..3 {
        let r = c
            .check_and_reserve(reserve("mem", "", "small"))
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed);
        held.push(r.reservation_id);
    }
    let set_maxmemory = |bytes: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory", bytes])
            .query(&mut redis.conn())
            .unwrap();
    };
    set_maxmemory("1");
    // Two failures in five calls: below the breaker's rate, so it stays closed.
    for _ in 0..1 {
        let started = Instant::now();
        let err = c
            .check_and_reserve(reserve("mem", "", "small"))
            .await
            .expect_err("no memory to record a reservation: fail_closed refuses");
        assert!(started.elapsed() <= DEADLINE + MARGIN);
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(err.message().contains("OOM"), "says why: {err:?}");
    }
    let err = c
        .commit(pb::CommitRequest {
            reservation_id: held[0].clone(),
            prompt_tokens: 10,
            completion_tokens: 5,
            ..Default::default()
        })
        .await
        .expect_err("a commit cannot be written either");
    assert_eq!(err.code(), Code::Unavailable);
    // Reading still works, and the counter is what it was: 3 of 10 taken.
    let s = c
        .get_status(pb::GetStatusRequest {
            tenant_id: "mem".into(),
            user_id: String::new(),
            tier: "small".into(),
            ..Default::default()
        })
        .await
        .expect("status reads under OOM")
        .into_inner();
    assert_eq!(remaining(&s.limits), 7, "not reset");

    set_maxmemory("0");
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        match c.check_and_reserve(reserve("mem", "", "small")).await {
            Ok(r) => break r.into_inner(),
            Err(e) if e.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("Redis has memory again: {e:?}"),
        }
    };
    assert!(r.allowed);
    assert_eq!(
        remaining(&r.limits),
        6,
        "the count went on from 3, plus this one"
    );
    // The failed commit changed nothing: each held reservation still applies.
    commit_all(&mut c, held, "the held reservations settle").await;
    assert_healthy(&mut svc);
}

/// The default breaker and store deadline; only the policy, leases and
/// limits are set.
fn default_breaker_config(policy: &str, lease_ms: u64) -> String {
    format!(
        r#"
[resilience]
policy = "{policy}"

[reservations]
default_lease_ttl_ms = {lease_ms}
max_lease_ttl_ms = 600000
retention_ms = 60000
idempotency_ttl_ms = 60000
retry_jitter_ms = 0
concurrency_retry_ms = 1000

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = {{ requests = [{{ limit = 100000, period = "1m" }}], concurrency = 500 }}
user = {{ requests = [{{ limit = 100000, period = "1m" }}], concurrency = 4 }}

[tiers.daily]
max_context_tokens = 1000
default_max_output_tokens = 10
user = {{ requests = [{{ limit = 1000, period = "1d" }}], tokens = [{{ limit = 100000, period = "1d" }}], concurrency = 4 }}
"#
    )
}

/// Reserves until Redis decides again (not degraded); the time that took.
async fn until_decided_by_redis(c: &mut Client, within: Duration, what: &str) -> Duration {
    until_redis_decides(c, || reserve("probe", "p", "t"), within, what).await
}

/// Sends `request` until Redis decides it (not degraded), refunding the
/// reservations decided locally meanwhile; the time that took.
async fn until_redis_decides(
    c: &mut Client,
    request: impl Fn() -> pb::CheckAndReserveRequest,
    within: Duration,
    what: &str,
) -> Duration {
    let started = Instant::now();
    loop {
        if let Ok(r) = c.check_and_reserve(request()).await {
            let r = r.into_inner();
            if !r.degraded {
                assert!(r.allowed, "{r:?}");
                let took = started.elapsed();
                // A gateway retries a commit the store could not take yet.
                let calls = commit_until_done(c.clone(), r.reservation_id, started).await;
                assert_every_commit_landed(&calls);
                return took;
            }
            let _ = c
                .refund(pb::RefundRequest {
                    reservation_id: r.reservation_id,
                })
                .await;
        }
        assert!(
            started.elapsed() < within,
            "{what}: still degraded after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reserves until one is decided without Redis.
async fn until_degraded(c: &mut Client, what: &str) {
    let started = Instant::now();
    loop {
        if let Ok(r) = c.check_and_reserve(reserve("probe", "p", "t")).await
            && r.get_ref().degraded
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: never degraded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_default_settings_redis_decides_again_within_5_s_of_a_restart() {
    let mut redis = RedisServer::start();
    let mut svc = Service::start(
        "recovery",
        &default_breaker_config("local", 2000),
        Some(&redis.url()),
    );
    let mut c = support::connect(svc.addr).await;
    let load = Load::start(&c, "load", 3);
    // Outages of different lengths, after a freeze, and back to back: the
    // breaker is in a different state at each restart.
    let rounds: [(&str, bool, u64); 4] = [
        ("a short outage", false, 300),
        ("after a 1 s freeze", true, 1500),
        ("a long outage", false, 6000),
        ("straight after the last recovery", false, 100),
    ];
    let mut took = Vec::new();
    for (what, freeze_first, down_ms) in rounds {
        if freeze_first {
            redis.freeze();
            tokio::time::sleep(Duration::from_secs(1)).await;
            redis.thaw();
        }
        redis.kill();
        until_degraded(&mut c, what).await;
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        redis.restart(); // returns once Redis answers PING
        let t = until_decided_by_redis(&mut c, Duration::from_secs(15), what).await;
        println!(
            "{what}: decided by Redis {} ms after it accepted connections",
            t.as_millis()
        );
        took.push((what, t));
    }
    let calls = load.stop().await;
    let slow: Vec<_> = took
        .iter()
        .filter(|(_, t)| *t > Duration::from_secs(5))
        .collect();
    assert!(
        slow.is_empty(),
        "recovery took over 5 s: {slow:?} (all: {took:?})"
    );
    assert!(
        calls
            .iter()
            .filter(|c| c.rpc == "CheckAndReserve")
            .all(|c| c.result.is_ok()),
        "no reservation failed under `local`"
    );
    assert_healthy(&mut svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_whose_store_call_timed_out_are_cancelled_when_redis_wakes() {
    let redis = RedisServer::start();
    // Leases of 10 minutes: only a cancellation can free them in this test.
    let mut svc = Service::start(
        "phantom",
        &default_breaker_config("local", 600_000),
        Some(&redis.url()),
    );
    let mut c = support::connect(svc.addr).await;
    let daily = |c: &pb::GetStatusResponse, d: pb::Dimension, p: u64| {
        support::limit(&c.limits, pb::Level::User, d, p).remaining
    };
    let read = |c: &mut Client| {
        let mut c = c.clone();
        async move {
            c.get_status(pb::GetStatusRequest {
                tenant_id: "stall".into(),
                user_id: "u".into(),
                tier: "daily".into(),
                ..Default::default()
            })
            .await
            .expect("status")
            .into_inner()
        }
    };
    let before = read(&mut c).await;
    assert_eq!(daily(&before, pb::Dimension::Requests, 86_400), 1000);

    // Frozen: the user's 4 reservations wait out the store deadline and are
    // decided locally; their scripts stay queued in Redis.
    redis.freeze();
    let calls = (0..4).map(|_| {
        let mut c = c.clone();
        async move {
            c.check_and_reserve(reserve("stall", "u", "daily"))
                .await
                .expect("decided locally")
                .into_inner()
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    assert!(
        answers.iter().all(|r| r.allowed && r.degraded),
        "{answers:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.thaw();
    let thawed = Instant::now();
    // Redis runs the 4 queued scripts as it wakes; each is refunded by id.
    let returned = loop {
        let s = read(&mut c).await;
        let leases = s
            .leases
            .iter()
            .find(|l| l.level() == pb::Level::User)
            .map_or(0, |l| l.active);
        if !s.degraded && leases == 0 && daily(&s, pb::Dimension::Requests, 86_400) == 1000 {
            break s;
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(20),
            "slots still held {:?} after the thaw: {s:?}",
            thawed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "slots, requests and tokens back {} ms after Redis woke",
        thawed.elapsed().as_millis()
    );
    // 4 × (10 prompt + 10 output) tokens came back too (the bucket refills
    // about 1 token a second, so a missed refund would show).
    let tokens = daily(&returned, pb::Dimension::Tokens, 86_400);
    assert!(tokens >= 100_000 - 20, "tokens returned: {tokens}");
    // Each of the 4 is cancelled, or found never to have reached Redis (a
    // call cut by its deadline before it was written); at least one ran.
    svc.wait_metric(
        "ctxbudget_cancellations_total",
        &[],
        Duration::from_secs(10),
        "every cancellation concluded",
        |v| v == 4.0,
    );
    let cancelled = svc
        .metric("ctxbudget_cancellations_total", &[("outcome", "cancelled")])
        .unwrap_or(0.0);
    let never_ran = svc
        .metric("ctxbudget_cancellations_total", &[("outcome", "not_found")])
        .unwrap_or(0.0);
    assert!(
        cancelled >= 1.0 && cancelled + never_ran == 4.0,
        "cancelled {cancelled}, never ran {never_ran}"
    );
    // The locally decided reservations settle locally; the user reserves
    // again, decided by Redis (once its breaker, tripped by the refunds tried
    // while Redis was frozen, has closed).
    let ids = answers.into_iter().map(|r| r.reservation_id).collect();
    commit_all(&mut c, ids, "the locally decided reservations commit").await;
    until_redis_decides(
        &mut c,
        || reserve("stall", "u", "daily"),
        Duration::from_secs(10),
        "the user, decided by Redis again",
    )
    .await;
    assert_healthy(&mut svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_store_go_through_the_breaker() {
    let redis = RedisServer::start();
    let mut svc = Service::start("refused", &config("fail_closed"), Some(&redis.url()));
    let mut c = support::connect(svc.addr).await;
    redis.freeze();
    for _ in 0..12 {
        // Too large for the tier: refused before any reservation, but its
        // limits are read from the store for the caller's headers.
        let r = c
            .check_and_reserve(support::reserve("big", "u", "t", 200_000, 10))
            .await
            .expect("a refusal is a decision, not an error")
            .into_inner();
        assert_eq!(r.reason(), pb::Reason::ContextTooLarge, "{r:?}");
    }
    breaker(&svc, 2.0, "the reads the refusals made opened the breaker");
    let failed_fast = svc
        .metric(
            "ctxbudget_store_errors_total",
            &[("op", "status"), ("kind", "breaker_open")],
        )
        .unwrap_or(0.0);
    assert!(
        failed_fast > 0.0,
        "later reads failed at once, without the deadline"
    );
    redis.thaw();
    assert_healthy(&mut svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_starts_before_redis_and_connects_once_it_answers() {
    // Nothing listens on these ports yet.
    let closed_port = support::free_port();
    let local_port = support::free_port();
    let url = |port: u16| format!("redis://127.0.0.1:{port}/0");
    let closed = Service::start(
        "early-closed",
        &config("fail_closed"),
        Some(&url(closed_port)),
    );
    let local = Service::start("early-local", &config("local"), Some(&url(local_port)));
    // Health is NOT_SERVING under fail_closed: connect without waiting for it.
    let mut cc = Client::new(
        Channel::from_shared(format!("http://{}", closed.addr))
            .unwrap()
            .connect_lazy(),
    );
    let mut lc = support::connect(local.addr).await;

    // Until Redis answers: the failure policy, and health says so.
    wait_health(
        closed.addr,
        NOT_SERVING,
        Duration::from_secs(5),
        "fail_closed before Redis",
    )
    .await;
    let err = cc
        .check_and_reserve(reserve("early", "u", "t"))
        .await
        .expect_err("fail_closed refuses without Redis");
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("retry"), "says what to do: {err:?}");
    let r = lc
        .check_and_reserve(reserve("early", "u", "t"))
        .await
        .expect("local decides without Redis")
        .into_inner();
    assert!(r.allowed && r.degraded, "{r:?}");
    // A tier the file lacks may exist in Redis: retry later, not "invalid".
    let err = lc
        .check_and_reserve(reserve("early", "u", "only-in-redis"))
        .await
        .expect_err("an unknown tier before the configuration is loaded");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    wait_health(local.addr, SERVING, Duration::from_secs(5), "local serves").await;

    // Redis comes up: both connect, seed it from their file, and decide by it.
    let redis_closed = RedisServer::start_on(closed_port);
    let redis_local = RedisServer::start_on(local_port);
    wait_health(
        closed.addr,
        SERVING,
        Duration::from_secs(10),
        "fail_closed once Redis answers",
    )
    .await;
    for (c, redis, what) in [
        (&mut cc, &redis_closed, "fail_closed"),
        (&mut lc, &redis_local, "local"),
    ] {
        let started = Instant::now();
        let r = loop {
            if let Ok(r) = c.check_and_reserve(reserve("late", "u", "t")).await
                && !r.get_ref().degraded
            {
                break r.into_inner();
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what}: never decided by Redis"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(r.allowed, "{what}: {r:?}");
        // The replica seeds Redis from its file shortly after Redis answers
        // (it retries at most every 500 ms).
        let seeded = Instant::now();
        loop {
            let version: Option<u64> = redis::cmd("HGET")
                .arg("ctxb:cfg")
                .arg("version")
                .query(&mut redis.conn())
                .unwrap();
            if version >= Some(1) {
                break;
            }
            assert!(
                seeded.elapsed() < Duration::from_secs(10),
                "{what}: the file's configuration seeded Redis"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let r = lc
        .check_and_reserve(reserve("late", "u", "t"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed && !r.degraded, "{r:?}");
}

#[test]
fn wrong_store_settings_are_still_a_start_up_error() {
    let dir = std::env::temp_dir().join(format!("ctxbudget-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, &[&str], &str); 2] = [
        (
            "a malformed URL",
            &["--redis-url", "redis://127.0.0.1:notaport/0"],
            "invalid Redis URL",
        ),
        (
            "a missing TLS file",
            &["--config", "tls.toml"],
            "cannot read the Redis TLS CA",
        ),
    ];
    std::fs::write(
        dir.join("tls.toml"),
        "[store]\nredis_url = \"rediss://127.0.0.1:1/0\"\ntls_ca = \"/nonexistent/ca.pem\"\n",
    )
    .unwrap();
    for (what, args, says) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxbudget"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .env_remove("CTXBUDGET_REDIS_URL")
            .current_dir(&dir)
            .output()
            .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: refused at start-up");
        assert!(stderr.contains(says), "{what}: says why: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_caller_gave_up_waiting_is_cancelled() {
    gave_up_and_cancelled("gave-up", || reserve("impatient", "u", "daily")).await;
}

/// The same with fallback candidates: sent together, any of them may be the
/// reservation the store makes, so each is cancelled (the one made refunded,
/// the others found never made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_among_candidates_whose_caller_gave_up_is_cancelled() {
    gave_up_and_cancelled("gave-up-candidates", || pb::CheckAndReserveRequest {
        model: String::new(),
        candidate_models: vec!["a-1".into(), "b-1".into()],
        ..reserve("impatient", "u", "daily")
    })
    .await;
}

/// Two calls of `ask` (tenant `impatient`, user `u`, tier `daily`) whose
/// caller gives up while Redis is frozen: once it thaws, their leases and
/// requests come back.
async fn gave_up_and_cancelled(name: &str, ask: impl Fn() -> pb::CheckAndReserveRequest) {
    let redis = RedisServer::start();
    // A store deadline far longer than the caller waits: only the caller's
    // own deadline ends these calls.
    let config = format!(
        "[store]\ntimeout_ms = 3000\n{}",
        default_breaker_config("fail_closed", 600_000)
    );
    let mut svc = Service::start(name, &config, Some(&redis.url()));
    let mut c = support::connect(svc.addr).await;
    redis.freeze();
    for _ in 0..2 {
        let mut request = tonic::Request::new(ask());
        request.set_timeout(Duration::from_millis(200));
        let err = c
            .check_and_reserve(request)
            .await
            .expect_err("the caller's deadline passes first");
        assert!(
            matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{err:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.thaw(); // the queued reservations run now; nobody has their ids
    let thawed = Instant::now();
    loop {
        let s = c
            .get_status(pb::GetStatusRequest {
                tenant_id: "impatient".into(),
                user_id: "u".into(),
                tier: "daily".into(),
                ..Default::default()
            })
            .await
            .expect("status")
            .into_inner();
        let leases = s
            .leases
            .iter()
            .find(|l| l.level() == pb::Level::User)
            .map_or(0, |l| l.active);
        let requests =
            support::limit(&s.limits, pb::Level::User, pb::Dimension::Requests, 86_400).remaining;
        if leases == 0 && requests == 1000 {
            break;
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(15),
            "still held after the thaw: {leases} leases, {requests} requests left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cancelled = svc
        .metric("ctxbudget_cancellations_total", &[("outcome", "cancelled")])
        .unwrap_or(0.0);
    assert!(cancelled >= 1.0, "cancelled {cancelled}");
    assert_healthy(&mut svc);
}

/// Fallback candidates without Redis: under `local`, each candidate is
/// decided from this replica's memory (its share of each limit), in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_candidates_follow_the_local_policy_without_redis() {
    let mut redis = RedisServer::start();
    let models = r#"
[models.a]
match = ["a-*"]
global = { requests = [{ limit = 2, period = "1h" }] }

[models.b]
match = ["b-*"]
"#;
    let cfg = format!("{}{models}", config("local"));
    let mut svc = Service::start("fallback", &cfg, Some(&redis.url()));
    let mut c = support::connect(svc.addr).await;
    redis.kill();
    let ask = || pb::CheckAndReserveRequest {
        model: String::new(),
        candidate_models: vec!["a-1".into(), "b-1".into()],
        ..reserve("acme", "u", "t")
    };
    let mut chosen = Vec::new();
    for _ in 0..2 {
        let started = Instant::now();
        let r = c
            .check_and_reserve(ask())
            .await
            .expect("the local policy answers")
            .into_inner();
        assert!(started.elapsed() <= DEADLINE + MARGIN + MARGIN);
        assert!(r.allowed && r.degraded, "{r:?}");
        chosen.push(r.chosen_model.clone());
        // Committed, the request stays spent (a refund would give it back).
        let done = c
            .commit(pb::CommitRequest {
                reservation_id: r.reservation_id,
                prompt_tokens: 1,
                completion_tokens: 1,
                ..Default::default()
            })
            .await
            .expect("a local reservation commits")
            .into_inner();
        assert_eq!(done.outcome(), pb::Outcome::Applied);
    }
    // a's 2 an hour, halved between 2 replicas: one here, then b.
    assert_eq!(chosen, ["a-1", "b-1"]);
    assert_healthy(&mut svc);
}
