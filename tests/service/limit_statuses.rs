//! `limit_statuses`, on every store: the caller chooses which limits'
//! statuses an answer carries (all by default, the binding ones, or none),
//! and the decision is the same whichever it chooses.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level, LimitStatuses};
use support::{Backend, Harness};

on_every_store!(
    every_limit_by_default_the_binding_ones_or_none,
    a_denial_says_why_whatever_the_caller_asks_to_see,
    an_unknown_choice_is_refused_and_reserves_nothing,
);

const CONFIG: &str = r#"
[global]
requests = [{ limit = 1000, period = "1m" }]
tokens = [{ limit = 100000, period = "1m" }]
concurrency = 100

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 100, period = "1m" }], tokens = [{ limit = 1000, period = "1m" }], concurrency = 10 }
user = { requests = [{ limit = 3, period = "1m" }], tokens = [{ limit = 1000, period = "1m" }], concurrency = 5 }
"#;

fn ask(user: &str, which: LimitStatuses) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        limit_statuses: which as i32,
        ..support::reserve("acme", user, "t", 90, 10)
    }
}

async fn reserve(h: &mut Harness, req: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    h.client.check_and_reserve(req).await.unwrap().into_inner()
}

async fn every_limit_by_default_the_binding_ones_or_none(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let all = reserve(&mut h, ask("a", LimitStatuses::Unspecified)).await;
    assert!(all.allowed, "{all:?}");
    assert_eq!(
        all.limits.len(),
        9,
        "3 levels × requests, tokens, concurrency"
    );
    let listed = reserve(&mut h, ask("b", LimitStatuses::All)).await;
    assert_eq!(listed.limits.len(), 9);

    // Binding: one per dimension, the one with the least room left. With
    // this third call: the user's 3 requests (2 left, 67%) against the
    // tenant's 100; the tenant's 1,000 tokens (700 left, 70%) against the
    // user's (90%); the tenant's 10 slots (7 free, 70%) against the user's
    // 5 (4 free, 80%).
    let binding = reserve(&mut h, ask("c", LimitStatuses::Binding)).await;
    assert!(binding.allowed, "{binding:?}");
    let at: Vec<_> = binding
        .limits
        .iter()
        .map(|l| (l.level(), l.dimension()))
        .collect();
    assert_eq!(
        at,
        [
            (Level::Tenant, Dimension::Tokens),
            (Level::Tenant, Dimension::Concurrency),
            (Level::User, Dimension::Requests),
        ],
        "{:?}",
        binding.limits
    );

    // None: the same decision, no statuses.
    let none = reserve(&mut h, ask("d", LimitStatuses::None)).await;
    assert!(none.allowed && !none.reservation_id.is_empty(), "{none:?}");
    assert_eq!(none.reserved_tokens, 100);
    assert!(none.limits.is_empty(), "{:?}", none.limits);
    // It reserved like the others: the tenant's tokens show 4 calls.
    let after = reserve(&mut h, ask("e", LimitStatuses::All)).await;
    let tenant_tokens = after
        .limits
        .iter()
        .find(|l| l.level() == Level::Tenant && l.dimension() == Dimension::Tokens)
        .unwrap();
    assert_eq!(tenant_tokens.remaining, 1000 - 5 * 100);
}

async fn a_denial_says_why_whatever_the_caller_asks_to_see(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    for _ in 0..3 {
        assert!(reserve(&mut h, ask("u", LimitStatuses::None)).await.allowed);
    }
    let none = reserve(&mut h, ask("u", LimitStatuses::None)).await;
    assert!(!none.allowed);
    assert_eq!(none.reason(), pb::Reason::RpmExceeded);
    assert_eq!(none.limiting_level(), Level::User);
    assert!(none.retry_after_ms > 0, "{none:?}");
    assert!(none.limits.is_empty());
    // Binding names the limit that denied among those it shows.
    let binding = reserve(&mut h, ask("u", LimitStatuses::Binding)).await;
    assert!(!binding.allowed);
    let denying = binding
        .limits
        .iter()
        .find(|l| l.level() == Level::User && l.dimension() == Dimension::Requests)
        .expect("the denying limit is shown");
    assert_eq!(denying.remaining, 0);
    assert!(binding.limits.len() <= 4, "{:?}", binding.limits);
    // A request no store could admit answers without reading the limits.
    let huge = pb::CheckAndReserveRequest {
        prompt_tokens: Some(20_000),
        ..ask("v", LimitStatuses::None)
    };
    let refused = reserve(&mut h, huge).await;
    assert_eq!(refused.reason(), pb::Reason::ContextTooLarge);
    assert!(refused.limits.is_empty());
}

async fn an_unknown_choice_is_refused_and_reserves_nothing(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let bad = pb::CheckAndReserveRequest {
        limit_statuses: 99,
        ..ask("u", LimitStatuses::All)
    };
    let e = h.client.check_and_reserve(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("limit_statuses"), "{}", e.message());
    assert!(
        e.message().contains("LIMIT_STATUSES_NONE"),
        "{}",
        e.message()
    );
    let first = reserve(&mut h, ask("u", LimitStatuses::All)).await;
    let user_requests = first
        .limits
        .iter()
        .find(|l| l.level() == Level::User && l.dimension() == Dimension::Requests)
        .unwrap();
    assert_eq!(user_requests.remaining, 2, "only this call took one");
}
