//! The command line: `ctxbudget serve`, `bench`, the operator commands
//! (`tiers`, `models`, `prices`, `global`, `overrides`, `inspect`), the
//! ledger's (`usage`, `reconcile`) and `health`.

mod admin;
mod alerts;
mod flags;
mod health;
mod inspect;
mod inspect_ids;
mod inspect_rows;
mod models;
mod output;
mod overrides;
mod prices;
mod reconcile;
mod sections_cmd;
mod tiers;
mod usage;

pub use admin::AdminArgs;
pub use health::HealthArgs;
pub use inspect::InspectArgs;
pub use models::ModelsCmd;
pub use overrides::OverridesCmd;
pub use prices::PricesCmd;
pub use reconcile::ReconcileArgs;
pub use sections_cmd::SectionCmd;
pub use tiers::{GlobalCmd, TiersCmd};
pub use usage::UsageArgs;

use crate::config::{self, Flags};
use crate::server;
use crate::telemetry::{self, LogFormat};
use anyhow::Context;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// ctxbudget: request, token and concurrency budgets for LLM gateways.
#[derive(Debug, Parser)]
#[command(name = "ctxbudget", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC service.
    Serve(ServeArgs),
    /// Load-test a service (or the stores directly) and check nothing was overspent.
    Bench(Box<crate::bench::BenchArgs>),
    /// Tiers in the live configuration (Redis): list, get, set, delete, import,
    /// export, history.
    Tiers {
        /// What to do.
        #[command(subcommand)]
        cmd: TiersCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Model groups in the live configuration (Redis): list, get, set, delete,
    /// import, export.
    Models {
        /// What to do.
        #[command(subcommand)]
        cmd: ModelsCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Prices per model group (USD per million tokens) in the live configuration
    /// (Redis): list, get, set, delete, import, export.
    Prices {
        /// What to do.
        #[command(subcommand)]
        cmd: PricesCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// How Envoy's rate limit descriptors map to budgets, in the live
    /// configuration (Redis): get, set, reset.
    Envoy {
        /// What to do.
        #[command(subcommand)]
        cmd: SectionCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// How Envoy's external processor reads requests (`[ext_proc]`: the
    /// caller's headers, the LLM paths), in the live configuration (Redis):
    /// get, set, reset.
    ExtProc {
        /// What to do.
        #[command(subcommand)]
        cmd: SectionCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The global limits in the live configuration (Redis).
    Global {
        /// What to do.
        #[command(subcommand)]
        cmd: GlobalCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Tenants' overrides (custom deals) in the live configuration (Redis).
    Overrides {
        /// What to do.
        #[command(subcommand)]
        cmd: OverridesCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A tenant's live bucket levels, debt and leases.
    Inspect(InspectArgs),
    /// A tenant's (or user's) usage from the ledger, by hour, day or month.
    Usage(UsageArgs),
    /// Compare the provider's usage export with the ledger, per hour and model
    /// group; exits 1 when a row drifts more than --max-drift.
    Reconcile(ReconcileArgs),
    /// Ask a running service whether it is serving (grpc.health.v1); exits 0
    /// when SERVING. For container healthchecks.
    Health(HealthArgs),
    /// Print the HTTP API's OpenAPI document (what `/openapi.json` serves).
    Openapi,
    /// Threshold alerts: list the queued and recent ones, or send a test event.
    Alerts {
        /// What to do.
        #[command(subcommand)]
        cmd: alerts::AlertsCmd,
        /// Where.
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// `ctxbudget serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on [default from config: 127.0.0.1:50051].
    #[arg(long, env = "CTXBUDGET_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Serve the HTTP/JSON API, the admin API and the console on this address
    /// [default from config: [http] listen; off when unset].
    #[arg(long, env = "CTXBUDGET_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Redis URL (redis://, rediss://); without one the in-memory store is used.
    #[arg(long, env = "CTXBUDGET_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// A Redis Cluster's nodes, comma-separated (redis://127.0.0.1:7000,…);
    /// selects the cluster instead of --redis-url.
    #[arg(
        long,
        env = "CTXBUDGET_REDIS_CLUSTER_NODES",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub redis_cluster_nodes: Vec<String>,
    /// TOML configuration; sections it defines replace the built-in defaults.
    #[arg(long, env = "CTXBUDGET_CONFIG")]
    pub config: Option<PathBuf>,
    /// Prefix of every Redis key [default: ctxb:].
    #[arg(long, env = "CTXBUDGET_KEY_PREFIX")]
    pub key_prefix: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, env = "CTXBUDGET_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log format.
    #[arg(long, env = "CTXBUDGET_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Bench(args) => bench(*args).await,
        Command::Tiers { cmd, admin } => tiers::tiers(cmd, admin).await,
        Command::Models { cmd, admin } => models::models(cmd, admin).await,
        Command::Prices { cmd, admin } => prices::prices(cmd, admin).await,
        Command::Envoy { cmd, admin } => sections_cmd::envoy(cmd, admin).await,
        Command::ExtProc { cmd, admin } => sections_cmd::ext_proc(cmd, admin).await,
        Command::Global { cmd, admin } => tiers::global(cmd, admin).await,
        Command::Overrides { cmd, admin } => overrides::overrides(cmd, admin).await,
        Command::Inspect(args) => inspect::inspect(args).await,
        Command::Usage(args) => usage::usage(args).await,
        Command::Reconcile(args) => reconcile::reconcile(args).await,
        Command::Health(args) => health::health(args).await,
        Command::Alerts { cmd, admin } => alerts::alerts(cmd, admin).await,
        Command::Openapi => output::print_json(&crate::http::openapi::document()),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let overrides = Flags {
        listen: args.listen,
        http_listen: args.http_listen,
        redis_url: args.redis_url,
        redis_cluster_nodes: args.redis_cluster_nodes,
        key_prefix: args.key_prefix,
    };
    // The configuration says where traces go: its own warnings are logged
    // before the subscriber that exports them is installed.
    let log_format = args.log_format;
    let settings =
        tracing::subscriber::with_default(telemetry::log_subscriber(log_format, None), || {
            config::load(args.config.as_deref(), overrides)
        })?;
    let traces = telemetry::traces::start(&settings.traces)?;
    telemetry::init_logging_with(log_format, traces.as_ref().map(|t| t.layer()));
    if let Some(endpoint) = &settings.traces.endpoint {
        tracing::info!(endpoint, protocol = ?settings.traces.protocol, "exporting traces");
    }
    // The gRPC listener first: once /metrics answers, every listener is
    // bound, and a port already taken has ended the process.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    // The console (on the HTTP port) reads the same counters.
    if args.metrics_listen.is_some() || settings.http_listen.is_some() {
        let addr = args.metrics_listen;
        telemetry::install_metrics(addr, &settings).with_context(|| match addr {
            Some(addr) => format!("cannot serve metrics on {addr}"),
            None => "cannot record metrics".to_string(),
        })?;
        if let Some(addr) = addr {
            tracing::info!("metrics at http://{addr}/metrics");
        }
    }
    let served = server::run(settings, listener, shutdown_signal()).await;
    if let Some(traces) = traces {
        traces.shutdown(Duration::from_secs(5)).await;
    }
    served?;
    Ok(())
}

async fn bench(args: crate::bench::BenchArgs) -> anyhow::Result<()> {
    telemetry::init_logging(LogFormat::Text);
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let report = crate::bench::run(args, command).await?;
    output::write_out(&report.render());
    if report.overspent() {
        anyhow::bail!(
            "the service granted more than its limits allow (see the overspend lines above)"
        );
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down: finishing calls in flight");
}
