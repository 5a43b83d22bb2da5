//! What ShouldRateLimit reports, against envoyproxy/ratelimit's behaviour: a
//! rule under trial (a quota in shadow) reports its limit and counts its
//! would-be denials even when it is the tier's only rule; a mapped descriptor
//! no limit binds has `limit_remaining` 4294967295, one no rule places (or of
//! a domain not served) 0; the status and the headers
//! describe the caller's own scope (user or tenant), never the size of the
//! upstream account (the global level), which a global denial answers with
//! `retry-after` alone. On every store.

use crate::envoy::{ask, descriptor, envoy_client, header, request};
use crate::support;

use ctxbudget::envoy::service::ratelimit::v3::rate_limit_response::Code;
use std::time::Duration;
use support::process::Service;
use support::{Backend, Harness, RedisServer};

on_every_store!(
    a_tier_all_in_shadow_reports_and_charges_its_trial_rule,
    headers_show_the_callers_scope_and_never_the_account,
);

const CONFIG: &str = r#"
[envoy]
default_tier = "free"

[global]
requests = [{ limit = 5, period = "1h" }]
tokens = [{ limit = 100000000, period = "1m" }]

[tiers.free]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 50, period = "1h" }], tokens = [{ limit = 5000000, period = "1d" }] }
user = { requests = [{ limit = 40, period = "1h" }], tokens = [{ limit = 50000, period = "1m" }] }

[tiers.trial]
max_context_tokens = 100000
default_max_output_tokens = 100
shadow = { tenant = { requests = [{ limit = 2, period = "1h" }] } }

[tiers.open]
max_context_tokens = 100000
default_max_output_tokens = 100
"#;

/// The same tiers with no global level: a tier with only a rule in shadow
/// then has nothing enforced at all.
fn without_global() -> String {
    CONFIG.replace(
        "[global]\nrequests = [{ limit = 5, period = \"1h\" }]\ntokens = [{ limit = 100000000, period = \"1m\" }]\n",
        "",
    )
}

async fn a_tier_all_in_shadow_reports_and_charges_its_trial_rule(backend: Backend) {
    let h = Harness::start(backend, &without_global()).await;
    let mut c = envoy_client(&h).await;
    let trial = || descriptor(&[("tenant", "zeta"), ("tier", "trial")], None);
    let mut left = Vec::new();
    for _ in 0..4 {
        let r = ask(&mut c, request("llm", vec![trial()])).await;
        assert_eq!(
            r.overall_code(),
            Code::Ok,
            "a rule in shadow never denies: {r:#?}"
        );
        let s = &r.statuses[0];
        assert_eq!(s.code(), Code::Ok);
        let limit = s
            .current_limit
            .as_ref()
            .expect("the rule under trial is reported");
        assert!(
            limit.name.contains("tenant requests: 2 per 1h"),
            "{limit:?}"
        );
        assert_eq!(
            header(&r, "x-ratelimit-limit-requests"),
            Some("2"),
            "Envoy's headers show the rule under trial"
        );
        left.push(s.limit_remaining);
    }
    // Charged until it would deny, then no longer charged (as if enforced).
    assert_eq!(
        left,
        [1, 0, 0, 0],
        "the shadow bucket is charged as enforcing would"
    );

    // A tier with no rule at all: unlimited, as envoyproxy/ratelimit answers.
    let open = descriptor(&[("tenant", "zeta"), ("tier", "open")], None);
    let r = ask(&mut c, request("llm", vec![open])).await;
    assert_eq!(r.statuses[0].code(), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX, "{r:#?}");
    assert!(r.statuses[0].current_limit.is_none());
    // A descriptor no rule places answers 0 left, as envoyproxy/ratelimit
    // does for a descriptor with no rule and a domain it has no
    // configuration for (4294967295 is its `unlimited: true`).
    let r = ask(
        &mut c,
        request("llm", vec![descriptor(&[("other", "x")], None)]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[0].code(), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0, "{r:#?}");
    assert!(r.statuses[0].current_limit.is_none());
    let r = ask(&mut c, request("not-served", vec![trial(), trial()])).await;
    assert_eq!(r.overall_code(), Code::Ok);
    let left: Vec<_> = r
        .statuses
        .iter()
        .map(|s| (s.code(), s.limit_remaining))
        .collect();
    assert_eq!(left, [(Code::Ok, 0), (Code::Ok, 0)], "{r:#?}");
    h.stop().await;
}

async fn headers_show_the_callers_scope_and_never_the_account(backend: Backend) {
    let h = Harness::start(backend, CONFIG).await;
    let mut c = envoy_client(&h).await;
    // Alice is bound by her own limits, never by the account's.
    let alice = || descriptor(&[("tenant", "acme"), ("user", "alice")], None);
    let r = ask(&mut c, request("llm", vec![alice()])).await;
    assert_eq!(r.overall_code(), Code::Ok);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert!(limit.name.starts_with("user requests"), "{limit:?}");
    assert_eq!(
        header(&r, "x-ratelimit-limit-requests"),
        Some("40"),
        "{r:#?}"
    );
    assert_eq!(
        header(&r, "x-ratelimit-limit-tokens"),
        Some("50000"),
        "{r:#?}"
    );
    // The tenant alone: the tenant's limits.
    let acme = || descriptor(&[("tenant", "acme")], None);
    let r = ask(&mut c, request("llm", vec![acme()])).await;
    assert_eq!(
        header(&r, "x-ratelimit-limit-requests"),
        Some("50"),
        "{r:#?}"
    );
    assert_eq!(
        header(&r, "x-ratelimit-limit-tokens"),
        Some("5000000"),
        "{r:#?}"
    );
    // A tenant on a tier with no limits of its own: nothing of the account.
    let open = || descriptor(&[("tenant", "other"), ("tier", "open")], None);
    let r = ask(&mut c, request("llm", vec![open()])).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none(), "{r:#?}");
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.response_headers_to_add.is_empty(), "{r:#?}");

    // The account's 5 requests per hour are spent (3 above + 2 here): the
    // global level denies, with a retry and without its size.
    ask(&mut c, request("llm", vec![open()])).await;
    ask(&mut c, request("llm", vec![open()])).await;
    let r = ask(&mut c, request("llm", vec![alice()])).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:#?}");
    let s = &r.statuses[0];
    assert!(
        s.current_limit.is_none(),
        "the account's size is not shown: {s:?}"
    );
    assert_eq!(s.limit_remaining, 0);
    let retry: u64 = header(&r, "retry-after").expect("a retry").parse().unwrap();
    assert!(retry > 0);
    assert!(
        r.response_headers_to_add
            .iter()
            .all(|h| !h.key.starts_with("x-ratelimit")),
        "no sizes: {r:#?}"
    );
    // CheckAndReserve's denial says why and when, without the account's size.
    let mut h = h;
    let d = h
        .client
        .check_and_reserve(support::reserve("acme", "alice", "free", 10, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !d.allowed && d.limiting_level() == ctxbudget::pb::Level::Global,
        "{d:#?}"
    );
    assert!(
        d.detail
            .contains("upstream account's request budget is used up")
            && d.retry_after_ms > 0,
        "{d:#?}"
    );
    assert!(
        !d.detail.contains("of 5") && !d.detail.contains("left"),
        "{}",
        d.detail
    );
    h.stop().await;
}

/// The would-be denials of a tier whose only rule is in shadow are counted in
/// `ctxbudget_shadow_denials_total` (the real binary's metrics), on memory
/// and on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn would_be_denials_of_a_tier_all_in_shadow_are_counted() {
    let redis = RedisServer::start();
    for url in [None, Some(redis.url())] {
        let config = format!("{}\n{}", support::TEST_RESERVATIONS, without_global());
        let svc = Service::start("shadow-only", &config, url.as_deref());
        support::connect(svc.addr).await;
        let mut c = crate::envoy::envoy_client_at(svc.addr).await;
        for _ in 0..4 {
            let d = descriptor(&[("tenant", "zeta"), ("tier", "trial")], None);
            let r = ask(&mut c, request("llm", vec![d])).await;
            assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
        }
        svc.wait_metric(
            "ctxbudget_shadow_denials_total",
            &[("tier", "trial"), ("level", "tenant")],
            Duration::from_secs(10),
            "a tier all in shadow counts its would-be denials",
            |v| v >= 2.0,
        );
    }
}
