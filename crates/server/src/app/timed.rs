//! One operation, as every front door reports it: in a span that names it
//! (and the reservation it is about), its duration and outcome recorded as
//! `ctxbudget_rpc_seconds{rpc, code}`, and an error logged at debug. With
//! traces on, the span is exported as a child of the caller's trace, with
//! the time the operation waited on the store.

use super::error::AppError;
use std::time::Instant;

/// The span every log line of one operation carries: its RPC's name and, for
/// calls about a reservation, its id (CheckAndReserve records it once it has
/// one). A malformed id is cut short: logs stay bounded whatever a client
/// sends.
pub fn span(rpc: &'static str, reservation: Option<&str>) -> tracing::Span {
    // Traces on: named after the RPC (fields given at creation: recording
    // them later costs the log layer a formatting each), a child of the
    // caller's trace.
    let span = match crate::telemetry::traces::on() {
        true => tracing::info_span!(
            "rpc",
            rpc,
            reservation = tracing::field::Empty,
            "otel.name" = rpc,
            "otel.kind" = "server",
        ),
        false => tracing::info_span!("rpc", rpc, reservation = tracing::field::Empty),
    };
    crate::telemetry::traces::adopt(&span);
    if let Some(id) = reservation {
        let shown = match id.char_indices().nth(MAX_LOGGED_ID) {
            Some((end, _)) => &id[..end],
            None => id,
        };
        span.record("reservation", shown);
    }
    span
}

/// Longest reservation id written to a log (valid ids are far shorter).
const MAX_LOGGED_ID: usize = 160;

/// Runs `body`, the operation `rpc`, in `span`, and records its duration
/// and code.
pub async fn timed<T>(
    rpc: &'static str,
    span: tracing::Span,
    body: impl Future<Output = Result<T, AppError>>,
) -> Result<T, AppError> {
    use tracing::Instrument;
    let started = Instant::now();
    let result = crate::telemetry::traces::timing_store(body)
        .instrument(span.clone())
        .await;
    // No await below: the guard cannot cross one.
    let _entered = span.enter();
    let code = result
        .as_ref()
        .map_or_else(|e| e.kind().code_name(), |_| "OK");
    crate::telemetry::rpc(rpc, code, started.elapsed().as_secs_f64());
    if let Err(e) = &result {
        tracing::debug!(code, message = e.message(), "rpc failed");
        crate::telemetry::traces::failed(code);
    }
    result
}
