//! `envoy.service.ext_proc.v3.ExternalProcessor`: reserve before, commit
//! after, inside Envoy (docs/ext_proc.md). Envoy's ext_proc filter opens one
//! `Process` stream per HTTP request and sends its parts — request headers,
//! the body (buffered), response headers, the answer (streamed) — each
//! awaiting one answer. The processor reads the LLM request, reserves as
//! CheckAndReserve does, rewrites the output limit to the grant (or answers
//! 429/413 at once), reads the usage from the answer as it passes, and
//! commits at its end.
//!
//! - this file: the service; each stream's messages handled in order by one
//!   task, which settles what the stream holds however it ends.
//! - `session`: one stream's state, from request headers to settlement.
//! - [`reading`]: `[ext_proc]` in force; the caller from headers and metadata.
//! - [`llm_request`]: the three request bodies, read and rewritten.
//! - [`usage`]: the answer, whole or as server-sent events, read for usage.
//! - `answer`: the messages back to Envoy; errors as the API's JSON errors.

mod answer;
pub mod llm_request;
pub mod reading;
mod session;
pub mod usage;

use crate::api::caller_of;
use crate::app::App;
use crate::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use crate::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use crate::store::Store;
use futures_util::{FutureExt, Stream};
pub use reading::LiveReading;
use session::Session;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// The external processor face of an [`App`].
pub struct ExtProcApi<S> {
    app: Arc<App<S>>,
    reading: Arc<LiveReading>,
    max_body_bytes: usize,
}

impl<S> ExtProcApi<S> {
    /// Serves `app`, reading requests by `reading` (replaced when the
    /// configuration changes). A request body larger than `max_body_bytes`
    /// is refused (413). Callers are authenticated in front of it; a token
    /// bound to tenants may only reserve for those.
    pub fn new(app: Arc<App<S>>, reading: Arc<LiveReading>, max_body_bytes: usize) -> Self {
        ExtProcApi {
            app,
            reading,
            max_body_bytes,
        }
    }
}

/// The answers of one stream, as tonic sends them.
type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

/// Answers waiting to be sent per stream (a send waits for room: Envoy
/// pipelines the pieces of a streamed body).
const ANSWERS_QUEUED: usize = 4;

#[tonic::async_trait]
impl<S: Store> ExternalProcessor for ExtProcApi<S> {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let caller = caller_of(request.extensions()).cloned();
        let mut inbound = request.into_inner();
        let mut session = Session::new(
            self.app.clone(),
            self.reading.get(),
            caller,
            self.max_body_bytes,
        );
        let (tx, mut rx) = mpsc::channel(ANSWERS_QUEUED);
        // Its own task: the stream is settled even when tonic drops the
        // answers (Envoy went away).
        tokio::spawn(async move {
            // Until Envoy closes the stream, or it breaks. An error ends the
            // stream with that error (a message over the size limit, a
            // message with no part, a panic): a stream closed OK would let
            // Envoy pass the request on, whatever its failure_mode_allow.
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(msg)) => msg,
                    Ok(None) => break,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                };
                let observe_only = msg.observability_mode;
                let answer = AssertUnwindSafe(session.on_message(msg))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| {
                        Err(Status::internal(
                            "the budget's external processor failed on this message; report \
                             this to the operator",
                        ))
                    });
                let failed = answer.is_err();
                let sent = match observe_only && !failed {
                    true => true,
                    false => tx.send(answer).await.is_ok(),
                };
                if failed || !sent {
                    break;
                }
            }
            session.close().await;
        });
        let answers = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Ok(Response::new(Box::pin(answers)))
    }
}
