//! The way out for finished spans: a bounded queue ([`Bounded`], the SDK's
//! span processor) and the task that exports what it holds in batches
//! ([`export_loop`]). Nothing here ever waits for the collector on a
//! caller's behalf: a full queue drops the span, a failed export its batch,
//! both counted.

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use std::time::Duration;
use tokio::sync::mpsc;

/// Spans sent in one export at most.
const BATCH: usize = 512;
/// How long a finished span waits for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);

/// The bounded queue between finished spans and the export task.
#[derive(Debug)]
pub(super) struct Bounded {
    pub(super) queue: mpsc::Sender<SpanData>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            crate::telemetry::trace_spans_dropped("queue_full", 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// The export task is stopped by [`Traces::shutdown`].
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Sends `spans` in batches of [`BATCH`], or whatever came within
/// [`LINGER`], until `stopped`; then what is left.
pub(super) async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    mut spans: mpsc::Receiver<SpanData>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    timeout: Duration,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let stopping = tokio::select! {
            n = spans.recv_many(&mut batch, BATCH) => n == 0,
            _ = &mut stopped => true,
        };
        if !stopping && batch.len() < BATCH {
            // Let the batch fill for a moment: one export per second at
            // most when spans trickle in.
            let _ = tokio::time::timeout(LINGER, async {
                while batch.len() < BATCH {
                    let room = BATCH - batch.len();
                    if spans.recv_many(&mut batch, room).await == 0 {
                        break;
                    }
                }
            })
            .await;
        }
        if stopping {
            while let Ok(span) = spans.try_recv() {
                batch.push(span);
            }
        }
        // A full-sized buffer for the next batch: it never grows by copies.
        let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
        export(&exporter, full, timeout).await;
        if stopping {
            let _ = exporter.shutdown();
            return;
        }
    }
}

/// Exports one batch; a failure or a timeout drops it, counted.
async fn export(
    exporter: &opentelemetry_otlp::SpanExporter,
    batch: Vec<SpanData>,
    timeout: Duration,
) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len();
    match tokio::time::timeout(timeout, exporter.export(batch)).await {
        Ok(Ok(())) => crate::telemetry::trace_spans_exported(n),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, spans = n, "trace export failed; dropping the batch");
            crate::telemetry::trace_spans_dropped("export_failed", n);
        }
        Err(_) => {
            tracing::debug!(spans = n, "trace export timed out; dropping the batch");
            crate::telemetry::trace_spans_dropped("export_failed", n);
        }
    }
}
