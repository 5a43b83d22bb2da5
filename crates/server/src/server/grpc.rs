//! The gRPC services a replica serves, and the listener's TLS.

use super::ServeError;
use super::admission::Admission;
use super::message_limit::MessageLimit;
use super::traced::Traced;
use crate::api::{BudgetApi, interceptor};
use crate::app::App;
use crate::config::{Settings, TlsFiles};
use crate::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use crate::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::gateway::{EnvoyApi, LiveMap};
use crate::gateway::{ExtProcApi, LiveReading};
use crate::pb;
use crate::pb::budget_service_server::BudgetServiceServer;
use crate::store::Store;
use std::sync::Arc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::Router;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// What the Envoy services read requests by, replaced live.
pub(super) struct Faces {
    /// The rate limit service's `[envoy]` map.
    pub(super) envoy_map: Arc<LiveMap>,
    /// The external processor's `[ext_proc]`.
    pub(super) ext_proc: Arc<LiveReading>,
}

/// The gRPC services over `app`: the budget service, Envoy's rate limit
/// service and external processor behind authentication, health, and
/// reflection in both versions (grpcurl speaks v1, while Python's
/// grpcio-reflection and many older tools only speak v1alpha); over TLS when
/// the settings name its files.
pub(super) fn routes<S: Store>(
    app: &Arc<App<S>>,
    faces: Faces,
    settings: &Settings,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
) -> Result<Router, ServeError> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let budget = BudgetServiceServer::new(BudgetApi::new(app.clone()))
        .max_decoding_message_size(settings.max_message_bytes);
    let envoy = RateLimitServiceServer::new(EnvoyApi::new(app.clone(), faces.envoy_map))
        .max_decoding_message_size(settings.max_message_bytes);
    let ext_proc = ExternalProcessorServer::new(ExtProcApi::new(
        app.clone(),
        faces.ext_proc,
        settings.max_message_bytes,
    ))
    .max_decoding_message_size(settings.max_message_bytes);
    // One gate for both (and the HTTP API): the slots bound the work of the
    // whole replica; a call refused by authentication never takes one.
    let budget = Admission::new(budget, app.gate().clone());
    let envoy = Admission::new(envoy, app.gate().clone());
    // Authentication runs on the headers, before the body is even decoded.
    let budget = InterceptedService::new(budget, interceptor(app.auth().clone()));
    let envoy = InterceptedService::new(envoy, interceptor(app.auth().clone()));
    // A stream lives as long as its HTTP request: not gated by the slots,
    // which bound decisions (its reservation takes one while it is made).
    let ext_proc = InterceptedService::new(ext_proc, interceptor(app.auth().clone()));
    let budget = MessageLimit::new(budget, settings.max_message_bytes);
    let envoy = MessageLimit::new(envoy, settings.max_message_bytes);
    // The caller's trace context around all of it (the external processor
    // reads the one of each HTTP request it is sent).
    let budget = Traced::new(budget);
    let envoy = Traced::new(envoy);
    let ext_proc = MessageLimit::new(ext_proc, settings.max_message_bytes);
    let mut builder =
        Server::builder().max_concurrent_streams(Some(settings.admission.max_concurrent_streams));
    if let Some(tls) = &settings.tls {
        builder = builder.tls_config(tls_config(tls)?)?;
    }
    Ok(builder
        .add_service(budget)
        .add_service(envoy)
        .add_service(ext_proc)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha))
}

/// The listener's TLS from its PEM files; with a client CA, clients must
/// present a certificate it signed.
fn tls_config(files: &TlsFiles) -> Result<ServerTlsConfig, ServeError> {
    // rustls needs one process-wide crypto provider; ring is the one linked.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            ServeError::Settings(format!(
                "cannot read the TLS {what} {}: {e}",
                path.display()
            ))
        })
    };
    let identity = Identity::from_pem(read("certificate", &files.cert)?, read("key", &files.key)?);
    let mut config = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &files.client_ca {
        config = config.client_ca_root(Certificate::from_pem(read("client CA", ca)?));
    }
    Ok(config)
}
