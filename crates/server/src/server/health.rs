//! The gRPC health service (grpc.health.v1): every service served is
//! SERVING, but NOT_SERVING while the store's breaker is open under
//! `fail_closed` (every reservation would be refused).

use crate::engine::Engine;
use crate::store::Store;
use std::sync::Arc;

/// Registers every service as SERVING and starts keeping their status in
/// step with `engine`'s breaker: the task, and the service to serve.
pub(super) async fn start<S: Store>(
    engine: Arc<Engine<S>>,
) -> (
    tokio::task::JoinHandle<()>,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (health, health_service) = tonic_health::server::health_reporter();
    for service in SERVED {
        let serving = tonic_health::ServingStatus::Serving;
        health.set_service_status(service, serving).await;
    }
    (tokio::spawn(report_health(engine, health)), health_service)
}

/// The services whose health is reported: the server's ("") and each one.
const SERVED: [&str; 4] = [
    "",
    "ctxbudget.v1.BudgetService",
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// The gRPC health service says NOT_SERVING while the store's breaker is open
/// and the policy is `fail_closed` (every reservation would be refused); under
/// the degraded policies the service keeps answering, so it stays SERVING.
async fn report_health<S: Store>(
    engine: Arc<Engine<S>>,
    health: tonic_health::server::HealthReporter,
) {
    use crate::engine::{BreakerState, FailurePolicy};
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    let mut serving = true;
    loop {
        tick.tick().await;
        let state = engine.breaker_state();
        crate::telemetry::breaker(state);
        let now_serving =
            !(state == BreakerState::Open && engine.policy() == FailurePolicy::FailClosed);
        if now_serving != serving {
            serving = now_serving;
            let status = if serving {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            tracing::warn!(?status, breaker = state.as_str(), "health changed");
            for service in SERVED {
                health.set_service_status(service, status).await;
            }
        }
    }
}
