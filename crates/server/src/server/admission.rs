//! Admission under overload, for gRPC (the gate itself is the application's,
//! [`crate::app::admission`], shared with the HTTP API and the external
//! processor's reservations): at most `[server] max_in_flight` budget and
//! Envoy calls are worked on at once; a call that finds them all busy waits
//! at most `queue_ms` (or half its own gRPC deadline, if less: the other half
//! is for its work) for one to free, and is otherwise shed — `RESOURCE_EXHAUSTED` with a retry
//! hint, or `DEADLINE_EXCEEDED` when its deadline ran out while it waited —
//! without any of its work started. So the latency of what is served stays
//! bounded by what the service can do at once, and memory stays flat however
//! many calls arrive. Only decisions are gated (CheckAndReserve and Envoy's
//! ShouldRateLimit): Commit, Refund and RenewLease free what reservations
//! hold and are never shed, nor are GetStatus, GetEstimator, health and
//! reflection.

/// The calls that take a slot: the decisions.
const GATED: [&str; 2] = [
    "/ctxbudget.v1.BudgetService/CheckAndReserve",
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
];

use crate::app::{Gate, Slot};
use std::sync::Arc;
use std::time::Duration;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::server::NamedService;

/// A gRPC service whose calls pass the [`Gate`] first.
#[derive(Clone)]
pub(super) struct Admission<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<S> Admission<S> {
    /// `inner` behind `gate`.
    pub(super) fn new(inner: S, gate: Arc<Gate>) -> Self {
        Admission { inner, gate }
    }
}

impl<S: NamedService> NamedService for Admission<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Admission<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // The service made ready is the one called (tower's contract); a
        // clone takes its place for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !GATED.contains(&request.uri().path()) {
            return Box::pin(inner.call(request));
        }
        let gate = self.gate.clone();
        let deadline = grpc_timeout(request.headers());
        let mut request = request;
        Box::pin(async move {
            let slot = match gate.admit(deadline).await {
                Ok(permit) => Arc::new(Slot::new(permit)),
                Err(shed) => return Ok(tonic::Status::from(shed).into_http()),
            };
            // The handler may give the slot back early (a call waiting in
            // line holds none); else it frees when this call ends.
            request.extensions_mut().insert(slot.clone());
            let response = inner.call(request).await;
            drop(slot);
            response
        })
    }
}

/// The caller's deadline from its `grpc-timeout` header (an integer of at
/// most 8 digits and a unit: H, M, S, m, u, n), if it sent one.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_timeout_header_reads_in_every_unit() {
        let read = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        assert_eq!(read("20m"), Some(Duration::from_millis(20)));
        assert_eq!(read("2S"), Some(Duration::from_secs(2)));
        assert_eq!(read("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(read("1500u"), Some(Duration::from_micros(1500)));
        assert_eq!(read("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(read("5x"), None);
        assert_eq!(read("m"), None);
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }
}
