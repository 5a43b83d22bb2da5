//! Traces: the span every operation opens (`app::span` in the server) sent
//! over OTLP to a collector, when one is configured, as a child of the
//! caller's trace.
//!
//! - **Off unless configured** (`[telemetry] otlp_endpoint`, or the standard
//!   `OTEL_EXPORTER_OTLP_ENDPOINT`): without it no layer is installed and
//!   every function here returns at its first line.
//! - **The caller's trace**: each front door hands the W3C `traceparent` /
//!   `tracestate` it received to [`within`]; the operation's span, opened
//!   inside, takes it as its parent ([`adopt`]).
//! - **Never in a decision's way**: a finished span goes into a bounded queue
//!   and a background task exports it in batches (`export`). A full queue
//!   drops the span, an export that fails or times out drops its batch; both
//!   are counted (`ctxbudget_trace_spans_dropped_total{reason}`), and a
//!   decision never waits for either.
//! - **Links**: a Commit, Refund or RenewLease links to its reservation's
//!   span when this replica made it (`links`).

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing_opentelemetry::OpenTelemetrySpanExt;

mod export;
mod links;

use export::{Bounded, export_loop};
pub use links::{link_to, remember};

/// The layer the subscriber carries when traces are on.
pub type TraceLayer = tracing_opentelemetry::OpenTelemetryLayer<
    tracing_subscriber::Registry,
    opentelemetry_sdk::trace::SdkTracer,
>;

/// Whether traces are exported: set once, when [`start`] succeeds.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// How spans are exported (the `[telemetry]` section, and the standard
/// variables where it is silent).
#[derive(Clone, Debug)]
pub struct TraceSettings {
    /// The collector: `http://host:4317` for gRPC, `http://host:4318` for
    /// HTTP (`/v1/traces` is added). `None`: off.
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf`.
    pub protocol: TraceProtocol,
    /// `service.name` of every span.
    pub service_name: String,
    /// Finished spans held for export at most; more are dropped.
    pub max_queued_spans: usize,
    /// How long one export may take before its batch is dropped.
    pub export_timeout: Duration,
}

/// The OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceProtocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318 by convention).
    HttpProtobuf,
}

impl TraceProtocol {
    /// `grpc` or `http/protobuf`, as `OTEL_EXPORTER_OTLP_PROTOCOL` spells them.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "grpc" => Some(TraceProtocol::Grpc),
            "http/protobuf" => Some(TraceProtocol::HttpProtobuf),
            _ => None,
        }
    }
}

/// Why traces could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {reason}")]
pub struct TraceError {
    endpoint: String,
    reason: String,
}

/// Traces being exported: its layer goes on the subscriber;
/// [`Traces::shutdown`] sends what is queued.
pub struct Traces {
    provider: SdkTracerProvider,
    /// Asks the export task to send what it holds and stop.
    stop: tokio::sync::oneshot::Sender<()>,
    /// Resolves when it has.
    done: tokio::sync::oneshot::Receiver<()>,
}

impl Traces {
    /// The layer that turns the process's spans into exported ones.
    pub fn layer(&self) -> TraceLayer {
        let tracer = self.provider.tracer("ctxbudget");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_threads(false)
            .with_location(false)
            .with_tracked_inactivity(false)
    }

    /// Sends the spans still queued, waiting `timeout` at most.
    pub async fn shutdown(self, timeout: Duration) {
        let _ = self.stop.send(());
        if tokio::time::timeout(timeout, self.done).await.is_err() {
            tracing::debug!("traces not all sent at shutdown");
        }
        drop(self.provider);
    }
}

/// Starts exporting under `settings`: `None` when no endpoint is set. Must
/// run inside the Tokio runtime (the export task lives there).
pub fn start(settings: &TraceSettings) -> Result<Option<Traces>, TraceError> {
    let Some(endpoint) = &settings.endpoint else {
        return Ok(None);
    };
    let failed = |e: &dyn std::fmt::Display| TraceError {
        endpoint: endpoint.clone(),
        reason: e.to_string(),
    };
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let mut exporter = match settings.protocol {
        TraceProtocol::Grpc => builder
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(settings.export_timeout)
            .build(),
        TraceProtocol::HttpProtobuf => builder
            .with_http()
            .with_endpoint(http_traces_url(endpoint))
            .with_timeout(settings.export_timeout)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build(),
    }
    .map_err(|e| failed(&e))?;
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    exporter.set_resource(&resource);
    let (queue, spans) = mpsc::channel(settings.max_queued_spans.max(1));
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let (finished, done) = tokio::sync::oneshot::channel();
    let timeout = settings.export_timeout;
    tokio::spawn(async move {
        export_loop(exporter, spans, stopped, timeout).await;
        let _ = finished.send(());
    });
    // The sampler: OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, read by the
    // SDK's default configuration (parent-based, always on, unless set).
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Bounded { queue })
        .with_resource(resource)
        .build();
    ON.store(true, Ordering::Relaxed);
    Ok(Some(Traces {
        provider,
        stop,
        done,
    }))
}

/// An OTLP/HTTP endpoint as a traces URL: a base (`http://host:4318`) gets
/// `/v1/traces`, as `OTEL_EXPORTER_OTLP_ENDPOINT` does; a URL that names
/// its path is kept.
fn http_traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    match trimmed.ends_with("/v1/traces") {
        true => trimmed.to_string(),
        false => format!("{trimmed}/v1/traces"),
    }
}

/// A caller's trace context, read from what its request carried.
#[derive(Clone, Debug)]
pub struct Parent(Context);

/// Reads W3C `traceparent` and `tracestate` through `get` (a header, a gRPC
/// metadata entry): the context, when traces are on and a valid one came.
pub fn parent_from(get: impl Fn(&str) -> Option<String>) -> Option<Parent> {
    if !on() {
        return None;
    }
    let traceparent = get("traceparent")?;
    let tracestate = get("tracestate");
    let carrier = Pair {
        traceparent,
        tracestate,
    };
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(Parent(cx))
}

/// The two W3C headers, owned.
struct Pair {
    traceparent: String,
    tracestate: Option<String>,
}

impl Extractor for Pair {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(&self.traceparent),
            "tracestate" => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

tokio::task_local! {
    /// The caller's context while its request is worked on.
    static PARENT: Option<Parent>;
    /// Microseconds the current operation spent waiting on the store.
    static STORE_US: Cell<u64>;
}

/// Runs `work` with `parent` as the caller's trace context: the span of
/// the operation it opens is its child.
pub async fn within<F: Future>(parent: Option<Parent>, work: F) -> F::Output {
    match parent {
        None => work.await,
        parent => PARENT.scope(parent, work).await,
    }
}

/// Makes `span` a child of the caller's context, if it sent one.
pub fn adopt(span: &tracing::Span) {
    if !on() {
        return;
    }
    if let Ok(Some(Parent(cx))) = PARENT.try_with(Clone::clone) {
        let _ = span.set_parent(cx);
    }
}

/// The current operation's span, to set attributes on (one lookup for
/// several): `None` when traces are off.
pub fn current() -> Option<tracing::Span> {
    on().then(tracing::Span::current)
}

/// Sets attribute `key` of `span`.
pub fn set(span: &tracing::Span, key: &'static str, value: impl Into<Value>) {
    span.set_attribute(key, value);
}

/// Sets attribute `key` of the current operation's span.
pub fn attribute(key: &'static str, value: impl Into<Value>) {
    if let Some(span) = current() {
        set(&span, key, value);
    }
}

/// Marks the current operation's span as failed with `message`.
pub fn failed(message: &str) {
    if on() {
        tracing::Span::current()
            .set_status(opentelemetry::trace::Status::error(message.to_string()));
    }
}

/// The current operation's span, as a link another span can name (a
/// Commit names its reservation's): `None` when traces are off.
pub fn current_link() -> Option<SpanContext> {
    if !on() {
        return None;
    }
    let cx = tracing::Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Links the current operation's span to `to`.
pub fn link(to: SpanContext) {
    if on() {
        tracing::Span::current().add_link(to);
    }
}

/// Runs `work` counting the time it waits on the store; then sets the
/// span's `ctxbudget.store_ms`.
pub async fn timing_store<F: Future>(work: F) -> F::Output {
    if !on() {
        return work.await;
    }
    let (out, us) = STORE_US
        .scope(Cell::new(0), async {
            let out = work.await;
            (out, STORE_US.with(Cell::get))
        })
        .await;
    #[allow(clippy::cast_precision_loss, reason = "microseconds as milliseconds")]
    attribute("ctxbudget.store_ms", us as f64 / 1000.0);
    out
}

/// Adds `elapsed` to the current operation's store time (nothing outside
/// [`timing_store`]).
pub fn store_time(elapsed: Duration) {
    let _ = STORE_US.try_with(|us| {
        us.set(us.get() + u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    });
}
