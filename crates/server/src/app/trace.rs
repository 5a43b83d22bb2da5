//! The caller's trace, as every front door reads it: W3C `traceparent` and
//! `tracestate` from the headers its request came with (gRPC metadata are
//! HTTP/2 headers too), made the parent of the operation's span
//! (`timed::span`) while the request is worked on; and what a decision puts
//! on that span. Nothing here runs when traces are off.

use crate::domain::ReservationId;
use crate::engine::ReserveOutcome;
use crate::telemetry::traces::{self, Parent};

pub use traces::within;
use tracing::Instrument as _;

/// The trace context `headers` carry, when traces are on.
pub fn parent_of(headers: &axum::http::HeaderMap) -> Option<Parent> {
    traces::parent_from(|name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    })
}

/// Runs `work`, an operation a front door does without an RPC of its own
/// (the external processor's reservation and settlement), in a span named
/// `name` that is a child of `parent`. Traces off: just `work`.
pub async fn traced<F: Future>(
    name: &'static str,
    reservation: Option<&str>,
    parent: Option<Parent>,
    work: F,
) -> F::Output {
    if !traces::on() {
        return work.await;
    }
    within(parent, async move {
        let span = super::span(name, reservation);
        traces::timing_store(work).instrument(span).await
    })
    .await
}

/// `id` as its span names it, when traces are on (no string is made
/// otherwise).
pub fn shown(id: &ReservationId) -> Option<String> {
    traces::on().then(|| id.to_string())
}

/// Who asked, on the current operation's span.
pub fn asked(tenant: &str, tier: &str) {
    if let Some(span) = traces::current() {
        traces::set(&span, "ctxbudget.tenant", tenant.to_string());
        traces::set(&span, "ctxbudget.tier", tier.to_string());
    }
}

/// A CheckAndReserve's decision, on the current operation's span.
pub fn decided(out: &ReserveOutcome) {
    let Some(span) = traces::current() else {
        return;
    };
    let group = match &out.denial {
        Some(d) => d.model_group.clone(),
        None => out
            .reservation_id
            .as_deref()
            .and_then(|id| ReservationId::parse(id).ok())
            .map(|id| id.group)
            .filter(|g| !g.is_empty()),
    };
    if let Some(group) = group {
        traces::set(&span, "ctxbudget.model_group", group);
    }
    denial(&span, out.denial.as_ref());
    traces::set(
        &span,
        "ctxbudget.reserved_tokens",
        count(out.reserved_tokens),
    );
    traces::set(&span, "ctxbudget.degraded", out.degraded);
    traces::set(&span, "ctxbudget.waited_ms", count(out.waited_ms));
    if let Some(id) = &out.reservation_id {
        traces::set(&span, "ctxbudget.reservation", id.clone());
        if out.denial.is_none() {
            traces::remember(id);
        }
    }
}

/// The decision on `span`: allowed, or denied with its reason, level and
/// retry.
fn denial(span: &tracing::Span, denial: Option<&crate::domain::Denial>) {
    let decision = match denial {
        None => "allowed",
        Some(_) => "denied",
    };
    traces::set(span, "ctxbudget.decision", decision);
    if let Some(d) = denial {
        traces::set(span, "ctxbudget.reason", d.reason.as_str());
        if let Some(level) = d.level {
            traces::set(span, "ctxbudget.level", level.as_str());
        }
        traces::set(span, "ctxbudget.retry_after_ms", count(d.retry_after_ms));
    }
}

/// An Envoy descriptor's charge for `tenant` on `tier`, on the current
/// operation's span (the last descriptor's, when a request carries several).
pub fn charged(tenant: &str, tier: &str, denied: Option<&crate::domain::Denial>) {
    if let Some(span) = traces::current() {
        asked(tenant, tier);
        denial(&span, denied);
    }
}

/// A Commit, Refund or RenewLease of `id`: its tenant and tier on the
/// current operation's span, which links to the reservation's span when
/// this replica made it; `settled` (a Commit or Refund): the reservation is
/// done with.
pub fn settling(id: &ReservationId, settled: bool) {
    if traces::on() {
        asked(id.tenant.as_str(), &id.tier);
        traces::link_to(&id.to_string(), settled);
    }
}

/// A count as OTel's integer attribute (signed 64-bit).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
