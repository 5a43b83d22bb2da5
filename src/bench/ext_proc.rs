//! `ctxbudget bench --api ext_proc`: each call as Envoy's ext_proc filter
//! makes it — one `Process` stream per request: request headers and a
//! buffered OpenAI chat body (a prompt of the item's size, as text the
//! service counts), then the answer's headers and one streamed piece carrying
//! two server-sent events, the last with the usage; a failed call's answer is
//! a 500. The stream stays open from the reservation to the settlement, as
//! Envoy's does around the upstream call.

use super::workload::{BENCH_MODEL, Item, Reply};
use crate::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use crate::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use crate::envoy::service::ext_proc::v3::processing_request::Request as Part;
use crate::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use crate::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use crate::gateway::ext_proc::reading::header_map;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

/// One request's processing stream, open from its reservation to its end.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
}

impl Stream {
    async fn send(&mut self, part: Part, first: bool) -> Result<Answer, String> {
        let msg = ProcessingRequest {
            request: Some(part),
            protocol_config: first.then_some(ProtocolConfiguration {
                request_body_mode: BodySendMode::Buffered as i32,
                response_body_mode: BodySendMode::Streamed as i32,
                send_body_without_waiting_for_header_response: false,
            }),
            ..ProcessingRequest::default()
        };
        self.tx
            .send(msg)
            .await
            .map_err(|_| "the processing stream closed".to_string())?;
        match self.rx.message().await {
            Ok(Some(ProcessingResponse {
                response: Some(a), ..
            })) => Ok(a),
            Ok(_) => Err("the processing stream ended early".into()),
            Err(s) => Err(format!("{:?}", s.code()).to_lowercase()),
        }
    }

    /// Half-closes and waits for the processor to end the stream (it has
    /// settled by then).
    async fn close(self) -> Result<(), String> {
        let Stream { tx, mut rx } = self;
        drop(tx);
        while let Some(_extra) = rx.message().await.map_err(|s| s.to_string())? {}
        Ok(())
    }
}

/// The service's external processor, driven as Envoy drives it.
pub struct ExtProcTarget {
    clients: Vec<ExternalProcessorClient<Channel>>,
    next: AtomicUsize,
    open: Mutex<HashMap<u64, Stream>>,
    ids: AtomicU64,
}

impl ExtProcTarget {
    /// Over `channels`, round robin.
    pub fn new(channels: Vec<Channel>) -> Self {
        ExtProcTarget {
            clients: channels
                .into_iter()
                .map(ExternalProcessorClient::new)
                .collect(),
            next: AtomicUsize::new(0),
            open: Mutex::new(HashMap::new()),
            ids: AtomicU64::new(0),
        }
    }

    /// The request path: headers and body; an allowed call's stream is kept
    /// under the id its reply carries.
    pub async fn reserve(&self, item: &Item, tier: &str) -> Result<Reply, String> {
        let mut client =
            self.clients[self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len()].clone();
        let (tx, mut out) = mpsc::channel(2);
        let requests = futures_util::stream::poll_fn(move |cx| out.poll_recv(cx));
        let rx = client
            .process(requests)
            .await
            .map_err(|s| format!("{:?}", s.code()).to_lowercase())?
            .into_inner();
        let mut stream = Stream { tx, rx };
        let head = headers(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
            ("x-tenant-id", &item.tenant_id()),
            ("x-user-id", &item.user_id()),
            ("x-tier", tier),
        ]);
        stream.send(Part::RequestHeaders(head), true).await?;
        let body = body(chat_body(item), true);
        match stream.send(Part::RequestBody(body), false).await? {
            Answer::ImmediateResponse(r) => {
                stream.close().await?;
                Ok(Reply {
                    allowed: false,
                    reason: denial_reason(&r.details),
                    reservation_id: String::new(),
                    reserved_output: 0,
                })
            }
            _ => {
                let id = self.ids.fetch_add(1, Ordering::Relaxed);
                self.lock().insert(id, stream);
                Ok(Reply {
                    allowed: true,
                    reason: "allowed",
                    reservation_id: id.to_string(),
                    reserved_output: item.max_output,
                })
            }
        }
    }

    /// The answer streams back with its usage; the stream ends.
    pub async fn commit(&self, item: &Item, id: &str) -> Result<(), String> {
        let mut stream = self.take(id)?;
        let head = headers(&[(":status", "200"), ("content-type", "text/event-stream")]);
        stream.send(Part::ResponseHeaders(head), false).await?;
        let events = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hello\"}}}}]}}\n\n\
             data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{}}}}}\n\n\
             data: [DONE]\n\n",
            item.prompt, item.completion
        );
        stream
            .send(Part::ResponseBody(body(events.into_bytes(), true)), false)
            .await?;
        stream.close().await
    }

    /// The upstream failed: a 500 answer.
    pub async fn refund(&self, id: &str) -> Result<(), String> {
        let mut stream = self.take(id)?;
        let head = headers(&[(":status", "500"), ("content-type", "application/json")]);
        stream.send(Part::ResponseHeaders(head), false).await?;
        stream.close().await
    }

    fn take(&self, id: &str) -> Result<Stream, String> {
        let id: u64 = id.parse().map_err(|_| format!("no stream {id}"))?;
        self.lock()
            .remove(&id)
            .ok_or_else(|| format!("no stream {id}"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stream>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A chat completion whose prompt is the item's as text.
fn chat_body(item: &Item) -> Vec<u8> {
    let text = item.prompt_text();
    serde_json::to_vec(&serde_json::json!({
        "model": BENCH_MODEL,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": item.max_output,
        "messages": [{"role": "user", "content": text}],
    }))
    .expect("JSON serializes")
}

/// The reason of a denial from the immediate response's details
/// (`ctxbudget_<reason>`).
fn denial_reason(details: &str) -> &'static str {
    let reason = details.strip_prefix("ctxbudget_").unwrap_or(details);
    crate::domain::Reason::ALL
        .into_iter()
        .map(crate::domain::Reason::as_str)
        .find(|r| *r == reason)
        .unwrap_or("refused")
}

fn headers(pairs: &[(&str, &str)]) -> HttpHeaders {
    HttpHeaders {
        headers: Some(header_map(pairs)),
        ..HttpHeaders::default()
    }
}

fn body(bytes: Vec<u8>, end_of_stream: bool) -> HttpBody {
    HttpBody {
        body: bytes,
        end_of_stream,
        ..HttpBody::default()
    }
}
