//! `ctxbudget health`: asks a running service's `grpc.health.v1` whether it is
//! SERVING, and exits 0 only if it is. A container healthcheck that needs
//! nothing but the binary (the slim image has no `grpc_health_probe`).

use super::output::outln;
use anyhow::{Context, bail};
use std::time::Duration;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// `ctxbudget health` flags.
#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// The service's gRPC address (plaintext), `host:port`.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// The service to ask about: '' (the server as a whole) or
    /// `ctxbudget.v1.BudgetService`.
    #[arg(long, default_value = "")]
    pub service: String,
    /// How long to wait for an answer, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub timeout_ms: u64,
}

/// Succeeds when the service answers SERVING; otherwise says what it answered.
pub(super) async fn health(args: HealthArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let addr = &args.addr;
    let endpoint = Channel::from_shared(format!("http://{addr}"))
        .with_context(|| format!("--addr {addr:?} is not host:port"))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("cannot reach {addr}"))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: args.service.clone(),
        })
        .await
        .map_err(|s| {
            let code = s.code().description();
            anyhow::anyhow!("{addr} answered: {code} ({})", s.message())
        })?;
    match reply.into_inner().status() {
        ServingStatus::Serving => {
            outln!("{addr}: SERVING");
            Ok(())
        }
        status => bail!("{addr}: {}", status.as_str_name()),
    }
}
