//! Logs and metrics: the tracing subscriber, the Prometheus exporter, and every
//! metric name, description and bucket layout in one place.
//!
//! Distributions are exported as Prometheus histograms (`_bucket`, `_sum`,
//! `_count`), which sum across replicas; quantile summaries would not. Every
//! metric is described (`# HELP`) and its series with known labels registered
//! at zero when the exporter starts, so dashboards and `rate()` see them from
//! the first scrape.

use crate::config::Settings;
use crate::domain::{Denial, Level, Reason};
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use std::net::SocketAddr;

/// Decisions, labelled `result` (allowed|denied), `reason`, `level` and `tier`.
pub const DECISIONS: &str = "ctxbudget_decisions_total";
/// Tokens reserved by allowed reservations.
pub const RESERVED_TOKENS: &str = "ctxbudget_reserved_tokens_total";
/// Tokens reported used by Commit.
pub const COMMITTED_TOKENS: &str = "ctxbudget_committed_tokens_total";
/// Tokens returned by Refund.
pub const REFUNDED_TOKENS: &str = "ctxbudget_refunded_tokens_total";
/// Actual minus reserved tokens per Commit.
pub const COMMIT_DELTA: &str = "ctxbudget_commit_token_delta";
/// gRPC handling time in seconds, labelled `rpc` and `code`.
pub const RPC_SECONDS: &str = "ctxbudget_rpc_duration_seconds";
/// Store call time in seconds, labelled `op`.
pub const STORE_SECONDS: &str = "ctxbudget_store_duration_seconds";
/// Failed store calls, labelled `op` and `kind` (unavailable|protocol|breaker_open).
pub const STORE_ERRORS: &str = "ctxbudget_store_errors_total";
/// The store circuit breaker: 0 closed, 1 half-open, 2 open.
pub const BREAKER_STATE: &str = "ctxbudget_breaker_state";
/// Decisions made without the store, labelled `policy` (local|fail_open).
pub const DEGRADED: &str = "ctxbudget_degraded_decisions_total";
/// Requests a quota in shadow would have denied, labelled `tier`, `reason`, `level`.
pub const SHADOW_DENIALS: &str = "ctxbudget_shadow_denials_total";
/// Prompt tokens the service counted, labelled `method` (exact|fast).
pub const COUNTED_TOKENS: &str = "ctxbudget_counted_prompt_tokens_total";
/// Actual ÷ estimated prompt tokens per Commit, labelled `key`.
pub const ESTIMATION_RATIO: &str = "ctxbudget_estimation_ratio";
/// The adaptive multiplier in use, labelled `key`.
pub const ESTIMATOR_MULTIPLIER: &str = "ctxbudget_estimator_multiplier";

/// Leases held across every replica, from the global level's concurrency as of
/// this replica's last reservation (needs a global concurrency limit).
pub const GLOBAL_LEASES_ACTIVE: &str = "ctxbudget_global_leases_active";
/// Leases that lapsed without Commit or Refund, counted when reclaimed,
/// labelled `level`: a reservation holds one at each level with a concurrency
/// limit, so one lapsed reservation counts once per such level.
pub const LEASES_EXPIRED: &str = "ctxbudget_leases_expired_total";

/// Reservations whose store call failed (the caller never received them),
/// refunded in the background, labelled `outcome`: cancelled, not_found (the
/// script never ran), expired (the store did not answer before the record's
/// end), failed, dropped (the queue was full).
pub const CANCELLATIONS: &str = "ctxbudget_cancellations_total";
/// Reservations waiting to be cancelled.
pub const CANCELLATIONS_PENDING: &str = "ctxbudget_cancellations_pending";

/// Counts one cancellation's outcome.
pub fn cancellation(outcome: &'static str) {
    counter!(CANCELLATIONS, "outcome" => outcome).increment(1);
}

/// Publishes the cancellation queue's length.
pub fn cancellations_pending(n: usize) {
    metrics::gauge!(CANCELLATIONS_PENDING).set(n as f64);
}

/// Calls refused by authentication, labelled `code` (UNAUTHENTICATED,
/// PERMISSION_DENIED).
pub const AUTH_REFUSED: &str = "ctxbudget_auth_refused_total";

/// Buckets of the latency histograms, in seconds: 100 µs (a local store
/// call) to 2.5 s (far past any store deadline).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Buckets of the commit token delta: decades either side of an exact estimate.
pub const DELTA_BUCKETS: &[f64] = &[
    -100_000.0, -10_000.0, -1000.0, -100.0, -10.0, 0.0, 10.0, 100.0, 1000.0, 10_000.0, 100_000.0,
];
/// Buckets of the estimation ratio: fine around 1 (a good estimate), coarse
/// out to the largest multiplier.
pub const RATIO_BUCKETS: &[f64] = &[
    0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5, 2.0, 3.0,
];

/// The RPCs, as `api::service` labels them.
const RPCS: [&str; 6] = [
    "CheckAndReserve",
    "Commit",
    "Refund",
    "RenewLease",
    "GetEstimator",
    "GetStatus",
];
/// The store calls, as `engine` labels them.
const STORE_OPS: [&str; 11] = [
    "reserve",
    "commit",
    "refund",
    "renew",
    "status",
    "estimator",
    "probe",
    "shadow_reserve",
    "shadow_commit",
    "shadow_refund",
    "shadow_renew",
];
/// The kinds of store failure.
const STORE_ERROR_KINDS: [&str; 4] = ["unavailable", "protocol", "settings", "breaker_open"];
/// How a cancellation of a reservation never returned to its caller ends.
pub const CANCEL_OUTCOMES: [&str; 5] = ["cancelled", "not_found", "expired", "failed", "dropped"];

/// Serves Prometheus metrics at `http://addr/metrics`: distributions as
/// histograms, every metric described, and the series whose labels are known
/// at start (those of `settings`' tiers and estimator groups among them)
/// registered at zero.
pub fn serve_metrics(addr: SocketAddr, settings: &Settings) -> Result<(), BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(COMMIT_DELTA.into()), DELTA_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(ESTIMATION_RATIO.into()), RATIO_BUCKETS)?
        .install()?;
    describe();
    register(settings);
    Ok(())
}

/// Gives every metric its `# HELP` line and unit.
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
    describe_gauge!(
        GLOBAL_LEASES_ACTIVE,
        "Leases held across all replicas, as of this replica's last reservation"
    );
}

/// Registers at zero every series whose labels are known at start, so each
/// documented metric is on the first scrape and a first increment shows in
/// `rate()`. Series of tiers or estimator keys that appear later (a tier set
/// in Redis, a model first seen) are created when first used.
pub fn register(settings: &Settings) {
    for tier in settings.limits.tiers.keys() {
        register_tier(tier);
    }
    for key in settings.models.keys() {
        gauge!(ESTIMATOR_MULTIPLIER, "key" => key.to_owned()).set(settings.adaptive.initial);
        let _ = histogram!(ESTIMATION_RATIO, "key" => key.to_owned());
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
    for level in [Level::Global, Level::Tenant, Level::User] {
        counter!(LEASES_EXPIRED, "level" => level.as_str()).increment(0);
    }
    for code in [tonic::Code::Unauthenticated, tonic::Code::PermissionDenied] {
        counter!(AUTH_REFUSED, "code" => code_name(code)).increment(0);
    }
    gauge!(BREAKER_STATE).set(0.0);
    gauge!(GLOBAL_LEASES_ACTIVE).set(0.0);
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
    decided(Reason::ContextTooLarge.as_str(), "none");
    decided(Reason::RequestTooLarge.as_str(), "none");
    let by_level = [
        Reason::RequestsExceeded,
        Reason::TokensExceeded,
        Reason::ConcurrencyExceeded,
    ];
    for reason in by_level {
        for level in [Level::Global, Level::Tenant, Level::User] {
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

/// Counts one call refused by authentication or a tenant binding.
pub fn auth_refused(code: tonic::Code) {
    counter!(AUTH_REFUSED, "code" => code_name(code)).increment(1);
}

/// Counts leases reclaimed at `level` after lapsing unsettled.
pub fn leases_expired(level: &'static str, n: u64) {
    if n > 0 {
        counter!(LEASES_EXPIRED, "level" => level).increment(n);
    }
}

/// Publishes the leases held at the global level.
pub fn global_leases_active(n: i64) {
    gauge!(GLOBAL_LEASES_ACTIVE).set(n as f64);
}

/// Counts one CheckAndReserve decision and, when allowed, its reserved tokens.
pub fn decision(tier: &str, denial: Option<&Denial>, reserved_tokens: u64) {
    if denial.is_none() && reserved_tokens > 0 {
        counter!(RESERVED_TOKENS, "tier" => tier.to_owned()).increment(reserved_tokens);
    }
    let (result, reason, level) = match denial {
        None => ("allowed", "none", "none"),
        Some(d) => (
            "denied",
            d.reason.as_str(),
            d.level.map_or("none", |l| l.as_str()),
        ),
    };
    counter!(DECISIONS, "result" => result, "reason" => reason, "level" => level, "tier" => tier.to_owned())
        .increment(1);
}

/// Records one store call.
pub fn store_call(op: &'static str, seconds: f64, error: Option<&'static str>) {
    histogram!(STORE_SECONDS, "op" => op).record(seconds);
    if let Some(kind) = error {
        counter!(STORE_ERRORS, "op" => op, "kind" => kind).increment(1);
    }
}

/// Publishes the breaker's state.
pub fn breaker(state: crate::engine::BreakerState) {
    gauge!(BREAKER_STATE).set(state.gauge());
}

/// Counts one decision made without the store.
pub fn degraded(policy: &'static str) {
    counter!(DEGRADED, "policy" => policy).increment(1);
}

/// Counts one would-be denial of a quota in shadow.
pub fn shadow_denial(tier: &str, d: &Denial) {
    counter!(
        SHADOW_DENIALS,
        "tier" => tier.to_owned(),
        "reason" => d.reason.as_str(),
        "level" => d.level.map_or("none", |l| l.as_str())
    )
    .increment(1);
}

/// Counts one applied Commit.
pub fn committed(tier: &str, actual: u64, delta: i64) {
    counter!(COMMITTED_TOKENS, "tier" => tier.to_owned()).increment(actual);
    histogram!(COMMIT_DELTA, "tier" => tier.to_owned()).record(delta as f64);
}

/// Counts one applied Refund.
pub fn refunded(tier: &str, tokens: u64) {
    counter!(REFUNDED_TOKENS, "tier" => tier.to_owned()).increment(tokens);
}

/// Counts prompt tokens the service counted.
pub fn counted(method: &'static str, tokens: u64) {
    counter!(COUNTED_TOKENS, "method" => method).increment(tokens);
}

/// Records one estimation sample.
pub fn estimation(key: &str, ratio: f64) {
    histogram!(ESTIMATION_RATIO, "key" => key.to_owned()).record(ratio);
}

/// Publishes a key's multiplier.
pub fn multiplier(key: &str, value: f64) {
    gauge!(ESTIMATOR_MULTIPLIER, "key" => key.to_owned()).set(value);
}

/// Records one RPC's handling time.
pub fn rpc(rpc: &'static str, code: tonic::Code, seconds: f64) {
    histogram!(RPC_SECONDS, "rpc" => rpc, "code" => code_name(code)).record(seconds);
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        InvalidArgument => "INVALID_ARGUMENT",
        NotFound => "NOT_FOUND",
        FailedPrecondition => "FAILED_PRECONDITION",
        Unavailable => "UNAVAILABLE",
        Unauthenticated => "UNAUTHENTICATED",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        Internal => "INTERNAL",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        Cancelled => "CANCELLED",
        _ => "OTHER",
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global tracing subscriber; `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a file, a pipe or a log
    // collector would keep the escape codes as text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
