//! Waiting in line for the shared account (`max_wait_ms`), on the memory
//! store over gRPC: a call only the global level denies waits and is granted
//! when room comes — a refill, or a Refund — in fair order among tenants;
//! one denied at its own level, or whose time runs out, gets its denial; a
//! caller that goes away leaves the line.

use crate::support;

use ctxbudget::pb;
use pb::budget_service_client::BudgetServiceClient;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::{Backend, Harness};
use tonic::transport::Channel;

/// An account of one call at a time, tenants and users without limits of
/// their own that bind here, and a tier whose tenant allows one call.
const ONE_AT_A_TIME: &str = r#"
[global]
concurrency = 1

[tiers.open]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { concurrency = 100 }
user = { concurrency = 100 }

[tiers.single]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { concurrency = 1 }
"#;

fn call(tenant: &str, user: &str, tier: &str, max_wait_ms: u64) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        max_wait_ms,
        ..support::reserve(tenant, user, tier, 50, 50)
    }
}

/// A service on `config` whose account's one slot tenant `a` holds: the
/// service, a client, and the held reservation's id.
async fn with_the_slot_held(config: &str) -> (Harness, BudgetServiceClient<Channel>, String) {
    let h = Harness::start(Backend::Memory, config).await;
    let mut c = h.client.clone();
    let held = c
        .check_and_reserve(call("a", "u", "open", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(held.allowed, "{held:?}");
    (h, c, held.reservation_id)
}

async fn refund(c: &mut BudgetServiceClient<Channel>, id: String) {
    let r = c
        .refund(pb::RefundRequest { reservation_id: id })
        .await
        .expect("refund")
        .into_inner();
    assert_eq!(r.outcome(), pb::Outcome::Applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_is_granted_when_a_refund_returns_the_room() {
    let (h, mut c, held) = with_the_slot_held(ONE_AT_A_TIME).await;
    // Without waiting: today's denial, at the global level.
    let now = c
        .check_and_reserve(call("b", "u", "open", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(!now.allowed);
    assert_eq!(now.limiting_level(), pb::Level::Global);
    assert_eq!(now.waited_ms, 0);
    let mut waiter = h.client.clone();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let out = waiter
            .check_and_reserve(call("b", "u", "open", 10_000))
            .await;
        (out.unwrap().into_inner(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "it waits");
    refund(&mut c, held).await;
    let (out, took) = waiting.await.unwrap();
    assert!(
        out.allowed,
        "granted once the refund returned the slot: {out:?}"
    );
    assert!(out.waited_ms >= 250, "{out:?}");
    assert!(
        took < Duration::from_secs(8),
        "granted on the refund, not at its deadline: {took:?}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_at_its_deadline_with_the_denial() {
    let (h, mut c, _held) = with_the_slot_held(ONE_AT_A_TIME).await;
    let started = Instant::now();
    let out = c
        .check_and_reserve(call("b", "u", "open", 400))
        .await
        .unwrap()
        .into_inner();
    let took = started.elapsed();
    assert!(!out.allowed, "{out:?}");
    assert_eq!(out.limiting_level(), pb::Level::Global);
    assert!(out.retry_after_ms > 0, "says when to retry: {out:?}");
    assert!(out.waited_ms >= 400, "{out:?}");
    assert!(took >= Duration::from_millis(400), "{took:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_at_the_callers_own_level_is_answered_at_once() {
    let roomy = ONE_AT_A_TIME.replace(
        "concurrency = 1\n\n[tiers.open]",
        "concurrency = 10\n\n[tiers.open]",
    );
    let h = Harness::start(Backend::Memory, &roomy).await;
    let mut c = h.client.clone();
    // The tenant's own concurrency of 1 is full, the account is not:
    // waiting cannot help.
    let held = c
        .check_and_reserve(call("a", "u1", "single", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(held.allowed);
    let started = Instant::now();
    let out = c
        .check_and_reserve(call("a", "u2", "single", 5_000))
        .await
        .unwrap()
        .into_inner();
    assert!(!out.allowed);
    assert_eq!(out.limiting_level(), pb::Level::Tenant, "{out:?}");
    assert_eq!(out.waited_ms, 0);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_goes_away_leaves_the_line() {
    let (h, mut c, held) = with_the_slot_held(ONE_AT_A_TIME).await;
    // First in line, then gone: its client gives up after 200 ms.
    let mut gone = h.client.clone();
    let first = tokio::spawn(async move {
        let call = gone.check_and_reserve(call("b", "u", "open", 30_000));
        tokio::time::timeout(Duration::from_millis(200), call).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = h.client.clone();
    let next = tokio::spawn(async move {
        second
            .check_and_reserve(call("c", "u", "open", 30_000))
            .await
    });
    assert!(first.await.unwrap().is_err(), "the first caller gave up");
    tokio::time::sleep(Duration::from_millis(200)).await;
    refund(&mut c, held).await;
    // The second is granted on the refund: the first's ticket is not ahead
    // of it any more.
    let out = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("granted long before its deadline")
        .unwrap()
        .unwrap()
        .into_inner();
    assert!(out.allowed, "{out:?}");
    h.stop().await;
}

/// Callers of each (tenant, client, callers) looping for 4 s, each taking
/// the account's one slot when granted (tier `open`, waiting up to 2 s) and
/// giving it back at once: the grants per tenant. Shared with
/// `queue_replicas`, whose callers reach two replicas.
pub(crate) async fn grants_per_tenant(
    callers: &[(&'static str, &BudgetServiceClient<Channel>, usize)],
) -> BTreeMap<&'static str, u32> {
    let mut tasks = Vec::new();
    for &(tenant, client, n) in callers {
        for i in 0..n {
            let mut c = client.clone();
            let user = format!("u{i}");
            tasks.push(tokio::spawn(async move {
                let mut granted = 0u32;
                let until = Instant::now() + Duration::from_secs(4);
                while Instant::now() < until {
                    let out = c
                        .check_and_reserve(call(tenant, &user, "open", 2_000))
                        .await
                        .unwrap()
                        .into_inner();
                    if out.allowed {
                        granted += 1;
                        refund(&mut c, out.reservation_id).await;
                    }
                }
                (tenant, granted)
            }));
        }
    }
    let mut per_tenant = BTreeMap::new();
    for t in tasks {
        let (tenant, granted) = t.await.unwrap();
        *per_tenant.entry(tenant).or_default() += granted;
    }
    per_tenant
}

/// Asserts each tenant's share of the grants is `expected` within 0.1.
fn shares(per_tenant: &BTreeMap<&str, u32>, expected: &[(&str, f64)]) {
    let total: u32 = per_tenant.values().sum();
    assert!(total >= 30, "the account was used: {per_tenant:?}");
    for &(tenant, want) in expected {
        let share = f64::from(per_tenant[tenant]) / f64::from(total);
        assert!(
            (share - want).abs() < 0.1,
            "{tenant} got {share:.2} of the account, not {want:.2}: {per_tenant:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_waiting_for_the_account_share_it_equally() {
    let h = Harness::start(Backend::Memory, ONE_AT_A_TIME).await;
    // One tenant floods with 6 callers; it gets a third, as the others.
    let per_tenant = grants_per_tenant(&[
        ("flood", &h.client, 6),
        ("x", &h.client, 2),
        ("y", &h.client, 2),
    ])
    .await;
    let third = 1.0 / 3.0;
    shares(&per_tenant, &[("flood", third), ("x", third), ("y", third)]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_weight_two_gets_twice_the_share() {
    let weighted = format!("{ONE_AT_A_TIME}\n[overrides.big]\nweight = 2\n");
    let h = Harness::start(Backend::Memory, &weighted).await;
    let per_tenant = grants_per_tenant(&[("big", &h.client, 3), ("small", &h.client, 3)]).await;
    shares(&per_tenant, &[("big", 2.0 / 3.0), ("small", 1.0 / 3.0)]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_give_back_their_admission_slots() {
    // Two calls worked on at once, none queued for a slot.
    let config = format!(
        "{ONE_AT_A_TIME}\n[server]\nlisten = \"127.0.0.1:0\"\nmax_in_flight = 2\nqueue_ms = 0\n"
    );
    let (h, mut c, held) = with_the_slot_held(&config).await;
    let mut waiters = Vec::new();
    for tenant in ["b", "c", "d"] {
        let mut w = h.client.clone();
        waiters.push(tokio::spawn(async move {
            w.check_and_reserve(call(tenant, "u", "open", 3_000)).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Three wait, yet a call that does not is worked on, not shed: the
    // waiting calls hold no slot.
    let now = c.check_and_reserve(call("e", "u", "open", 0)).await;
    let now = now.expect("not shed while others wait").into_inner();
    assert!(!now.allowed);
    assert_eq!(now.limiting_level(), pb::Level::Global, "{now:?}");
    refund(&mut c, held).await;
    let mut granted = 0;
    for w in waiters {
        let out = w
            .await
            .unwrap()
            .expect("a waiting call is never shed")
            .into_inner();
        if out.allowed {
            granted += 1;
            refund(&mut c, out.reservation_id).await;
        }
    }
    assert!(granted >= 1, "the slot returned went to a waiting call");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_finds_the_line_full_is_answered_at_once() {
    let config = format!("{ONE_AT_A_TIME}\n[queue]\nmax_queued = 1\n");
    let (h, mut c, held) = with_the_slot_held(&config).await;
    let mut first = h.client.clone();
    let waiting =
        tokio::spawn(async move { first.check_and_reserve(call("b", "u", "open", 5_000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let out = c
        .check_and_reserve(call("c", "u", "open", 5_000))
        .await
        .unwrap()
        .into_inner();
    assert!(!out.allowed);
    assert_eq!(out.waited_ms, 0, "{out:?}");
    assert!(
        out.detail.contains("max_queued"),
        "says why: {}",
        out.detail
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    refund(&mut c, held).await;
    let granted = waiting.await.unwrap().unwrap().into_inner();
    assert!(granted.allowed, "the one in line is served: {granted:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_external_processor_waits_as_its_header_or_section_says() {
    use ctxbudget::envoy::service::ext_proc::v3::processing_response::Response as Answer;
    use support::ext_proc::{CHAT, one_request};
    let config = format!("{ONE_AT_A_TIME}\n[ext_proc]\ndefault_tier = \"open\"\nmax_wait_ms = 0\n");
    let (h, mut c, held) = with_the_slot_held(&config).await;
    let addr = h.addr;
    // The section says 0: a full account is answered 429 at once.
    let at_once = one_request(addr, None, &[("x-tenant-id", "b")], CHAT).await;
    match at_once {
        Answer::ImmediateResponse(r) => assert_eq!(r.status.unwrap().code, 429),
        other => panic!("expected a 429, got {other:#?}"),
    }
    // The header asks to wait: the body goes on once the refund returns
    // the account's slot.
    let waiting = tokio::spawn(async move {
        let headers = [("x-tenant-id", "c"), ("x-ctxbudget-max-wait-ms", "10000")];
        one_request(addr, None, &headers, CHAT).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "it waits");
    refund(&mut c, held).await;
    let answer = tokio::time::timeout(Duration::from_secs(8), waiting)
        .await
        .expect("granted on the refund")
        .unwrap();
    assert!(
        matches!(answer, Answer::RequestBody(_)),
        "the request goes on upstream: {answer:#?}"
    );
    // A header that is no number of milliseconds is refused, naming it.
    let bad = [("x-tenant-id", "d"), ("x-ctxbudget-max-wait-ms", "soon")];
    match one_request(addr, None, &bad, CHAT).await {
        Answer::ImmediateResponse(r) => {
            assert_eq!(r.status.unwrap().code, 400);
            let body = String::from_utf8_lossy(&r.body);
            assert!(body.contains("x-ctxbudget-max-wait-ms"), "{body}");
        }
        other => panic!("expected a 400, got {other:#?}"),
    }
    h.stop().await;
}
