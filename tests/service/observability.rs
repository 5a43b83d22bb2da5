//! What operators see: every metric the service defines is exported on
//! `/metrics` and documented in docs/operations.md; JSON logs name the reservation on
//! every line about one, and never hold a prompt's text.

use crate::support;

use ctxbudget::pb;
use std::time::Duration;
use support::RedisServer;
use support::process::Service;

const CONFIG: &str = r#"
[store]
timeout_ms = 100

[resilience]
policy = "local"
breaker_min_calls = 2
breaker_failure_rate = 0.5

[reservations]
default_lease_ttl_ms = 30000
max_lease_ttl_ms = 60000
retention_ms = 60000
idempotency_ttl_ms = 60000
retry_jitter_ms = 0
concurrency_retry_ms = 1000

[global]
concurrency = 1000

[models.big]
match = ["big-*"]
context_window = 50

[prices.big]
input = 1000
output = 2000

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 2, period = "1h" }], concurrency = 10 }
shadow = { tenant = { requests = [{ limit = 1, period = "1h" }] } }

[[auth.tokens]]
name = "gateway"
token = "observability-token-0123456789"
"#;

const TOKEN: &str = "observability-token-0123456789";

/// Every metric name `crates/store/src/telemetry.rs` defines.
fn defined_metrics() -> Vec<String> {
    let source = include_str!("../../crates/store/src/telemetry.rs");
    let names: Vec<String> = source
        .lines()
        .filter(|l| l.trim_start().starts_with("pub const"))
        .filter_map(|l| l.split('"').nth(1))
        .filter(|n| n.starts_with("ctxbudget_"))
        .map(String::from)
        .collect();
    assert!(names.len() >= 15, "found the metric names: {names:?}");
    names
}

#[test]
fn every_metric_is_documented_in_the_operations_page() {
    let readme = include_str!("../../docs/operations.md");
    for name in defined_metrics() {
        assert!(
            readme.contains(&format!("`{name}`")),
            "docs/operations.md lacks `{name}`"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_logs_show_what_happened() {
    let mut redis = RedisServer::start();
    let svc = Service::start_with(
        "observe",
        CONFIG,
        Some(&redis.url()),
        &["--log-format", "json"],
    );
    support::connect(svc.addr).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", svc.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = pb::budget_service_client::BudgetServiceClient::with_interceptor(
        channel.clone(),
        |mut r: tonic::Request<()>| {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
            Ok(r)
        },
    );
    // One caller without a token: refused and counted.
    let refused = pb::budget_service_client::BudgetServiceClient::new(channel)
        .check_and_reserve(support::reserve("acme", "", "t", 1, 1))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    const MARKER: &str = "PROMPT-TEXT-MUST-NOT-BE-LOGGED";

    // A counted prompt, committed: counting, estimation, commit metrics.
    let counted = c
        .check_and_reserve(pb::CheckAndReserveRequest {
            tenant_id: "acme".into(),
            tier: "t".into(),
            model: "gpt-4o".into(),
            messages: vec![pb::Message {
                role: "user".into(),
                content: format!("{MARKER} please summarise this"),
                name: String::new(),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(counted.allowed);
    let commit = c
        .commit(pb::CommitRequest {
            reservation_id: counted.reservation_id.clone(),
            prompt_tokens: counted.estimated_prompt_tokens + 2,
            completion_tokens: 7,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(commit.outcome(), pb::Outcome::Applied);

    // A short lease, refunded after it lapsed: the lapse is counted when the
    // next reservation reclaims it.
    let short = c
        .check_and_reserve(pb::CheckAndReserveRequest {
            lease_ttl_ms: Some(100),
            ..support::reserve("acme", "", "t", 5, 5)
        })
        .await
        .unwrap()
        .into_inner();
    assert!(short.allowed, "{short:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Over the tenant's 2 requests an hour: denied (and reclaims the lease).
    let denied = c
        .check_and_reserve(support::reserve("acme", "", "t", 5, 5))
        .await
        .unwrap()
        .into_inner();
    assert!(!denied.allowed);
    let refund = c
        .refund(pb::RefundRequest {
            reservation_id: short.reservation_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refund.outcome(), pb::Outcome::Applied);

    // The estimator multiplier gauge is refreshed twice a second.
    svc.wait_metric(
        "ctxbudget_estimator_multiplier",
        &[("key", "gpt-4o")],
        Duration::from_secs(5),
        "the multiplier is published",
        |v| v >= 1.0,
    );
    // Over a model group's context window: a denial counted by group.
    let window = c
        .check_and_reserve(pb::CheckAndReserveRequest {
            model: "big-1".into(),
            ..support::reserve("acme", "", "t", 60, 5)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(window.reason(), pb::Reason::ContextTooLarge);
    // A priced commit: 10 prompt tokens at $1000/M and 3 out at $2000/M.
    let priced = c
        .check_and_reserve(pb::CheckAndReserveRequest {
            model: "big-1".into(),
            ..support::reserve("acme", "", "t", 10, 5)
        })
        .await
        .unwrap()
        .into_inner();
    assert!(priced.allowed, "{priced:?}");
    let cost = c
        .commit(pb::CommitRequest {
            reservation_id: priced.reservation_id,
            prompt_tokens: 10,
            completion_tokens: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .cost_micros;
    assert_eq!(cost, 10_000 + 6_000);
    let value = |name: &str, labels: &[(&str, &str)]| svc.metric(name, labels).unwrap_or(0.0);
    assert_eq!(
        value(
            "ctxbudget_cost_micros_total",
            &[("tenant", "acme"), ("model_group", "big")]
        ),
        16_000.0
    );
    assert_eq!(
        value(
            "ctxbudget_model_group_denials_total",
            &[("model_group", "big"), ("reason", "context_too_large")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "ctxbudget_decisions_total",
            &[
                ("result", "denied"),
                ("reason", "rpm_exceeded"),
                ("level", "tenant"),
                ("tier", "t")
            ]
        ),
        1.0
    );

    // Then Redis goes away: store errors, the breaker, degraded decisions.
    redis.kill();
    // Enough failures to outweigh the window's successes.
    for _ in 0..30 {
        let r = c
            .check_and_reserve(support::reserve("globex", "", "t", 5, 5))
            .await
            .unwrap()
            .into_inner();
        assert!(r.degraded);
    }
    svc.wait_metric(
        "ctxbudget_breaker_state",
        &[],
        Duration::from_secs(5),
        "the breaker opens",
        |v| v == 2.0,
    );

    let text = svc.scrape().expect("/metrics answers");
    for name in defined_metrics() {
        assert!(text.contains(&name), "/metrics lacks {name}:\n{text}");
    }
    assert!(value("ctxbudget_decisions_total", &[("result", "allowed")]) >= 2.0);
    assert_eq!(
        value(
            "ctxbudget_auth_refused_total",
            &[("code", "UNAUTHENTICATED")]
        ),
        1.0
    );
    assert!(!text.contains(TOKEN), "no secret in the metrics");
    assert_eq!(value("ctxbudget_refunded_tokens_total", &[]), 10.0);
    assert_eq!(
        value("ctxbudget_committed_tokens_total", &[]),
        // The counted commit, and the priced one's 10 + 3.
        (counted.estimated_prompt_tokens + 2 + 7 + 13) as f64
    );
    // The lapsed lease held a slot at the global and tenant levels: one each.
    for level in ["global", "tenant"] {
        assert_eq!(
            value("ctxbudget_leases_expired_total", &[("level", level)]),
            1.0,
            "{level}"
        );
    }
    assert!(value("ctxbudget_shadow_denials_total", &[("tier", "t")]) >= 1.0);
    assert!(value("ctxbudget_degraded_decisions_total", &[("policy", "local")]) >= 3.0);
    assert!(value("ctxbudget_store_errors_total", &[("op", "reserve")]) >= 1.0);
    assert!(
        text.contains("ctxbudget_rpc_duration_seconds_count{rpc=\"Commit\",code=\"OK\"}"),
        "{text}"
    );

    // Logs: JSON lines; those about a reservation carry its id; no prompt text.
    let log = svc.log();
    assert!(!log.contains(MARKER), "prompt text reached the log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("every log line is JSON"))
        .collect();
    let about = |id: &str| {
        lines
            .iter()
            .filter(|l| l.to_string().contains(id))
            .map(|l| l["fields"]["message"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    let counted_lines = about(&counted.reservation_id);
    for message in ["decision", "commit"] {
        assert!(
            counted_lines.iter().any(|m| m == message),
            "a {message:?} line names the reservation: {counted_lines:?}"
        );
    }
    assert!(about(&short.reservation_id).iter().any(|m| m == "refund"));
}

/// The distributions: exported as Prometheus histograms.
const HISTOGRAMS: [&str; 4] = [
    "ctxbudget_rpc_duration_seconds",
    "ctxbudget_store_duration_seconds",
    "ctxbudget_commit_token_delta",
    "ctxbudget_estimation_ratio",
];

#[test]
fn every_metric_is_on_the_first_scrape_with_help_and_distributions_are_histograms() {
    // An estimator group and a model group: their series exist before any
    // model is seen.
    let config = "[estimator]\ngroups = { \"gpt-4o*\" = \"gpt-4o\" }\n\
                  [models.gpt-4o]\nmatch = [\"gpt-4o*\"]\n";
    let svc = Service::start("first-scrape", config, None);
    let text = svc.scrape().expect("/metrics answers");
    for name in defined_metrics() {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP line for {name}:\n{text}"
        );
        assert!(
            text.lines().any(|l| l.starts_with(&name)),
            "no series of {name} before any traffic:\n{text}"
        );
    }
    for name in HISTOGRAMS {
        assert!(
            text.contains(&format!("# TYPE {name} histogram")),
            "{name} is not a histogram:\n{text}"
        );
        assert!(text.contains(&format!("{name}_bucket{{")), "{text}");
    }
    assert!(
        !text.contains(" summary\n") && !text.contains("quantile="),
        "{text}"
    );
    assert_eq!(
        svc.metric(
            "ctxbudget_decisions_total",
            &[("result", "allowed"), ("tier", "pro")]
        ),
        Some(0.0),
        "a tier's series start at zero"
    );
    assert_eq!(
        svc.metric("ctxbudget_estimator_multiplier", &[("key", "gpt-4o")]),
        Some(1.15),
        "a group's multiplier starts at the initial one"
    );
}

#[test]
fn text_logs_to_a_file_carry_no_colour_codes() {
    let svc = Service::start("no-colour", "", None);
    // /metrics answers first; the gRPC listener's line follows shortly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let log = loop {
        let log = svc.log();
        if log.contains("serving gRPC") || std::time::Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(log.contains("serving gRPC"), "the service logged: {log}");
    assert!(
        !log.contains("\x1b["),
        "ANSI escape codes in a log file: {log:?}"
    );
}
