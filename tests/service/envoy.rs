//! Envoy's rate limit service API end to end, over both stores: a tonic
//! client sends exactly what Envoy's rate limit filter sends for the
//! configuration in docs/envoy.md — the request path (hits_addend unset: 1;
//! or 0: a check) and the `apply_on_stream_done` response path (a `phase`
//! entry, hits_addend = the tokens) — and reads the statuses and headers
//! Envoy acts on. Bad input is INVALID_ARGUMENT and changes nothing.

use crate::operations::{ctl_ok, document, temp_dir};
use crate::support;

use ctxbudget::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ctxbudget::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use ctxbudget::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ctxbudget::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ctxbudget::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ctxbudget::pb::{self, Dimension, Level};
use std::time::{Duration, Instant};
use support::process::Service;
use support::{Backend, Harness, RedisServer, reserve, settings};
use tonic::transport::Channel;

on_every_store!(
    request_path_checks_deny_at_the_right_level_with_headers,
    response_path_charges_put_a_tenant_into_debt_that_checks_honour,
    several_descriptors_unmapped_ones_and_other_domains,
    bad_input_is_refused_whole_and_changes_nothing,
    a_marked_descriptor_checks_at_zero_hits_and_charges_tokens_above,
    a_session_entry_charges_its_session_beside_its_user,
);

const CONFIG: &str = r#"
[envoy]
default_tier = "free"

[models.gpt-4o]
match = ["gpt-4o*"]

[tiers.free]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 3, period = "1h" }], tokens = [{ limit = 1000, period = "1m" }] }
user = { requests = [{ limit = 2, period = "1h" }] }

[tiers.pro]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100, period = "1h" }], tokens = [{ limit = 100000, period = "1m" }] }

[tiers.rollout]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100, period = "1h" }] }
shadow = { tenant = { requests = [{ limit = 1, period = "1h" }] } }

[tiers.pro.models.gpt-4o]
tenant = { tokens = [{ limit = 500, period = "1m" }] }

[tiers.agents]
max_context_tokens = 100000
default_max_output_tokens = 100
user = { requests = [{ limit = 100, period = "1h" }] }
session = { requests = [{ limit = 2, period = "1h" }] }
"#;

pub(crate) async fn envoy_client(h: &Harness) -> RateLimitServiceClient<Channel> {
    envoy_client_at(h.addr).await
}

pub(crate) async fn envoy_client_at(addr: std::net::SocketAddr) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

/// A descriptor as Envoy builds it from `request_headers` and `generic_key`
/// actions: the entries in action order.
pub(crate) fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        limit: None,
        hits_addend: hits,
        is_negative_hits: false,
    }
}

pub(crate) fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        // Envoy leaves it unset (0, meaning 1) unless the filter state sets it.
        hits_addend: 0,
    }
}

pub(crate) async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

pub(crate) fn header<'a>(r: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == key)
        .map(|h| h.value.as_str())
}

/// The tenant's requests left per hour, read through the budget service.
async fn requests_left(h: &mut Harness, tenant: &str, tier: &str) -> i64 {
    let status = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: tenant.into(),
            tier: tier.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    status
        .limits
        .iter()
        .find(|l| l.level() == Level::Tenant && l.dimension() == Dimension::Requests)
        .map(|l| l.remaining)
        .expect("the tenant's request limit")
}

async fn a_session_entry_charges_its_session_beside_its_user(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let mut c = envoy_client(&h).await;
    let run = |session: &str| {
        descriptor(
            &[
                ("tenant", "acme"),
                ("tier", "agents"),
                ("user", "alice"),
                ("session", session),
            ],
            None,
        )
    };
    for _ in 0..2 {
        let r = ask(&mut c, request("llm", vec![run("run-1")])).await;
        assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
    }
    let r = ask(&mut c, request("llm", vec![run("run-1")])).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:#?}");
    let limit = r.statuses[0]
        .current_limit
        .as_ref()
        .expect("the denying limit");
    assert!(limit.name.starts_with("session requests"), "{limit:?}");
    // Another run of the same user goes on; the user's requests count all three.
    let r = ask(&mut c, request("llm", vec![run("run-2")])).await;
    assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
    let status = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            user_id: "alice".into(),
            session_id: "run-1".into(),
            tier: "agents".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let left = |level| {
        status
            .limits
            .iter()
            .find(|l| l.level() == level && l.dimension() == Dimension::Requests)
            .map(|l| l.remaining)
    };
    assert_eq!(
        (left(Level::User), left(Level::Session)),
        (Some(97), Some(0))
    );
    // A session entry needs its tenant, like a user entry.
    let orphan = descriptor(&[("session", "run-1")], None);
    let err = c
        .should_rate_limit(request("llm", vec![orphan]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("\"session\""), "{}", err.message());
    h.stop().await;
}

async fn request_path_checks_deny_at_the_right_level_with_headers(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let mut c = envoy_client(&h).await;
    let alice = || descriptor(&[("tenant", "acme"), ("user", "alice")], None);
    // A check (hits 0) takes nothing, however often.
    for _ in 0..5 {
        let check = descriptor(&[("tenant", "acme"), ("user", "alice")], Some(0));
        let r = ask(&mut c, request("llm", vec![check])).await;
        assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
    }
    assert_eq!(requests_left(&mut h, "acme", "free").await, 3);
    // Each request takes one at every level: the user's 2 per hour deny the third.
    for left in [1, 0] {
        let r = ask(&mut c, request("llm", vec![alice()])).await;
        assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
        assert_eq!(r.statuses[0].code(), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, left, "{r:#?}");
        assert!(header(&r, "retry-after").is_none());
    }
    let r = ask(&mut c, request("llm", vec![alice()])).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:#?}");
    let status = &r.statuses[0];
    assert_eq!(status.code(), Code::OverLimit);
    let limit = status.current_limit.as_ref().expect("the denying limit");
    assert!(limit.name.starts_with("user requests"), "{limit:?}");
    assert_eq!(limit.requests_per_unit, 2);
    assert_eq!(status.limit_remaining, 0);
    let reset = status.duration_until_reset.expect("reset").seconds;
    // Full again in an hour; a retry can pass once one refilled (half an hour).
    assert!(
        (3590..=3600).contains(&reset),
        "the bucket is full again in an hour: {reset}"
    );
    assert_eq!(header(&r, "x-ratelimit-limit-requests"), Some("2"));
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("0"));
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1700..=1801).contains(&retry), "retry-after {retry}");
    // Nothing was taken by the denial: bob has the tenant's last request.
    assert_eq!(requests_left(&mut h, "acme", "free").await, 1);
    let bob = || descriptor(&[("tenant", "acme"), ("user", "bob")], None);
    assert_eq!(
        ask(&mut c, request("llm", vec![bob()]))
            .await
            .overall_code(),
        Code::Ok
    );
    let r = ask(&mut c, request("llm", vec![bob()])).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert!(limit.name.starts_with("tenant requests"), "{limit:?}");
    assert_eq!(header(&r, "x-ratelimit-limit-requests"), Some("3"));
    // The budget service sees the same buckets.
    let denied = h
        .client
        .check_and_reserve(reserve("acme", "", "free", 1, 1))
        .await
        .unwrap()
        .into_inner();
    assert!(!denied.allowed);
    assert_eq!(denied.limiting_level(), Level::Tenant);
    h.stop().await;
}

async fn response_path_charges_put_a_tenant_into_debt_that_checks_honour(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let mut c = envoy_client(&h).await;
    let check = || descriptor(&[("tenant", "acme"), ("tier", "pro")], Some(0));
    let usage = |tokens| {
        descriptor(
            &[("tenant", "acme"), ("tier", "pro"), ("phase", "response")],
            Some(tokens),
        )
    };
    assert_eq!(
        ask(&mut c, request("llm", vec![check()]))
            .await
            .overall_code(),
        Code::Ok
    );
    // Usage charged after the fact is always OK, into debt if need be.
    let r = ask(&mut c, request("llm", vec![usage(150_000)])).await;
    assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
    assert!(header(&r, "retry-after").is_none());
    let r = ask(&mut c, request("llm", vec![check()])).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:#?}");
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert!(limit.name.starts_with("tenant tokens"), "{limit:?}");
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("0"));
    // 50,001 tokens of debt at 100,000 a minute: about 30 s.
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((28..=32).contains(&retry), "retry-after {retry}");
    let status = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            tier: "pro".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let tokens = status
        .limits
        .iter()
        .find(|l| l.dimension() == Dimension::Tokens)
        .unwrap();
    assert!(tokens.remaining <= -40_000, "in debt: {tokens:?}");
    // Requests were never charged: the response path takes tokens only, and
    // checks take nothing.
    assert_eq!(requests_left(&mut h, "acme", "pro").await, 100);
    // A large hits_addend on the request path is requests, never usage.
    let r = ask(
        &mut c,
        request(
            "llm",
            vec![descriptor(
                &[("tenant", "beta"), ("tier", "pro")],
                Some(150),
            )],
        ),
    )
    .await;
    assert_eq!(
        r.overall_code(),
        Code::OverLimit,
        "150 requests exceed 100: {r:#?}"
    );
    assert!(
        header(&r, "retry-after").is_none(),
        "retrying cannot help: {r:#?}"
    );
    assert_eq!(
        requests_left(&mut h, "beta", "pro").await,
        100,
        "a denial takes nothing"
    );
    // N requests need N: with 1 left, 2 wait for one more (36 s at 100 an hour).
    let delta = |hits| descriptor(&[("tenant", "delta"), ("tier", "pro")], Some(hits));
    let r = ask(&mut c, request("llm", vec![delta(99)])).await;
    assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
    let r = ask(&mut c, request("llm", vec![delta(2)])).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:#?}");
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((30..=37).contains(&retry), "retry-after {retry}");
    // A model's group limits apply when the descriptor names it.
    let gpt = |tokens| {
        descriptor(
            &[
                ("tenant", "gamma"),
                ("tier", "pro"),
                ("model", "gpt-4o-mini"),
                ("phase", "response"),
            ],
            Some(tokens),
        )
    };
    ask(&mut c, request("llm", vec![gpt(600)])).await;
    let r = ask(
        &mut c,
        request(
            "llm",
            vec![descriptor(
                &[("tenant", "gamma"), ("tier", "pro"), ("model", "gpt-4o")],
                Some(0),
            )],
        ),
    )
    .await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:#?}");
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert!(limit.name.contains("of model group gpt-4o"), "{limit:?}");
    let other_model = descriptor(&[("tenant", "gamma"), ("tier", "pro")], Some(0));
    let r = ask(&mut c, request("llm", vec![other_model])).await;
    assert_eq!(
        r.overall_code(),
        Code::Ok,
        "the all-model tokens have room: {r:#?}"
    );
    h.stop().await;
}

async fn several_descriptors_unmapped_ones_and_other_domains(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let mut c = envoy_client(&h).await;
    let r = ask(
        &mut c,
        request(
            "llm",
            vec![
                descriptor(&[("remote_address", "10.0.0.1")], None),
                descriptor(&[("tenant", "t:{1}")], None),
                descriptor(&[("route", "chat"), ("tenant", "t")], None),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
    assert_eq!(r.statuses.len(), 3);
    assert!(r.statuses[0].current_limit.is_none(), "unmapped: no limit");
    assert_eq!(r.statuses[0].code(), Code::Ok);
    assert_eq!(r.statuses[1].limit_remaining, 2);
    // Ids with ':' and braces are tenants of their own.
    assert_eq!(requests_left(&mut h, "t:{1}", "free").await, 2);
    assert_eq!(requests_left(&mut h, "t", "free").await, 2);
    assert_eq!(requests_left(&mut h, "t:", "free").await, 3);
    // Another domain is answered OK and charges nothing.
    let r = ask(
        &mut c,
        request("other", vec![descriptor(&[("tenant", "t")], None)]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(requests_left(&mut h, "t", "free").await, 2);
    // One descriptor over its limit makes the whole answer OVER_LIMIT; the
    // others are decided on their own, as envoyproxy/ratelimit decides them.
    ask(
        &mut c,
        request("llm", vec![descriptor(&[("tenant", "t")], Some(2))]),
    )
    .await;
    let r = ask(
        &mut c,
        request(
            "llm",
            vec![
                descriptor(&[("tenant", "u")], None),
                descriptor(&[("tenant", "t")], None),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(
        (r.statuses[0].code(), r.statuses[1].code()),
        (Code::Ok, Code::OverLimit)
    );
    assert_eq!(requests_left(&mut h, "u", "free").await, 2);
    // The request's hits_addend counts for descriptors without their own.
    let mut two = request("llm", vec![descriptor(&[("tenant", "v")], None)]);
    two.hits_addend = 2;
    assert_eq!(ask(&mut c, two).await.overall_code(), Code::Ok);
    assert_eq!(requests_left(&mut h, "v", "free").await, 1);
    h.stop().await;
}

/// `headers = false`: statuses only, no headers, even on OVER_LIMIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_can_be_turned_off() {
    let config = CONFIG.replace("[envoy]\n", "[envoy]\nheaders = false\n");
    let h = Harness::start(Backend::Memory, &config).await;
    let mut c = envoy_client(&h).await;
    let d = || descriptor(&[("tenant", "acme"), ("user", "alice")], Some(2));
    assert_eq!(
        ask(&mut c, request("llm", vec![d()])).await.overall_code(),
        Code::Ok
    );
    let r = ask(&mut c, request("llm", vec![d()])).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "{r:#?}");
    assert!(r.statuses[0].current_limit.is_some());
    assert!(r.response_headers_to_add.is_empty(), "{r:#?}");
    h.stop().await;
}

async fn bad_input_is_refused_whole_and_changes_nothing(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let mut c = envoy_client(&h).await;
    let good = || descriptor(&[("tenant", "acme")], None);
    let long = "x".repeat(300);
    let cases: Vec<(RateLimitRequest, &str)> = vec![
        (request("", vec![good()]), "domain"),
        (request("llm", vec![]), "descriptors"),
        (
            request(
                "llm",
                vec![
                    good(),
                    descriptor(&[("tenant", "a"), ("tenant", "b")], None),
                ],
            ),
            "twice",
        ),
        (
            request("llm", vec![good(), descriptor(&[("user", "alice")], None)]),
            "no \"tenant\" entry",
        ),
        (
            request(
                "llm",
                vec![
                    good(),
                    descriptor(&[("tenant", "a"), ("phase", "after")], None),
                ],
            ),
            "\"after\"",
        ),
        (
            request("llm", vec![good(), descriptor(&[("tenant", &long)], None)]),
            "tenant",
        ),
        (
            request(
                "llm",
                vec![good(), descriptor(&[("tenant", "a\u{1}b")], None)],
            ),
            "tenant",
        ),
        (
            request(
                "llm",
                vec![
                    good(),
                    descriptor(&[("tenant", "a"), ("tier", "gold")], None),
                ],
            ),
            "gold",
        ),
        (
            request(
                "llm",
                vec![good(), descriptor(&[("tenant", "a")], Some(1 << 41))],
            ),
            "hits_addend",
        ),
        (
            request(
                "llm",
                vec![
                    good(),
                    RateLimitDescriptor {
                        is_negative_hits: true,
                        ..good()
                    },
                ],
            ),
            "is_negative_hits",
        ),
    ];
    for (r, says) in cases {
        let err = c.should_rate_limit(r).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{says}: {err:?}");
        assert!(err.message().contains(says), "{says}: {}", err.message());
    }
    // The valid descriptor before each bad one was never charged.
    assert_eq!(requests_left(&mut h, "acme", "free").await, 3);
    h.stop().await;
}

/// Envoy Gateway sends one rule's descriptor on both paths, with its own
/// keys: the tenant's header under `rule-0-match-0`, request cost 0, response
/// cost the tokens. Marked by `response_keys`, hits 0 is a check and more is
/// usage.
const GATEWAY: &str = r#"
[envoy]
domain = "*"
tenant = "rule-0-match-0"
response_keys = ["rule-0-match-0"]
default_tier = "pro"
"#;

async fn a_marked_descriptor_checks_at_zero_hits_and_charges_tokens_above(backend: Backend) {
    let h = Harness::start(
        backend,
        &format!(
            "{GATEWAY}\n{}",
            CONFIG.replace("[envoy]\ndefault_tier = \"free\"\n", "")
        ),
    )
    .await;
    let mut c = envoy_client(&h).await;
    let rule = |hits| {
        descriptor(
            &[
                ("default/llm-route", "default/llm-route"),
                ("rule-0-match-0", "acme"),
            ],
            Some(hits),
        )
    };
    let domain = "default/eg/http";
    assert_eq!(
        ask(&mut c, request(domain, vec![rule(0)]))
            .await
            .overall_code(),
        Code::Ok
    );
    let r = ask(&mut c, request(domain, vec![rule(150_000)])).await;
    assert_eq!(r.overall_code(), Code::Ok, "usage is always OK: {r:#?}");
    let r = ask(&mut c, request(domain, vec![rule(0)])).await;
    assert_eq!(
        r.overall_code(),
        Code::OverLimit,
        "the debt denies the check: {r:#?}"
    );
    assert!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .name
            .starts_with("tenant tokens"),
        "{r:#?}"
    );
    h.stop().await;
}

/// The live map: `ctxbudget envoy set` renames the keys on a running service
/// (within a second), the default tier must exist; unmapped descriptors and a
/// quota in shadow's would-be denials are counted in metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_map_is_live_and_unmapped_descriptors_are_counted() {
    let redis = RedisServer::start();
    let svc = Service::start(
        "envoy",
        &format!("{}\n{CONFIG}", support::TEST_RESERVATIONS),
        Some(&redis.url()),
    );
    support::connect(svc.addr).await;
    let channel = Channel::from_shared(format!("http://{}", svc.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = RateLimitServiceClient::new(channel);
    let by_header = || descriptor(&[("x-tenant", "acme")], None);
    let r = ask(&mut c, request("llm", vec![by_header()])).await;
    assert!(r.statuses[0].current_limit.is_none(), "not mapped yet");
    let unmapped = svc.wait_metric(
        "ctxbudget_envoy_descriptors_total",
        &[("outcome", "unmapped")],
        Duration::from_secs(10),
        "the unmapped descriptor is counted",
        |v| v >= 1.0,
    );
    assert!(unmapped >= 1.0);
    // A quota in shadow never denies, and its would-be denials are counted.
    for _ in 0..3 {
        let d = descriptor(&[("tenant", "zeta"), ("tier", "rollout")], None);
        let r = ask(&mut c, request("llm", vec![d])).await;
        assert_eq!(r.overall_code(), Code::Ok, "{r:#?}");
    }
    svc.wait_metric(
        "ctxbudget_shadow_denials_total",
        &[("tier", "rollout"), ("level", "tenant")],
        Duration::from_secs(10),
        "the shadow quota's would-be denials are counted",
        |v| v >= 2.0,
    );
    let got = ctl_ok(&redis, &["envoy", "get"]);
    assert!(
        got.contains("tenant = \"tenant\"") && got.contains("default_tier = \"free\""),
        "{got}"
    );

    let dir = temp_dir("envoy");
    let map = "domain = \"*\"\ntenant = \"x-tenant\"\ndefault_tier = \"pro\"\n";
    let out = ctl_ok(&redis, &["envoy", "set", &document(&dir, "map.toml", map)]);
    assert!(out.contains("the Envoy descriptor map"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = ask(&mut c, request("any-domain", vec![by_header()])).await;
        if let Some(limit) = &r.statuses[0].current_limit {
            assert_eq!(r.statuses[0].limit_remaining, 99, "the pro tier: {r:#?}");
            assert!(limit.name.contains("100 per 1h"), "{limit:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the map never applied: {r:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A default tier that does not exist is refused, nothing written.
    let bad = document(&dir, "bad.toml", "default_tier = \"gold\"\n");
    let err = crate::operations::ctl(&redis, &["envoy", "set", &bad])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("envoy.default_tier") && err.contains("gold"),
        "{err}"
    );
    assert!(ctl_ok(&redis, &["envoy", "get"]).contains("x-tenant"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Health names the service (reflection: tests/service/server.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_includes_the_service() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let h = Harness::start_with(settings(CONFIG, None), None).await;
    let channel = Channel::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);
    h.stop().await;
}
