//! Logging: the tracing subscriber, its filter and format, and the layer
//! that exports its spans when traces are on ([`super::traces`]).

use super::traces::TraceLayer;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

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
    init_logging_with(format, None);
}

/// [`init_logging`], with `traces`' layer exporting the spans it lets
/// through (`RUST_LOG` filters them too: operations' spans are at `info`).
pub fn init_logging_with(format: LogFormat, traces: Option<TraceLayer>) {
    let _ = log_subscriber(format, traces).try_init();
}

/// The subscriber [`init_logging_with`] installs, for a caller that needs
/// it for a while before (the configuration's own warnings, read before
/// the traces it configures can start).
pub fn log_subscriber(
    format: LogFormat,
    traces: Option<TraceLayer>,
) -> impl tracing::Subscriber + Send + Sync + 'static {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a file, a pipe or a log
    // collector would keep the escape codes as text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let lines = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_ansi(ansi).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer().json().boxed(),
    };
    tracing_subscriber::registry()
        .with(traces)
        .with(filter)
        .with(lines)
}
