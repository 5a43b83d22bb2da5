//! Logs and metrics: the tracing subscriber, the Prometheus exporter, and every
//! metric name, description and bucket layout in one place.
//!
//! Distributions are exported as Prometheus histograms (`_bucket`, `_sum`,
//! `_count`), which sum across replicas; quantile summaries would not. Every
//! metric is described (`# HELP`) and its series with known labels registered
//! at zero when the exporter starts, so dashboards and `rate()` see them from
//! the first scrape.
//!
//! A leaf: it knows the domain's vocabulary (levels, reasons) and nothing
//! else of the crate; callers hand it plain values.
//!
//! - this file: every metric name, and the functions that record them.
//! - [`exporter`]: the Prometheus exporter, descriptions and series at zero.
//! - [`logging`]: the tracing subscriber.
//! - [`traces`]: spans exported over OTLP, and the caller's trace context.
//!
//! Size: every metric's name and recording function in one file, so a
//! dashboard's author finds them all in one place.

mod exporter;
mod logging;
pub mod traces;

pub use exporter::{KnownSeries, describe, install_metrics, register, render};
pub use logging::{LogFormat, init_logging, init_logging_with, log_subscriber};

use crate::domain::Denial;
use metrics::{counter, gauge, histogram};
use std::sync::atomic::{AtomicU64, Ordering};

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
/// What committed usage cost (µ$), labelled `tenant` (the first
/// [`COST_TENANTS`] tenants seen, then `other`) and `model_group` (configured
/// groups, or `none`).
pub const COST_MICROS: &str = "ctxbudget_cost_micros_total";
/// Threshold alerts emitted (sent, or logged with no receiver), labelled
/// `level` and `dimension`.
pub const ALERTS: &str = "ctxbudget_alerts_total";
/// Threshold alert deliveries that failed (each is retried), labelled
/// `reason` ([`ALERT_FAILURE_REASONS`]).
pub const ALERT_FAILURES: &str = "ctxbudget_alert_delivery_failures_total";
/// Why a delivery failed.
pub const ALERT_FAILURE_REASONS: [&str; 3] = ["status", "timeout", "connect"];
/// Threshold alerts given up, labelled `reason` ([`ALERT_DROP_REASONS`]).
pub const ALERTS_DROPPED: &str = "ctxbudget_alerts_dropped_total";
/// Why the sender gave an alert up.
pub const ALERT_DROP_REASONS: [&str; 2] = ["too_old", "unreadable"];
/// Tenants that get a `tenant` label of their own on [`COST_MICROS`]; the rest
/// share `other`, so hostile or numerous tenant ids cannot grow the series.
pub const COST_TENANTS: usize = 1000;
/// Denials by a model group's limit or context window, labelled `model_group`,
/// `reason`, `level` and `dimension`.
pub const MODEL_GROUP_DENIALS: &str = "ctxbudget_model_group_denials_total";
/// Requests a quota in shadow would have denied, labelled `tier`, `reason`, `level`.
pub const SHADOW_DENIALS: &str = "ctxbudget_shadow_denials_total";
/// Prompt tokens the service counted, labelled `method` (exact|fast).
pub const COUNTED_TOKENS: &str = "ctxbudget_counted_prompt_tokens_total";
/// Actual ÷ estimated prompt tokens per Commit, labelled `key`.
pub const ESTIMATION_RATIO: &str = "ctxbudget_estimation_ratio";
/// The adaptive multiplier in use, labelled `key`.
pub const ESTIMATOR_MULTIPLIER: &str = "ctxbudget_estimator_multiplier";
/// Commits whose actual prompt exceeded the prompt reserved for it, labelled
/// `key`: ÷ `ctxbudget_estimation_ratio_count` is the achieved under-reservation rate.
pub const UNDER_RESERVED: &str = "ctxbudget_estimator_under_reserved_total";

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

/// Budget and Envoy calls being worked on (`[server] max_in_flight` bounds it).
pub const IN_FLIGHT: &str = "ctxbudget_in_flight";
/// `[server] max_in_flight`.
pub const IN_FLIGHT_LIMIT: &str = "ctxbudget_in_flight_limit";
/// Calls shed before any work, labelled `reason`: full (no slot freed within
/// `queue_ms`: RESOURCE_EXHAUSTED) or deadline (the call's own deadline ran
/// out first: DEADLINE_EXCEEDED).
pub const SHED: &str = "ctxbudget_shed_total";

/// Sets the calls in flight.
pub fn in_flight(n: usize) {
    gauge!(IN_FLIGHT).set(n as f64);
}

/// Sets the limit of calls in flight.
pub fn in_flight_limit(n: usize) {
    gauge!(IN_FLIGHT_LIMIT).set(n as f64);
}

/// Calls waiting in line for a shared level.
pub const QUEUE_WAITING: &str = "ctxbudget_queue_waiting";
/// How long calls waited in line, by outcome.
pub const QUEUE_WAIT_SECONDS: &str = "ctxbudget_queue_wait_seconds";

/// Publishes the calls waiting in line for the global level's account.
pub fn queue_waiting(n: usize) {
    gauge!(QUEUE_WAITING, "level" => "global").set(n as f64);
}

/// Records a wait in line and how it ended (granted, expired, denied,
/// cancelled, failed).
pub fn queue_wait(outcome: &'static str, seconds: f64) {
    histogram!(QUEUE_WAIT_SECONDS, "outcome" => outcome).record(seconds);
}

/// Spans exported over OTLP.
pub const TRACE_SPANS_EXPORTED: &str = "ctxbudget_trace_spans_exported_total";
/// Spans dropped before export, by `reason` ([`TRACE_DROP_REASONS`]).
pub const TRACE_SPANS_DROPPED: &str = "ctxbudget_trace_spans_dropped_total";
/// Why a span was dropped: its queue was full, or its batch's export
/// failed or timed out.
pub const TRACE_DROP_REASONS: [&str; 2] = ["queue_full", "export_failed"];

/// Counts `n` spans exported.
pub fn trace_spans_exported(n: usize) {
    counter!(TRACE_SPANS_EXPORTED).increment(n as u64);
}

/// Counts `n` spans dropped for `reason`.
pub fn trace_spans_dropped(reason: &'static str, n: usize) {
    counter!(TRACE_SPANS_DROPPED, "reason" => reason).increment(n as u64);
}

/// Counts a call shed, by `reason` (full|deadline).
pub fn shed(reason: &'static str) {
    counter!(SHED, "reason" => reason).increment(1);
}

/// Counts one cancellation's outcome.
pub fn cancellation(outcome: &'static str) {
    counter!(CANCELLATIONS, "outcome" => outcome).increment(1);
}

/// Publishes the cancellation queue's length.
pub fn cancellations_pending(n: usize) {
    metrics::gauge!(CANCELLATIONS_PENDING).set(n as f64);
}

/// Envoy rate limit descriptors, labelled `outcome` (ok, over_limit, charged:
/// a response-path charge, unmapped: no entry key maps, other_domain: a
/// domain not served), `reason` and `level` (of an over_limit), and `tier`.
pub const ENVOY_DESCRIPTORS: &str = "ctxbudget_envoy_descriptors_total";
/// Tokens charged by Envoy's response path, labelled `tier`.
pub const ENVOY_CHARGED_TOKENS: &str = "ctxbudget_envoy_charged_tokens_total";
/// The outcomes of [`ENVOY_DESCRIPTORS`].
pub const ENVOY_OUTCOMES: [&str; 5] = ["ok", "over_limit", "charged", "unmapped", "other_domain"];

/// Counts one Envoy descriptor's outcome (`denial` for over_limit; `tier`
/// "none" when it names none).
pub fn envoy_descriptor(outcome: &'static str, tier: &str, denial: Option<&Denial>) {
    let (reason, level) = denial.map_or(("none", "none"), |d| {
        (d.reason.as_str(), d.level.map_or("none", |l| l.as_str()))
    });
    counter!(ENVOY_DESCRIPTORS, "outcome" => outcome, "reason" => reason, "level" => level,
        "tier" => tier.to_owned())
    .increment(1);
}

/// Counts tokens a response-path descriptor charged.
pub fn envoy_charged(tier: &str, tokens: u64) {
    counter!(ENVOY_CHARGED_TOKENS, "tier" => tier.to_owned()).increment(tokens);
}

/// Requests the external processor saw, by outcome: `reserved`, `denied`
/// (a limit, answered 429/413/403), `refused` (bad input, the store
/// unavailable), `passed` (no LLM call).
pub const EXT_PROC_REQUESTS: &str = "ctxbudget_ext_proc_requests_total";
/// Reservations of the external processor settled, by how: `usage` (the
/// provider's count), `delivered` (the text that reached the caller),
/// `refunded`, `failed` (the store did not answer: the lease lapses).
pub const EXT_PROC_SETTLED: &str = "ctxbudget_ext_proc_settled_total";

/// The outcomes of [`EXT_PROC_REQUESTS`].
pub const EXT_PROC_OUTCOMES: [&str; 4] = ["reserved", "denied", "refused", "passed"];
/// The ways of [`EXT_PROC_SETTLED`].
pub const EXT_PROC_SETTLEMENTS: [&str; 4] = ["usage", "delivered", "refunded", "failed"];

/// Counts one request the external processor saw.
pub fn ext_proc_request(outcome: &'static str) {
    counter!(EXT_PROC_REQUESTS, "outcome" => outcome).increment(1);
}

/// Counts one reservation the external processor settled.
pub fn ext_proc_settled(how: &'static str) {
    counter!(EXT_PROC_SETTLED, "how" => how).increment(1);
}

/// On a Redis Cluster: reservations and charges with a global entry, decided
/// from this replica's leased share of the global level.
pub const CLUSTER_GLOBAL_DECISIONS: &str = "ctxbudget_cluster_global_decisions_total";
/// On a Redis Cluster: this replica's calls to the global key (lease syncs,
/// `lua/global_lease.lua`).
pub const CLUSTER_GLOBAL_CALLS: &str = "ctxbudget_cluster_global_key_calls_total";

/// The process's totals of [`CLUSTER_GLOBAL_DECISIONS`] and
/// [`CLUSTER_GLOBAL_CALLS`], which `ctxbudget bench` reads without a metrics
/// recorder.
static CLUSTER_GLOBAL: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Counts one reservation or charge with a global entry on a Redis Cluster.
pub fn cluster_global_decision() {
    counter!(CLUSTER_GLOBAL_DECISIONS).increment(1);
    CLUSTER_GLOBAL[0].fetch_add(1, Ordering::Relaxed);
}

/// Counts one call to the global key on a Redis Cluster.
pub fn cluster_global_call() {
    counter!(CLUSTER_GLOBAL_CALLS).increment(1);
    CLUSTER_GLOBAL[1].fetch_add(1, Ordering::Relaxed);
}

/// (reservations and charges with a global entry, calls to the global key)
/// made by every cluster store in this process so far: the bench's global-key
/// calls per reservation.
pub fn cluster_global_counts() -> (u64, u64) {
    let [decisions, calls] = &CLUSTER_GLOBAL;
    (
        decisions.load(Ordering::Relaxed),
        calls.load(Ordering::Relaxed),
    )
}

/// Calls refused by authentication, labelled `code` (UNAUTHENTICATED,
/// PERMISSION_DENIED).
pub const AUTH_REFUSED: &str = "ctxbudget_auth_refused_total";

/// Buckets of the latency histograms, in seconds: 100 µs (a local store
/// call) to 2.5 s (far past any store deadline).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Buckets of a wait in line, in seconds: up to `max_wait_ms`'s minute.
pub const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// How a wait in line ends.
pub const WAIT_OUTCOMES: [&str; 6] = [
    "granted",
    "expired",
    "denied",
    "cancelled",
    "full",
    "failed",
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
pub(crate) const RPCS: [&str; 7] = [
    "CheckAndReserve",
    "Commit",
    "Refund",
    "RenewLease",
    "GetEstimator",
    "GetStatus",
    "ShouldRateLimit",
];
/// The store calls, as `engine` labels them.
pub(crate) const STORE_OPS: [&str; 13] = [
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
    "charge",
    "shadow_charge",
];
/// The kinds of store failure.
pub(crate) const STORE_ERROR_KINDS: [&str; 4] =
    ["unavailable", "protocol", "settings", "breaker_open"];
/// How a cancellation of a reservation never returned to its caller ends.
pub const CANCEL_OUTCOMES: [&str; 5] = ["cancelled", "not_found", "expired", "failed", "dropped"];

/// Counts one call refused by authentication or a tenant binding.
pub fn auth_refused(code: &'static str) {
    counter!(AUTH_REFUSED, "code" => code).increment(1);
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
    if let Some(d) = denial
        && let Some(group) = &d.model_group
    {
        let dimension = d.dimension.map_or("none", |d| d.as_str());
        counter!(MODEL_GROUP_DENIALS, "model_group" => group.clone(), "reason" => reason,
            "level" => level, "dimension" => dimension)
        .increment(1);
    }
}

/// Records one store call.
pub fn store_call(op: &'static str, seconds: f64, error: Option<&'static str>) {
    histogram!(STORE_SECONDS, "op" => op).record(seconds);
    if let Some(kind) = error {
        counter!(STORE_ERRORS, "op" => op, "kind" => kind).increment(1);
    }
}

/// The store circuit breaker's state as the gauge shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerGauge {
    /// Calls flow: 0.
    Closed,
    /// A few probe calls flow: 1.
    HalfOpen,
    /// Calls fail at once: 2.
    Open,
}

impl BreakerGauge {
    /// The gauge's value.
    pub fn value(self) -> f64 {
        match self {
            BreakerGauge::Closed => 0.0,
            BreakerGauge::HalfOpen => 1.0,
            BreakerGauge::Open => 2.0,
        }
    }
}

/// Publishes the breaker's state.
pub fn breaker(state: impl Into<BreakerGauge>) {
    gauge!(BREAKER_STATE).set(state.into().value());
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

/// Adds what one Commit cost, µ$.
pub fn cost(tenant: &str, model_group: &str, micros: u64) {
    if micros == 0 {
        return;
    }
    let tenant = cost_tenant(tenant);
    let group = if model_group.is_empty() {
        "none"
    } else {
        model_group
    };
    counter!(COST_MICROS, "tenant" => tenant, "model_group" => group.to_owned()).increment(micros);
}

/// The `tenant` label of [`COST_MICROS`]: the tenant for the first
/// [`COST_TENANTS`] seen, `other` after.
fn cost_tenant(tenant: &str) -> String {
    static SEEN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::LazyLock::new(Default::default);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.contains(tenant) {
        return tenant.to_owned();
    }
    if seen.len() < COST_TENANTS {
        seen.insert(tenant.to_owned());
        return tenant.to_owned();
    }
    "other".into()
}

/// Counts one threshold alert emitted.
pub fn alert(level: &'static str, dimension: &'static str) {
    counter!(ALERTS, "level" => level, "dimension" => dimension).increment(1);
}

/// Counts one failed alert delivery (`reason`: status, timeout, connect).
pub fn alert_failed(reason: &'static str) {
    counter!(ALERT_FAILURES, "reason" => reason).increment(1);
}

/// Counts one alert given up (`reason`: too_old, unreadable).
pub fn alert_dropped(reason: &'static str) {
    counter!(ALERTS_DROPPED, "reason" => reason).increment(1);
}

/// Counts one applied Refund.
pub fn refunded(tier: &str, tokens: u64) {
    counter!(REFUNDED_TOKENS, "tier" => tier.to_owned()).increment(tokens);
}

/// Counts prompt tokens the service counted.
pub fn counted(method: &'static str, tokens: u64) {
    counter!(COUNTED_TOKENS, "method" => method).increment(tokens);
}

/// Records one estimation sample, and whether the prompt reserved fell short.
pub fn estimation(key: &str, ratio: f64, under_reserved: bool) {
    histogram!(ESTIMATION_RATIO, "key" => key.to_owned()).record(ratio);
    if under_reserved {
        counter!(UNDER_RESERVED, "key" => key.to_owned()).increment(1);
    }
}

/// Publishes a key's multiplier.
pub fn multiplier(key: &str, value: f64) {
    gauge!(ESTIMATOR_MULTIPLIER, "key" => key.to_owned()).set(value);
}

/// Records one RPC's handling time and its code (gRPC's canonical name,
/// `OK` or the error kind's).
pub fn rpc(rpc: &'static str, code: &'static str, seconds: f64) {
    histogram!(RPC_SECONDS, "rpc" => rpc, "code" => code).record(seconds);
}
