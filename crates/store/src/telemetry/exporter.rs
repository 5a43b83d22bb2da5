//! The Prometheus exporter: histogram buckets, every metric's description, and
//! the series whose labels are known at start, registered at zero.

use super::*;
use crate::domain::{Dimension, Level, Reason};
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;

/// The series labels known when the exporter starts: what [`register`] sets
/// at zero. Configuration builds it from its settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KnownSeries {
    /// The tiers configured.
    pub tiers: Vec<String>,
    /// The estimator keys configured.
    pub estimator_keys: Vec<String>,
    /// The model groups configured.
    pub model_groups: Vec<String>,
    /// The multiplier every estimator key starts with.
    pub initial_multiplier: f64,
    /// `[server] max_in_flight`, on the first scrape before the listener's
    /// gate is built.
    pub max_in_flight: usize,
}

/// The recorder's handle, once installed: what the admin API's
/// `/admin/v1/metrics` renders for the console.
static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();

/// Records metrics in this process: served at `http://listen/metrics` when
/// `listen` is given, and rendered by [`render`] either way (the console
/// reads them). Distributions are histograms, every metric is described, and
/// the series whose labels are known at start (the configured tiers and
/// estimator keys among them) are registered at zero.
pub fn install_metrics(
    listen: Option<SocketAddr>,
    known: impl Into<KnownSeries>,
) -> Result<(), BuildError> {
    // Built, installed and filled before the listener is spawned, so the
    // first scrape that answers already has every series.
    let runtime = tokio::runtime::Handle::current();
    let builder = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(COMMIT_DELTA.into()), DELTA_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(ESTIMATION_RATIO.into()), RATIO_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(QUEUE_WAIT_SECONDS.into()), WAIT_BUCKETS)?;
    let (recorder, exporter) = match listen {
        Some(addr) => {
            let _in_runtime = runtime.enter();
            let (recorder, exporter) = builder.with_http_listener(addr).build()?;
            (recorder, Some(exporter))
        }
        None => (builder.build_recorder(), None),
    };
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    let _ = HANDLE.set(handle.clone());
    describe();
    register(&known.into());
    if let Some(exporter) = exporter {
        runtime.spawn(exporter);
    }
    // Histograms and summaries are drained on render; without a scraper,
    // something must drain them now and then.
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
    Ok(())
}

/// The metrics in Prometheus's text format, when [`install_metrics`] ran.
pub fn render() -> Option<String> {
    HANDLE.get().map(PrometheusHandle::render)
}

/// Gives every metric its `# HELP` line and unit.
#[expect(clippy::too_many_lines, reason = "a table: every metric's help text")]
pub fn describe() {
    let counters = [
        (DECISIONS, "CheckAndReserve decisions"),
        (RESERVED_TOKENS, "Tokens reserved by allowed reservations"),
        (COMMITTED_TOKENS, "Tokens Commits reported used"),
        (REFUNDED_TOKENS, "Tokens Refunds returned"),
        (COUNTED_TOKENS, "Prompt tokens the service counted itself"),
        (STORE_ERRORS, "Failed store calls"),
        (DEGRADED, "Decisions made without the store"),
        (
            SHADOW_DENIALS,
            "Requests a quota in shadow would have denied",
        ),
        (
            MODEL_GROUP_DENIALS,
            "Denials by a model group's limit or context window",
        ),
        (
            COST_MICROS,
            "What committed usage cost, micro-dollars, by tenant and model group",
        ),
        (
            LEASES_EXPIRED,
            "Leases that lapsed without Commit or Refund, once per level",
        ),
        (
            AUTH_REFUSED,
            "Calls refused by authentication or a token's tenant binding",
        ),
        (
            CANCELLATIONS,
            "Reservations whose store call failed, refunded in the background, by outcome",
        ),
        (
            ENVOY_DESCRIPTORS,
            "Envoy rate limit descriptors, by outcome (ok, over_limit, charged, unmapped, other_domain)",
        ),
        (
            ENVOY_CHARGED_TOKENS,
            "Tokens charged by Envoy's response path",
        ),
        (
            EXT_PROC_REQUESTS,
            "Requests Envoy's external processor saw, by outcome (reserved, denied, refused, passed)",
        ),
        (
            EXT_PROC_SETTLED,
            "External processor reservations settled, by how (usage, delivered, refunded, failed)",
        ),
        (
            CLUSTER_GLOBAL_DECISIONS,
            "Redis Cluster: reservations and charges with a global entry, decided from this replica's leased share",
        ),
        (
            CLUSTER_GLOBAL_CALLS,
            "Redis Cluster: calls to the global key (lease syncs)",
        ),
        (
            UNDER_RESERVED,
            "Commits of a counted prompt whose actual prompt exceeded the prompt reserved, by estimator key",
        ),
        (
            SHED,
            "Calls shed before any work: full (RESOURCE_EXHAUSTED) or deadline (DEADLINE_EXCEEDED)",
        ),
        (
            ALERTS,
            "Threshold alerts emitted (sent to the receiver, or logged without one)",
        ),
        (
            ALERT_FAILURES,
            "Threshold alert deliveries that failed and will be retried",
        ),
        (
            ALERTS_DROPPED,
            "Threshold alerts given up by the sender (too old, unreadable)",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, help);
    }
    describe_histogram!(
        RPC_SECONDS,
        Unit::Seconds,
        "gRPC handling time, by result code"
    );
    describe_histogram!(STORE_SECONDS, Unit::Seconds, "Store call time");
    describe_histogram!(
        COMMIT_DELTA,
        "Actual minus reserved tokens per Commit (negative: over-reserved)"
    );
    describe_histogram!(
        ESTIMATION_RATIO,
        "Actual / estimated prompt tokens per Commit of a prompt the service counted"
    );
    describe_gauge!(
        ESTIMATOR_MULTIPLIER,
        "The adaptive multiplier applied to new estimates"
    );
    describe_gauge!(
        BREAKER_STATE,
        "Store circuit breaker: 0 closed, 1 half-open, 2 open"
    );
    describe_gauge!(
        CANCELLATIONS_PENDING,
        "Reservations waiting to be cancelled"
    );
    describe_gauge!(IN_FLIGHT, "Budget and Envoy calls being worked on");
    describe_gauge!(
        IN_FLIGHT_LIMIT,
        "[server] max_in_flight: calls worked on at once"
    );
    describe_gauge!(
        QUEUE_WAITING,
        "Calls waiting in line for the shared account (max_wait_ms)"
    );
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time calls waited in line, by outcome"
    );
    describe_counter!(TRACE_SPANS_EXPORTED, "Spans exported over OTLP");
    describe_counter!(
        TRACE_SPANS_DROPPED,
        "Spans dropped before export, by reason (queue_full, export_failed)"
    );
    describe_gauge!(
        GLOBAL_LEASES_ACTIVE,
        "Leases held across all replicas, as of this replica's last reservation"
    );
}

/// The admission gate's and the waiting lines' series, at zero.
fn register_admission(max_in_flight: usize) {
    gauge!(IN_FLIGHT).set(0.0);
    in_flight_limit(max_in_flight);
    for reason in ["full", "deadline"] {
        counter!(SHED, "reason" => reason).increment(0);
    }
    queue_waiting(0);
    for outcome in WAIT_OUTCOMES {
        let _ = histogram!(QUEUE_WAIT_SECONDS, "outcome" => outcome);
    }
    counter!(TRACE_SPANS_EXPORTED).increment(0);
    for reason in TRACE_DROP_REASONS {
        counter!(TRACE_SPANS_DROPPED, "reason" => reason).increment(0);
    }
}

/// The threshold alerts' series, at zero.
fn register_alerts() {
    for level in Level::ALL {
        for dimension in Dimension::RATES {
            counter!(ALERTS, "level" => level.as_str(), "dimension" => dimension.as_str())
                .increment(0);
        }
    }
    for reason in ALERT_FAILURE_REASONS {
        counter!(ALERT_FAILURES, "reason" => reason).increment(0);
    }
    for reason in ALERT_DROP_REASONS {
        counter!(ALERTS_DROPPED, "reason" => reason).increment(0);
    }
}

/// Registers at zero every series whose labels are known at start, so each
/// documented metric is on the first scrape and a first increment shows in
/// `rate()`. Series of tiers or estimator keys that appear later (a tier set
/// in Redis, a model first seen) are created when first used.
pub fn register(known: &KnownSeries) {
    for tier in &known.tiers {
        register_tier(tier);
    }
    for group in &known.model_groups {
        counter!(MODEL_GROUP_DENIALS, "model_group" => group.to_owned(),
            "reason" => Reason::TokensExceeded.as_str(), "level" => "global", "dimension" => "tokens")
        .increment(0);
        counter!(COST_MICROS, "tenant" => "other", "model_group" => group.to_owned()).increment(0);
    }
    for key in &known.estimator_keys {
        gauge!(ESTIMATOR_MULTIPLIER, "key" => key.to_owned()).set(known.initial_multiplier);
        let _ = histogram!(ESTIMATION_RATIO, "key" => key.to_owned());
        counter!(UNDER_RESERVED, "key" => key.to_owned()).increment(0);
    }
    for outcome in ENVOY_OUTCOMES {
        counter!(ENVOY_DESCRIPTORS, "outcome" => outcome, "reason" => "none", "level" => "none",
            "tier" => "none")
        .increment(0);
    }
    for outcome in EXT_PROC_OUTCOMES {
        counter!(EXT_PROC_REQUESTS, "outcome" => outcome).increment(0);
    }
    for how in EXT_PROC_SETTLEMENTS {
        counter!(EXT_PROC_SETTLED, "how" => how).increment(0);
    }
    for outcome in CANCEL_OUTCOMES {
        counter!(CANCELLATIONS, "outcome" => outcome).increment(0);
    }
    gauge!(CANCELLATIONS_PENDING).set(0.0);
    for method in ["exact", "fast"] {
        counter!(COUNTED_TOKENS, "method" => method).increment(0);
    }
    for rpc in RPCS {
        let _ = histogram!(RPC_SECONDS, "rpc" => rpc, "code" => "OK");
    }
    for op in STORE_OPS {
        let _ = histogram!(STORE_SECONDS, "op" => op);
        for kind in STORE_ERROR_KINDS {
            counter!(STORE_ERRORS, "op" => op, "kind" => kind).increment(0);
        }
    }
    for policy in ["local", "fail_open"] {
        counter!(DEGRADED, "policy" => policy).increment(0);
    }
    for level in Level::ALL {
        counter!(LEASES_EXPIRED, "level" => level.as_str()).increment(0);
    }
    register_alerts();
    for code in ["UNAUTHENTICATED", "PERMISSION_DENIED"] {
        counter!(AUTH_REFUSED, "code" => code).increment(0);
    }
    gauge!(BREAKER_STATE).set(0.0);
    gauge!(GLOBAL_LEASES_ACTIVE).set(0.0);
    register_admission(known.max_in_flight);
    counter!(CLUSTER_GLOBAL_DECISIONS).increment(0);
    counter!(CLUSTER_GLOBAL_CALLS).increment(0);
}

/// The series of one tier: decisions by outcome, token counters, the commit
/// delta, and shadow denials.
fn register_tier(tier: &str) {
    let decided = |reason: &'static str, level: &'static str| {
        counter!(DECISIONS, "result" => if reason == "none" { "allowed" } else { "denied" },
            "reason" => reason, "level" => level, "tier" => tier.to_owned())
        .increment(0);
    };
    decided("none", "none");
    counter!(ENVOY_CHARGED_TOKENS, "tier" => tier.to_owned()).increment(0);
    decided(Reason::ContextTooLarge.as_str(), "none");
    decided(Reason::RequestTooLarge.as_str(), "none");
    decided(Reason::Blocked.as_str(), "tenant");
    decided(Reason::Blocked.as_str(), "user");
    let by_level = [
        Reason::RequestsExceeded,
        Reason::TokensExceeded,
        Reason::ConcurrencyExceeded,
    ];
    for reason in by_level {
        for level in Level::ALL {
            decided(reason.as_str(), level.as_str());
        }
        for level in [Level::Tenant, Level::User] {
            counter!(SHADOW_DENIALS, "tier" => tier.to_owned(), "reason" => reason.as_str(),
                "level" => level.as_str())
            .increment(0);
        }
    }
    for name in [RESERVED_TOKENS, COMMITTED_TOKENS, REFUNDED_TOKENS] {
        counter!(name, "tier" => tier.to_owned()).increment(0);
    }
    let _ = histogram!(COMMIT_DELTA, "tier" => tier.to_owned());
}
