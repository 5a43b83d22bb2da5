//! Admission under overload: at most `[server] max_in_flight` budget and
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

use crate::config::AdmissionSettings;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// The slots every admitted call shares, across connections and services.
pub(super) struct Gate {
    slots: Arc<Semaphore>,
    settings: AdmissionSettings,
}

impl Gate {
    /// A gate of `settings.max_in_flight` slots.
    pub(super) fn new(settings: AdmissionSettings) -> Arc<Self> {
        crate::telemetry::in_flight_limit(settings.max_in_flight);
        Arc::new(Gate {
            slots: Arc::new(Semaphore::new(settings.max_in_flight)),
            settings,
        })
    }

    /// The refusal of a call that found no slot in time; `deadline`: its
    /// own deadline ran out first.
    fn shed(&self, deadline: bool) -> Status {
        let s = &self.settings;
        let mut status = match deadline {
            true => {
                crate::telemetry::shed("deadline");
                Status::new(
                    Code::DeadlineExceeded,
                    format!(
                        "half the call's deadline passed while it waited for one of the \
                         {} calls in flight to finish ([server] max_in_flight), too little \
                         to be served in; nothing was done: retry with a longer deadline, \
                         or later",
                        s.max_in_flight
                    ),
                )
            }
            false => {
                crate::telemetry::shed("full");
                Status::new(
                    Code::ResourceExhausted,
                    format!(
                        "the service is at its limit of {} calls in flight ([server] \
                         max_in_flight) and none finished within {} ms; nothing was \
                         done: retry after {} ms",
                        s.max_in_flight,
                        s.queue.as_millis(),
                        s.retry_ms
                    ),
                )
            }
        };
        // gRPC's retry pushback: a client retrying by policy waits this long.
        if let Ok(v) = s.retry_ms.to_string().parse() {
            status.metadata_mut().insert("grpc-retry-pushback-ms", v);
        }
        status
    }
}

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
        Box::pin(async move {
            let permit = match gate.slots.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    let queue = gate.settings.queue;
                    let wait = deadline.map_or(queue, |d| (d / 2).min(queue));
                    match tokio::time::timeout(wait, gate.slots.clone().acquire_owned()).await {
                        Ok(Ok(permit)) => permit,
                        _ => {
                            let ran_out = deadline.is_some_and(|d| d / 2 <= queue);
                            return Ok(gate.shed(ran_out).into_http());
                        }
                    }
                }
            };
            crate::telemetry::in_flight(
                gate.settings.max_in_flight - gate.slots.available_permits(),
            );
            let response = inner.call(request).await;
            drop(permit);
            crate::telemetry::in_flight(
                gate.settings.max_in_flight - gate.slots.available_permits(),
            );
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
