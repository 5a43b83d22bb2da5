//! One behavioural suite, run end to end (gRPC server + tonic client) against
//! both stores: the in-memory store and a real redis-server. Whatever one store
//! does, the other must do too.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level, Outcome, Reason};
use std::time::Duration;
use support::{Backend, Harness, limit, reserve};
use tonic::Code;

on_every_store!(
    allowed_reservation_reports_every_limit,
    user_request_limit_denies_with_reason_level_and_retry,
    tenant_token_limit_denies_at_tenant_level,
    global_concurrency_denies_at_global_level,
    oversized_requests_are_refused_without_retry,
    a_denial_changes_nothing_anywhere,
    buckets_refill_continuously,
    commit_returns_surplus_and_charges_overage_into_debt,
    refund_returns_tokens_request_and_slot,
    commit_and_refund_are_idempotent,
    idempotency_key_returns_the_original_reservation,
    expired_leases_release_their_slots,
    renewed_lease_keeps_its_slot,
    bad_input_is_refused_and_changes_nothing,
    hostile_ids_get_separate_budgets,
    exactly_the_limit_under_2000_concurrent_requests,
    status_reads_without_reserving,
    enormous_overage_is_debt_not_a_crash,
    a_shorter_renewal_frees_the_slot_when_it_lapses,
    a_spent_idempotency_key_is_refused,
    text_prompts_are_counted_and_corrected,
    exactly_one_form_of_prompt_is_accepted,
    the_multiplier_converges_on_the_p95_of_committed_ratios,
    reduced_output_grants_what_fits,
    a_long_prompt_is_counted_off_the_executor,
    a_quota_in_shadow_reports_but_never_denies,
    an_override_replaces_its_tenants_tier_limits,
    the_concurrency_reset_is_the_earliest_live_lease,
);

type Client = pb::budget_service_client::BudgetServiceClient<tonic::transport::Channel>;

async fn reserve_ok(c: &mut Client, r: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    let resp = c
        .check_and_reserve(r)
        .await
        .expect("rpc succeeds")
        .into_inner();
    assert!(
        resp.allowed,
        "expected an allowed reservation, got {resp:#?}"
    );
    assert!(resp.reservation_id.starts_with("rsv_"));
    resp
}

async fn reserve_denied(
    c: &mut Client,
    r: pb::CheckAndReserveRequest,
) -> pb::CheckAndReserveResponse {
    let resp = c
        .check_and_reserve(r)
        .await
        .expect("rpc succeeds")
        .into_inner();
    assert!(!resp.allowed, "expected a denial, got {resp:#?}");
    assert!(
        resp.reservation_id.is_empty(),
        "a denial carries no reservation"
    );
    assert!(!resp.detail.is_empty(), "a denial says what to do");
    resp
}

async fn status(c: &mut Client, tenant: &str, user: &str, tier: &str) -> pb::GetStatusResponse {
    c.get_status(pb::GetStatusRequest {
        tenant_id: tenant.into(),
        user_id: user.into(),
        tier: tier.into(),
        ..Default::default()
    })
    .await
    .expect("status")
    .into_inner()
}

/// What must not change when nothing is reserved: every remaining value and
/// live lease count (reset times move with the clock).
type Snapshot = (Vec<(i32, i32, u64, i64)>, Vec<(i32, u64)>);

async fn snapshot(c: &mut Client, tenant: &str, user: &str, tier: &str) -> Snapshot {
    let s = status(c, tenant, user, tier).await;
    (
        s.limits
            .iter()
            .map(|l| (l.level, l.dimension, l.period_seconds, l.remaining))
            .collect(),
        s.leases.iter().map(|l| (l.level, l.active)).collect(),
    )
}

async fn commit(c: &mut Client, id: &str, prompt: u64, completion: u64) -> pb::CommitResponse {
    c.commit(pb::CommitRequest {
        reservation_id: id.into(),
        prompt_tokens: prompt,
        completion_tokens: completion,
        ..Default::default()
    })
    .await
    .expect("commit")
    .into_inner()
}

async fn refund(c: &mut Client, id: &str) -> pb::RefundResponse {
    c.refund(pb::RefundRequest {
        reservation_id: id.into(),
    })
    .await
    .expect("refund")
    .into_inner()
}

async fn renew(c: &mut Client, id: &str, ttl: u64) -> pb::RenewLeaseResponse {
    c.renew_lease(pb::RenewLeaseRequest {
        reservation_id: id.into(),
        lease_ttl_ms: Some(ttl),
    })
    .await
    .expect("renew")
    .into_inner()
}

const BASIC: &str = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100, period = "1m" }], tokens = [{ limit = 100000, period = "1m" }], concurrency = 50 }
user = { requests = [{ limit = 2, period = "1m" }], tokens = [{ limit = 5000, period = "1d" }], concurrency = 5 }
"#;

async fn allowed_reservation_reports_every_limit(backend: Backend) {
    let mut h = Harness::start(backend, BASIC).await;
    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 400, 0)).await;
    assert_eq!(r.reserved_tokens, 500, "prompt + the tier's default output");
    assert_eq!(r.max_output_tokens, 100);
    assert_eq!(r.reason(), Reason::Unspecified);
    assert_eq!(r.retry_after_ms, 0);
    assert_eq!(r.lease_expires_in_ms, 30_000);
    assert_eq!(
        r.limits.len(),
        6,
        "requests, tokens, concurrency at two levels"
    );
    let user_req = limit(&r.limits, Level::User, Dimension::Requests, 60);
    assert_eq!((user_req.limit, user_req.remaining), (2, 1));
    assert!(
        (29_000..=30_000).contains(&user_req.reset_after_ms),
        "{user_req:?}"
    );
    let user_tok = limit(&r.limits, Level::User, Dimension::Tokens, 86_400);
    assert_eq!((user_tok.limit, user_tok.remaining), (5000, 4500));
    let tenant_tok = limit(&r.limits, Level::Tenant, Dimension::Tokens, 60);
    assert_eq!(tenant_tok.remaining, 99_500);
    let conc = limit(&r.limits, Level::User, Dimension::Concurrency, 0);
    assert_eq!((conc.limit, conc.remaining), (5, 4));
    let conc = limit(&r.limits, Level::Tenant, Dimension::Concurrency, 0);
    assert_eq!((conc.limit, conc.remaining), (50, 49));
}

async fn user_request_limit_denies_with_reason_level_and_retry(backend: Backend) {
    let mut h = Harness::start(backend, BASIC).await;
    for _ in 0..2 {
        reserve_ok(&mut h.client, reserve("acme", "alice", "t", 10, 10)).await;
    }
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 10, 10)).await;
    assert_eq!(d.reason(), Reason::RpmExceeded);
    assert_eq!(d.limiting_level(), Level::User);
    assert_eq!(d.limiting_dimension(), Dimension::Requests);
    assert_eq!(d.limiting_period_seconds, 60);
    assert!(
        (28_000..=30_000).contains(&d.retry_after_ms),
        "one request refills every 30 s: {}",
        d.retry_after_ms
    );
    assert_eq!(
        limit(&d.limits, Level::User, Dimension::Requests, 60).remaining,
        0
    );
    // Another user of the same tenant is unaffected.
    reserve_ok(&mut h.client, reserve("acme", "bob", "t", 10, 10)).await;
}

async fn tenant_token_limit_denies_at_tenant_level(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 1000, period = "1m" }] }
user = { requests = [{ limit = 100, period = "1m" }] }
"#;
    let mut h = Harness::start(backend, tier).await;
    reserve_ok(&mut h.client, reserve("acme", "alice", "t", 500, 100)).await;
    let d = reserve_denied(&mut h.client, reserve("acme", "bob", "t", 500, 100)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    assert_eq!(d.limiting_level(), Level::Tenant);
    assert_eq!(d.limiting_dimension(), Dimension::Tokens);
    assert!(
        (11_000..=12_000).contains(&d.retry_after_ms),
        "200 more tokens at 1000/min take 12 s: {}",
        d.retry_after_ms
    );
    assert_eq!(
        limit(&d.limits, Level::Tenant, Dimension::Tokens, 60).remaining,
        400
    );
    // A request that fits the 400 left is allowed.
    reserve_ok(&mut h.client, reserve("acme", "bob", "t", 300, 100)).await;
}

async fn global_concurrency_denies_at_global_level(backend: Backend) {
    let tier = r#"
[global]
concurrency = 1

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { requests = [{ limit = 100, period = "1m" }] }
"#;
    let mut h = Harness::start(backend, tier).await;
    let first = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await;
    let d = reserve_denied(&mut h.client, reserve("other", "bob", "t", 1, 1)).await;
    assert_eq!(d.reason(), Reason::ConcurrencyExceeded);
    assert_eq!(d.limiting_level(), Level::Global);
    assert!(
        (1..=1000).contains(&d.retry_after_ms),
        "capped by concurrency_retry_ms: {}",
        d.retry_after_ms
    );
    let conc = limit(&d.limits, Level::Global, Dimension::Concurrency, 0);
    assert_eq!((conc.limit, conc.remaining), (1, 0));
    assert!(
        conc.reset_after_ms > 29_000,
        "the only lease lapses in ~30 s"
    );
    refund(&mut h.client, &first.reservation_id).await;
    reserve_ok(&mut h.client, reserve("other", "bob", "t", 1, 1)).await;
}

async fn oversized_requests_are_refused_without_retry(backend: Backend) {
    let mut h = Harness::start(backend, BASIC).await;
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 9_950, 100)).await;
    assert_eq!(d.reason(), Reason::ContextTooLarge);
    assert_eq!(d.retry_after_ms, 0);
    assert_eq!((d.reserved_tokens, d.max_output_tokens), (10_050, 100));
    assert_eq!(
        d.limits.len(),
        6,
        "limits for the gateway's headers, even on a refusal"
    );
    assert!(d.detail.contains("max context"), "{}", d.detail);
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 5_000, 100)).await;
    assert_eq!(d.reason(), Reason::RequestTooLarge);
    assert_eq!(d.limiting_level(), Level::User);
    assert_eq!(d.limiting_dimension(), Dimension::Tokens);
    assert_eq!(d.retry_after_ms, 0, "retrying cannot help");
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Requests, 60).remaining,
        2
    );
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Tokens, 86_400).remaining,
        5000
    );
}

async fn a_denial_changes_nothing_anywhere(backend: Backend) {
    let tier = r#"
[global]
requests = [{ limit = 1000, period = "1d" }]
tokens = [{ limit = 1000000, period = "30d" }]

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 1000, period = "1d" }], concurrency = 10 }
user = { requests = [{ limit = 10, period = "1d" }], tokens = [{ limit = 100000, period = "30d" }], concurrency = 1 }
"#;
    let mut h = Harness::start(backend, tier).await;
    let held = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 800, 100)).await;
    let before = snapshot(&mut h.client, "acme", "alice", "t").await;
    // Denied by the tenant's tokens while the user level would allow.
    let d = reserve_denied(&mut h.client, reserve("acme", "bob", "t", 100, 100)).await;
    assert_eq!(
        (d.reason(), d.limiting_level()),
        (Reason::TpmExceeded, Level::Tenant)
    );
    // Denied by the user's concurrency: must not use up the user's requests.
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await;
    assert_eq!(
        (d.reason(), d.limiting_level()),
        (Reason::ConcurrencyExceeded, Level::User)
    );
    let after = snapshot(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(before, after, "denials changed state");
    let bob = status(&mut h.client, "acme", "bob", "t").await;
    assert_eq!(
        limit(&bob.limits, Level::User, Dimension::Requests, 86_400).remaining,
        10
    );
    assert_eq!(
        limit(&bob.limits, Level::Global, Dimension::Requests, 86_400).remaining,
        999
    );
    commit(&mut h.client, &held.reservation_id, 800, 100).await;
}

async fn buckets_refill_continuously(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { requests = [{ limit = 2, period = "1s" }], tokens = [{ limit = 1000, period = "2s" }] }
"#;
    let mut h = Harness::start(backend, tier).await;
    reserve_ok(&mut h.client, reserve("acme", "alice", "t", 400, 100)).await;
    reserve_ok(&mut h.client, reserve("acme", "alice", "t", 400, 100)).await;
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 400, 100)).await;
    assert!(d.retry_after_ms <= 1000, "{d:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // 1.1 s refilled 2 requests and 550 tokens: one more fits, a second does not.
    reserve_ok(&mut h.client, reserve("acme", "alice", "t", 400, 100)).await;
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 400, 100)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    assert!(
        (800..=1000).contains(&d.retry_after_ms),
        "{}",
        d.retry_after_ms
    );
}

const DAILY: &str = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { requests = [{ limit = 2, period = "1d" }], tokens = [{ limit = 1000, period = "1d" }], concurrency = 1 }
"#;

async fn commit_returns_surplus_and_charges_overage_into_debt(backend: Backend) {
    let mut h = Harness::start(backend, DAILY).await;
    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 100, 100)).await;
    let c = commit(&mut h.client, &r.reservation_id, 50, 50).await;
    assert_eq!((c.outcome(), c.token_delta), (Outcome::Applied, -100));
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Tokens, 86_400).remaining,
        900
    );
    assert_eq!(s.leases[0].active, 0, "commit frees the slot");

    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 100, 100)).await;
    let c = commit(&mut h.client, &r.reservation_id, 700, 800).await;
    assert_eq!(c.token_delta, 1300);
    let s = status(&mut h.client, "acme", "alice", "t").await;
    let tokens = limit(&s.limits, Level::User, Dimension::Tokens, 86_400);
    assert_eq!(tokens.remaining, -600, "the overage is debt");
    assert!(
        tokens.reset_after_ms > 86_400_000,
        "debt extends the time to full"
    );
    // Requests are left, but the debt must be waited out first.
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 5, 5)).await;
    assert_eq!(
        (d.reason(), d.limiting_level()),
        (Reason::TpmExceeded, Level::User)
    );
    let expected_ms = 610 * 86_400;
    assert!(
        d.retry_after_ms <= expected_ms && d.retry_after_ms > expected_ms - 5_000,
        "610 tokens at 1000/day: {}",
        d.retry_after_ms
    );
}

async fn refund_returns_tokens_request_and_slot(backend: Backend) {
    let mut h = Harness::start(backend, DAILY).await;
    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 400, 100)).await;
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await;
    assert_eq!(d.reason(), Reason::ConcurrencyExceeded);
    let f = refund(&mut h.client, &r.reservation_id).await;
    assert_eq!((f.outcome(), f.refunded_tokens), (Outcome::Applied, 500));
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Requests, 86_400).remaining,
        2
    );
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Tokens, 86_400).remaining,
        1000
    );
    assert_eq!(s.leases[0].active, 0);
    reserve_ok(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await;
}

async fn commit_and_refund_are_idempotent(backend: Backend) {
    let mut h = Harness::start(backend, DAILY).await;
    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 100, 100)).await;
    let first = commit(&mut h.client, &r.reservation_id, 300, 0).await;
    assert_eq!(
        (first.outcome(), first.token_delta),
        (Outcome::Applied, 100)
    );
    let before = snapshot(&mut h.client, "acme", "alice", "t").await;
    let again = commit(&mut h.client, &r.reservation_id, 900, 0).await;
    assert_eq!(
        (again.outcome(), again.token_delta),
        (Outcome::AlreadySettled, 100)
    );
    let f = refund(&mut h.client, &r.reservation_id).await;
    assert_eq!(
        (f.outcome(), f.refunded_tokens),
        (Outcome::AlreadySettled, 0)
    );
    assert_eq!(snapshot(&mut h.client, "acme", "alice", "t").await, before);

    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 100, 100)).await;
    assert_eq!(
        refund(&mut h.client, &r.reservation_id).await.outcome(),
        Outcome::Applied
    );
    let before = snapshot(&mut h.client, "acme", "alice", "t").await;
    let f = refund(&mut h.client, &r.reservation_id).await;
    assert_eq!(
        (f.outcome(), f.refunded_tokens),
        (Outcome::AlreadySettled, 200)
    );
    let c = commit(&mut h.client, &r.reservation_id, 10, 10).await;
    assert_eq!((c.outcome(), c.token_delta), (Outcome::AlreadySettled, 0));
    assert_eq!(snapshot(&mut h.client, "acme", "alice", "t").await, before);
}

async fn idempotency_key_returns_the_original_reservation(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { requests = [{ limit = 5, period = "1d" }], concurrency = 2 }
"#;
    let mut h = Harness::start(backend, tier).await;
    let keyed = |tenant: &str, key: &str, prompt: u64| pb::CheckAndReserveRequest {
        idempotency_key: key.into(),
        ..reserve(tenant, "alice", "t", prompt, 10)
    };
    let a = reserve_ok(&mut h.client, keyed("acme", "k1", 100)).await;
    assert!(!a.replayed);
    let again = reserve_ok(&mut h.client, keyed("acme", "k1", 100)).await;
    assert!(again.replayed);
    assert_eq!(again.reservation_id, a.reservation_id);
    assert_eq!(again.reserved_tokens, 110);
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Requests, 86_400).remaining,
        4
    );
    assert_eq!(s.leases[0].active, 1, "one reservation, one slot");

    let err = h
        .client
        .check_and_reserve(keyed("acme", "k1", 999))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("idempotency_key"),
        "{}",
        err.message()
    );

    // Keys are scoped per tenant.
    let other = reserve_ok(&mut h.client, keyed("globex", "k1", 100)).await;
    assert_ne!(other.reservation_id, a.reservation_id);

    // Denials are not remembered: once a slot frees, the same key succeeds.
    let b = reserve_ok(&mut h.client, keyed("acme", "k2", 1)).await;
    let d = reserve_denied(&mut h.client, keyed("acme", "k3", 1)).await;
    assert_eq!(d.reason(), Reason::ConcurrencyExceeded);
    refund(&mut h.client, &b.reservation_id).await;
    let c = reserve_ok(&mut h.client, keyed("acme", "k3", 1)).await;
    assert!(!c.replayed);
}

async fn expired_leases_release_their_slots(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { tokens = [{ limit = 10000, period = "1d" }], concurrency = 1 }
"#;
    let mut h = Harness::start(backend, tier).await;
    let short = pb::CheckAndReserveRequest {
        lease_ttl_ms: Some(300),
        ..reserve("acme", "alice", "t", 900, 100)
    };
    let first = reserve_ok(&mut h.client, short.clone()).await;
    assert_eq!(first.lease_expires_in_ms, 300);
    let d = reserve_denied(&mut h.client, short.clone()).await;
    assert_eq!(d.reason(), Reason::ConcurrencyExceeded);
    assert!(
        d.retry_after_ms <= 300,
        "the lease lapses within 300 ms: {}",
        d.retry_after_ms
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(s.leases[0].active, 0, "the crashed gateway's slot is free");
    let second = reserve_ok(&mut h.client, short.clone()).await;
    let r = renew(&mut h.client, &first.reservation_id, 1000).await;
    assert_eq!(
        r.outcome(),
        Outcome::Expired,
        "a lapsed lease is not re-taken"
    );
    // A late Commit still charges what was used.
    let c = commit(&mut h.client, &first.reservation_id, 2500, 500).await;
    assert_eq!((c.outcome(), c.token_delta), (Outcome::Applied, 2000));
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Tokens, 86_400).remaining,
        6000
    );
    assert_eq!(
        s.leases[0].active, 1,
        "the late commit must not free the second reservation's slot"
    );
    commit(&mut h.client, &second.reservation_id, 900, 100).await;
}

async fn renewed_lease_keeps_its_slot(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { concurrency = 1 }
"#;
    let mut h = Harness::start(backend, tier).await;
    let short = pb::CheckAndReserveRequest {
        lease_ttl_ms: Some(400),
        ..reserve("acme", "alice", "t", 1, 1)
    };
    let r = reserve_ok(&mut h.client, short.clone()).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let renewed = renew(&mut h.client, &r.reservation_id, 3000).await;
    assert_eq!(
        (renewed.outcome(), renewed.expires_in_ms),
        (Outcome::Applied, 3000)
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let d = reserve_denied(&mut h.client, short.clone()).await;
    assert_eq!(
        d.reason(),
        Reason::ConcurrencyExceeded,
        "the renewed lease still holds"
    );
    assert_eq!(
        commit(&mut h.client, &r.reservation_id, 1, 1)
            .await
            .outcome(),
        Outcome::Applied
    );
    assert_eq!(
        renew(&mut h.client, &r.reservation_id, 1000)
            .await
            .outcome(),
        Outcome::AlreadySettled
    );
    reserve_ok(&mut h.client, short).await;
}

async fn bad_input_is_refused_and_changes_nothing(backend: Backend) {
    let mut h = Harness::start(backend, DAILY).await;
    let held = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 100, 100)).await;
    let before = snapshot(&mut h.client, "acme", "alice", "t").await;
    let c = &mut h.client;
    let invalid: Vec<(pb::CheckAndReserveRequest, &str)> = vec![
        (reserve("", "alice", "t", 1, 1), "tenant_id"),
        (reserve(&"x".repeat(257), "alice", "t", 1, 1), "tenant_id"),
        (reserve("acme", "al\u{7}ice", "t", 1, 1), "user_id"),
        (reserve("acme", "alice", "gold", 1, 1), "known tiers: t"),
        (reserve("acme", "alice", "", 1, 1), "tier"),
        (reserve("acme", "alice", &"t".repeat(65), 1, 1), "tier"),
        (reserve("acme", "alice", "t\n", 1, 1), "tier"),
        (
            reserve("acme", "alice", "t", (1 << 40) + 1, 1),
            "prompt_tokens",
        ),
        (
            reserve("acme", "alice", "t", 1, u64::MAX),
            "max_output_tokens",
        ),
        (
            pb::CheckAndReserveRequest {
                prompt_tokens: None,
                ..reserve("acme", "alice", "t", 1, 1)
            },
            "prompt_tokens",
        ),
        (
            pb::CheckAndReserveRequest {
                lease_ttl_ms: Some(60_001),
                ..reserve("acme", "alice", "t", 1, 1)
            },
            "lease_ttl_ms",
        ),
    ];
    for (req, field) in invalid {
        let err = c.check_and_reserve(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    let garbage = c
        .commit(pb::CommitRequest {
            reservation_id: "not-an-id".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument);
    let huge = c
        .commit(pb::CommitRequest {
            reservation_id: held.reservation_id.clone(),
            prompt_tokens: u64::MAX,
            completion_tokens: 0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(huge.code(), Code::InvalidArgument);

    // Well-formed ids that were never issued, or whose tier was edited.
    let real = ctxbudget::domain::ReservationId::parse(&held.reservation_id).unwrap();
    let mut unknown = real.clone();
    unknown.nonce[0] ^= 1;
    let mut edited = real.clone();
    edited.tier = "enterprise".into();
    for id in [unknown.to_string(), edited.to_string()] {
        let err = c
            .refund(pb::RefundRequest {
                reservation_id: id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{id}");
        let err = c
            .renew_lease(pb::RenewLeaseRequest {
                reservation_id: id,
                lease_ttl_ms: None,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
    }
    assert_eq!(
        snapshot(c, "acme", "alice", "t").await,
        before,
        "bad input changed state"
    );
    assert_eq!(
        commit(c, &held.reservation_id, 100, 100).await.outcome(),
        Outcome::Applied
    );
}

async fn hostile_ids_get_separate_budgets(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { requests = [{ limit = 1, period = "1d" }] }
"#;
    let mut h = Harness::start(backend, tier).await;
    let pairs = [
        ("a", "user:b"),
        ("a:user", "b"),
        ("a", "b"),
        ("a}", "b"),
        ("{a", "b"),
        ("a", "b:t"),
        ("a:u:b", "c"),
        ("ünïcødé 租户", "用户 🙂"),
    ];
    for (t, u) in pairs {
        reserve_ok(&mut h.client, reserve(t, u, "t", 1, 1)).await;
    }
    for (t, u) in pairs {
        let d = reserve_denied(&mut h.client, reserve(t, u, "t", 1, 1)).await;
        assert_eq!(d.reason(), Reason::RpmExceeded, "{t:?}/{u:?}");
    }
}

async fn exactly_the_limit_under_2000_concurrent_requests(backend: Backend) {
    // Every call is worked on (none shed: that is tests/service/overload.rs).
    let tier = r#"
[server]
listen = "127.0.0.1:0"
max_in_flight = 2048

[tiers.rate]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { requests = [{ limit = 100, period = "1d" }] }

[tiers.slots]
max_context_tokens = 10000
default_max_output_tokens = 100
user = { concurrency = 100 }
"#;
    let h = Harness::start(backend, tier).await;
    for (tier, reason) in [
        ("rate", Reason::RpmExceeded),
        ("slots", Reason::ConcurrencyExceeded),
    ] {
        let tasks: Vec<_> = (0..2000)
            .map(|_| {
                let mut c = h.client.clone();
                tokio::spawn(async move {
                    c.check_and_reserve(reserve("acme", "alice", tier, 10, 10))
                        .await
                        .map(|r| r.into_inner())
                })
            })
            .collect();
        let (mut allowed, mut denied) = (0, 0);
        for t in tasks {
            let r = t.await.unwrap().expect("every call answers");
            if r.allowed {
                allowed += 1;
            } else {
                assert_eq!(r.reason(), reason);
                denied += 1;
            }
        }
        assert_eq!((allowed, denied), (100, 1900), "tier {tier}");
    }
}

async fn status_reads_without_reserving(backend: Backend) {
    let mut h = Harness::start(backend, BASIC).await;
    let fresh = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&fresh.limits, Level::User, Dimension::Requests, 60).remaining,
        2
    );
    let before = snapshot(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(snapshot(&mut h.client, "acme", "alice", "t").await, before);
    reserve_ok(&mut h.client, reserve("acme", "alice", "t", 10, 10)).await;
    let s = status(&mut h.client, "acme", "alice", "t").await;
    let leases: Vec<_> = s
        .leases
        .iter()
        .map(|l| (l.level(), l.active, l.limit))
        .collect();
    assert_eq!(leases, vec![(Level::Tenant, 1, 50), (Level::User, 1, 5)]);
    let tenant_only = status(&mut h.client, "acme", "", "t").await;
    assert!(
        tenant_only
            .limits
            .iter()
            .all(|l| l.level() == Level::Tenant)
    );
    let err = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            user_id: String::new(),
            tier: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

async fn enormous_overage_is_debt_not_a_crash(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { tokens = [{ limit = 1000000, period = "30d" }], concurrency = 100 }
"#;
    let mut h = Harness::start(backend, tier).await;
    let max = 1u64 << 40;
    // Many reservations in flight, each committed with the largest usage accepted:
    // the key's life is capped, nothing overflows, each is charged once.
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(reserve_ok(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await);
    }
    for r in &held {
        let c = commit(&mut h.client, &r.reservation_id, max, max).await;
        assert_eq!(
            (c.outcome(), c.token_delta),
            (Outcome::Applied, (2 * max - 2) as i64)
        );
        let again = commit(&mut h.client, &r.reservation_id, max, max).await;
        assert_eq!(again.outcome(), Outcome::AlreadySettled, "charged once");
    }
    let d = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    let s = status(&mut h.client, "acme", "alice", "t").await;
    let tokens = limit(&s.limits, Level::User, Dimension::Tokens, 30 * 86_400);
    assert!(tokens.remaining < -(1i64 << 40), "{tokens:?}");
}

async fn a_shorter_renewal_frees_the_slot_when_it_lapses(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { concurrency = 1 }
"#;
    let mut h = Harness::start(backend, tier).await;
    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await;
    assert_eq!(r.lease_expires_in_ms, 30_000);
    let renewed = renew(&mut h.client, &r.reservation_id, 300).await;
    assert_eq!(renewed.outcome(), Outcome::Applied);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(s.leases[0].active, 0, "the shortened lease lapsed");
    reserve_ok(&mut h.client, reserve("acme", "alice", "t", 1, 1)).await;
    assert_eq!(
        renew(&mut h.client, &r.reservation_id, 300).await.outcome(),
        Outcome::Expired
    );
}

async fn a_spent_idempotency_key_is_refused(backend: Backend) {
    let mut h = Harness::start(backend, DAILY).await;
    let keyed = pb::CheckAndReserveRequest {
        idempotency_key: "once".into(),
        ..reserve("acme", "alice", "t", 10, 10)
    };
    let r = reserve_ok(&mut h.client, keyed.clone()).await;
    commit(&mut h.client, &r.reservation_id, 10, 10).await;
    let err = h.client.check_and_reserve(keyed).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("new key"), "{}", err.message());
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Requests, 86_400).remaining,
        1
    );
}

const ESTIMATING: &str = r#"
[estimator]
correction = "scalar"
window = 100
min_samples = 20
initial_multiplier = 1.15
min_multiplier = 1.0
max_multiplier = 3.0

[tiers.t]
max_context_tokens = 1000000
default_max_output_tokens = 100
user = { requests = [{ limit = 1000, period = "1d" }], tokens = [{ limit = 10000000, period = "1d" }] }

[tiers.small]
max_context_tokens = 50
default_max_output_tokens = 10
"#;

fn text_request(model: &str, prompt: &str) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        prompt_tokens: None,
        prompt: prompt.into(),
        model: model.into(),
        ..reserve("acme", "alice", "t", 0, 100)
    }
}

const PROMPT: &str = "Please summarize the following customer support conversation in three \
    bullet points, then suggest a reply that apologizes for the delay.";

async fn text_prompts_are_counted_and_corrected(backend: Backend) {
    use ctxbudget::estimator::Encoding;
    use ctxbudget::estimator::count::tiktoken_count;
    let mut h = Harness::start(backend, ESTIMATING).await;
    let expected = tiktoken_count(Encoding::O200kBase, PROMPT) as u64;
    let r = reserve_ok(&mut h.client, text_request("gpt-4o", PROMPT)).await;
    assert_eq!(r.estimated_prompt_tokens, expected);
    assert_eq!(r.estimator_multiplier, 1.15, "the initial multiplier");
    let corrected = (expected as f64 * 1.15).ceil() as u64;
    assert_eq!(r.reserved_tokens, corrected + 100);
    assert_eq!(r.granted_max_output_tokens, 100);

    // gpt-4 counts with cl100k_base; chat messages add OpenAI's format overhead.
    let chat = pb::CheckAndReserveRequest {
        prompt: String::new(),
        messages: vec![pb::Message {
            role: "user".into(),
            content: PROMPT.into(),
            name: String::new(),
        }],
        ..text_request("gpt-4", "")
    };
    let r = reserve_ok(&mut h.client, chat).await;
    let cl100k = tiktoken_count(Encoding::Cl100kBase, PROMPT) as u64;
    assert_eq!(
        r.estimated_prompt_tokens,
        cl100k + 1 + 3 + 3,
        "role, per-message and priming tokens"
    );

    // The caller's own count is used as is.
    let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 500, 100)).await;
    assert_eq!(
        (r.estimated_prompt_tokens, r.estimator_multiplier),
        (0, 1.0)
    );
    assert_eq!(r.reserved_tokens, 600);

    // Counting stops once the prompt is known to exceed the max context.
    let over = pb::CheckAndReserveRequest {
        tier: "small".into(),
        ..text_request("gpt-4o", &"word ".repeat(10_000))
    };
    let d = reserve_denied(&mut h.client, over).await;
    assert_eq!(d.reason(), Reason::ContextTooLarge);
    assert_eq!(
        d.estimated_prompt_tokens, 51,
        "stopped just past the 50-token context"
    );

    // Commit reports what the estimate missed by.
    let r = reserve_ok(&mut h.client, text_request("gpt-4o", PROMPT)).await;
    let c = commit(&mut h.client, &r.reservation_id, expected * 2, 10).await;
    assert_eq!(c.estimation_ratio, 2.0);
    assert_eq!(c.estimation_error_tokens, expected as i64);
}

async fn exactly_one_form_of_prompt_is_accepted(backend: Backend) {
    let mut h = Harness::start(backend, ESTIMATING).await;
    let several = pb::CheckAndReserveRequest {
        prompt_tokens: Some(10),
        ..text_request("gpt-4o", "hello")
    };
    let none = text_request("gpt-4o", "");
    let bad_role = pb::CheckAndReserveRequest {
        prompt: String::new(),
        messages: vec![pb::Message {
            role: "us\u{0}er".into(),
            content: "hi".into(),
            name: String::new(),
        }],
        ..text_request("gpt-4o", "")
    };
    let reduced_above_max = pb::CheckAndReserveRequest {
        allow_reduced_output: true,
        min_output_tokens: 500,
        ..text_request("gpt-4o", "hello")
    };
    for (req, field) in [
        (several, "prompt_tokens"),
        (none, "prompt_tokens"),
        (bad_role, "messages.role"),
        (reduced_above_max, "min_output_tokens"),
    ] {
        let err = h.client.check_and_reserve(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Requests, 86_400).remaining,
        1000
    );
}

async fn the_multiplier_converges_on_the_p95_of_committed_ratios(backend: Backend) {
    let mut h = Harness::start(backend, ESTIMATING).await;
    let model = "deepseek-chat";
    let mut ratios = Vec::new();
    for i in 0..120u64 {
        let r = reserve_ok(&mut h.client, text_request(model, PROMPT)).await;
        let estimated = r.estimated_prompt_tokens;
        // Actual usage is the estimate × 1.3 with ±5% noise.
        let noise = 0.95 + (i * 37 % 101) as f64 / 1000.0;
        let actual = (estimated as f64 * 1.3 * noise).round() as u64;
        commit(&mut h.client, &r.reservation_id, actual, 20).await;
        ratios.push(actual as f64 / estimated as f64);
    }
    // The window keeps the last 100; the multiplier is their P95.
    let window = &ratios[ratios.len() - 100..];
    let expected = ctxbudget::estimator::adaptive::p95(window);
    assert!((1.3..1.4).contains(&expected), "{expected}");
    let e = h
        .client
        .get_estimator(pb::GetEstimatorRequest {
            model: model.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(e.keys.len(), 1);
    assert_eq!(
        e.keys[0].key, "o200k_base",
        "a model of no table row: its encoding's key"
    );
    assert_eq!(e.keys[0].samples, 100);
    assert_eq!(e.keys[0].multiplier, expected);
    let r = reserve_ok(&mut h.client, text_request(model, PROMPT)).await;
    assert_eq!(r.estimator_multiplier, expected);
    let corrected = (r.estimated_prompt_tokens as f64 * expected).ceil() as u64;
    assert_eq!(r.reserved_tokens, corrected + 100);
}

async fn reduced_output_grants_what_fits(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 100
user = { tokens = [{ limit = 1000, period = "1d" }] }
"#;
    let mut h = Harness::start(backend, tier).await;
    let reduced = |prompt, max, min| pb::CheckAndReserveRequest {
        allow_reduced_output: true,
        min_output_tokens: min,
        ..reserve("acme", "alice", "t", prompt, max)
    };
    let r = reserve_ok(&mut h.client, reduced(700, 500, 100)).await;
    assert_eq!(
        (r.granted_max_output_tokens, r.reserved_tokens),
        (300, 1000)
    );
    assert_eq!(r.max_output_tokens, 500);
    let d = reserve_denied(&mut h.client, reduced(50, 100, 60)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    assert_eq!(d.granted_max_output_tokens, 0);
    refund(&mut h.client, &r.reservation_id).await;
    let full = reserve_ok(&mut h.client, reduced(100, 200, 10)).await;
    assert_eq!(
        full.granted_max_output_tokens, 200,
        "everything fits: the full output"
    );
    let plain = reserve_denied(&mut h.client, reserve("acme", "alice", "t", 600, 300)).await;
    assert_eq!(
        plain.reason(),
        Reason::TpmExceeded,
        "without reduced output it is all or nothing"
    );
}

async fn a_long_prompt_is_counted_off_the_executor(backend: Backend) {
    let mut h = Harness::start(backend, ESTIMATING).await;
    // Warm the tokenizer so the race below is about counting, not loading.
    reserve_ok(&mut h.client, text_request("gpt-4o", "warm up")).await;
    // About 800,000 tokens: half a second or more of counting, so the race
    // below has a wide margin on a busy 2-core machine (200,000 tokens, some
    // 130 ms, once lost it).
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(80_000);
    let mut big_client = h.client.clone();
    let big = tokio::spawn(async move {
        let r = big_client
            .check_and_reserve(text_request("gpt-4o", &long))
            .await;
        (r, std::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut small_done = Vec::new();
    for _ in 0..10 {
        reserve_ok(&mut h.client, reserve("acme", "bob", "t", 10, 10)).await;
        small_done.push(std::time::Instant::now());
    }
    let (big, big_done) = big.await.unwrap();
    let big = big.expect("the long prompt is answered").into_inner();
    assert!(
        big.allowed && big.estimated_prompt_tokens > 600_000,
        "{}",
        big.estimated_prompt_tokens
    );
    assert!(
        small_done[0] < big_done,
        "small requests were served while the long prompt was being counted"
    );
}

async fn a_quota_in_shadow_reports_but_never_denies(backend: Backend) {
    let tiers = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { requests = [{ limit = 100, period = "1d" }], tokens = [{ limit = 100000, period = "1d" }] }
shadow = { user = { requests = [{ limit = 3, period = "1d" }], concurrency = 5 } }

[tiers.strict]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { requests = [{ limit = 3, period = "1d" }], tokens = [{ limit = 100000, period = "1d" }] }
"#;
    let mut h = Harness::start(backend, tiers).await;
    let mut shadow_denied = 0;
    for i in 0..10 {
        let r = reserve_ok(&mut h.client, reserve("acme", "alice", "t", 10, 10)).await;
        if r.shadow_denied {
            shadow_denied += 1;
            assert_eq!(r.shadow_reason(), Reason::RpmExceeded);
            assert_eq!(r.shadow_limiting_level(), Level::User);
            assert!(!r.shadow_detail.is_empty());
        }
        // Settling works as usual; the shadow reservation is settled alongside.
        if i % 2 == 0 {
            commit(&mut h.client, &r.reservation_id, 5, 5).await;
        } else {
            refund(&mut h.client, &r.reservation_id).await;
        }
    }
    // Refunds give requests back, in shadow as when enforced: compare with the
    // same sequence under the strict quota enforced.
    let mut denied = 0;
    for i in 0..10 {
        let r = h
            .client
            .check_and_reserve(reserve("globex", "bob", "strict", 10, 10))
            .await
            .unwrap()
            .into_inner();
        if r.allowed {
            if i % 2 == 0 {
                commit(&mut h.client, &r.reservation_id, 5, 5).await;
            } else {
                refund(&mut h.client, &r.reservation_id).await;
            }
        } else {
            denied += 1;
        }
    }
    assert!(shadow_denied > 0, "the shadow quota saw denials");
    assert_eq!(
        shadow_denied, denied,
        "shadow reports exactly what enforcement denies"
    );
    // The enforced quota was charged as usual.
    let s = status(&mut h.client, "acme", "alice", "t").await;
    let used = 100 - limit(&s.limits, Level::User, Dimension::Requests, 86_400).remaining;
    assert_eq!(used, 5, "five committed, five refunded");
}

async fn an_override_replaces_its_tenants_tier_limits(backend: Backend) {
    let config = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { requests = [{ limit = 2, period = "1d" }] }

[overrides.bigco]
user = { requests = [{ limit = 500, period = "1d" }] }
"#;
    let mut h = Harness::start(backend, config).await;
    let s = status(&mut h.client, "bigco", "u", "t").await;
    assert_eq!(
        limit(&s.limits, Level::User, Dimension::Requests, 86_400).limit,
        500
    );
    for _ in 0..3 {
        reserve_ok(&mut h.client, reserve("bigco", "u", "t", 1, 1)).await;
    }
    reserve_ok(&mut h.client, reserve("smallco", "u", "t", 1, 1)).await;
    reserve_ok(&mut h.client, reserve("smallco", "u", "t", 1, 1)).await;
    let d = reserve_denied(&mut h.client, reserve("smallco", "u", "t", 1, 1)).await;
    assert_eq!(d.reason(), Reason::RpmExceeded);
}

async fn the_concurrency_reset_is_the_earliest_live_lease(backend: Backend) {
    let tier = r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { concurrency = 3 }
"#;
    let mut h = Harness::start(backend, tier).await;
    let reset = |limits: &[pb::LimitStatus]| {
        let l = limit(limits, Level::User, Dimension::Concurrency, 0);
        (l.remaining, l.reset_after_ms)
    };
    let lease = |ttl: u64| {
        let mut r = reserve("acme", "alice", "t", 1, 1);
        r.lease_ttl_ms = Some(ttl);
        r
    };
    // The only lease goes: nothing is held, so there is nothing to wait for.
    let only = reserve_ok(&mut h.client, lease(20_000)).await;
    commit(&mut h.client, &only.reservation_id, 1, 1).await;
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert_eq!(reset(&s.limits), (3, 0), "no live lease: {:?}", s.limits);
    let next = reserve_ok(&mut h.client, lease(25_000)).await;
    let (remaining, ms) = reset(&next.limits);
    assert_eq!(remaining, 2);
    assert!((24_000..=25_000).contains(&ms), "this lease's expiry: {ms}");
    refund(&mut h.client, &next.reservation_id).await;

    // Of two leases the earliest goes: the reset is the other one's expiry.
    let early = reserve_ok(&mut h.client, lease(10_000)).await;
    let late = reserve_ok(&mut h.client, lease(50_000)).await;
    assert!((9_000..=10_000).contains(&reset(&late.limits).1));
    commit(&mut h.client, &early.reservation_id, 1, 1).await;
    let s = status(&mut h.client, "acme", "alice", "t").await;
    let (remaining, ms) = reset(&s.limits);
    assert_eq!(remaining, 2);
    assert!((49_000..=50_000).contains(&ms), "the late lease: {ms}");

    // Renewing the earliest lease makes the next one the earliest.
    // (A reservation's own reply may still show the settled lease's expiry,
    // a lower bound: only GetStatus reads every lease.)
    let short = reserve_ok(&mut h.client, lease(20_000)).await;
    let s = status(&mut h.client, "acme", "alice", "t").await;
    assert!((19_000..=20_000).contains(&reset(&s.limits).1));
    renew(&mut h.client, &short.reservation_id, 55_000).await;
    let s = status(&mut h.client, "acme", "alice", "t").await;
    let (_, ms) = reset(&s.limits);
    assert!(
        (49_000..=50_000).contains(&ms),
        "renewed past the late one: {ms}"
    );
}
