//! Logs and metrics: the tracing subscriber, and every metric name in one place.

use crate::domain::Denial;
use metrics::{counter, histogram};

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
    metrics::gauge!(GLOBAL_LEASES_ACTIVE).set(n as f64);
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
    metrics::gauge!(BREAKER_STATE).set(state.gauge());
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
    metrics::gauge!(ESTIMATOR_MULTIPLIER, "key" => key.to_owned()).set(value);
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
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
