//! One LLM request through the external processor, as Envoy's ext_proc
//! filter sends it: request headers, then the whole body (BUFFERED), each
//! awaiting its answer.

use ctxbudget::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use ctxbudget::envoy::service::ext_proc::v3::processing_request::Request as Part;
use ctxbudget::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use ctxbudget::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest};
use ctxbudget::gateway::ext_proc::reading::header_map;
use std::net::SocketAddr;
use std::time::Duration;
use tonic::Request;
use tonic::transport::Channel;

/// A chat completion's body for gpt-4o.
pub(crate) const CHAT: &[u8] =
    br#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}"#;

/// Sends a POST to `/v1/chat/completions` with `headers` (beside the
/// method, path and content type) and `body` to the processor at `addr`,
/// with `authorization: Bearer <token>` when given; the answer to the body.
/// The stream is dropped after it (a reservation it made is refunded).
pub(crate) async fn one_request(
    addr: SocketAddr,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<ProcessingRequest>(2);
    let requests = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut request = Request::new(requests);
    if let Some(t) = token {
        let value = format!("Bearer {t}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    let mut answers = ExternalProcessorClient::new(channel)
        .process(request)
        .await
        .expect("the stream opens")
        .into_inner();
    let mut all = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
    ];
    all.extend_from_slice(headers);
    let parts = [
        Part::RequestHeaders(HttpHeaders {
            headers: Some(header_map(&all)),
            ..HttpHeaders::default()
        }),
        Part::RequestBody(HttpBody {
            body: body.to_vec(),
            end_of_stream: true,
            ..HttpBody::default()
        }),
    ];
    let mut last = None;
    for part in parts {
        let msg = ProcessingRequest {
            request: Some(part),
            ..ProcessingRequest::default()
        };
        tx.send(msg).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(30), answers.message())
            .await
            .expect("an answer within 30 s")
            .expect("the stream stays up")
            .expect("an answer");
        last = answer.response;
    }
    last.expect("a response part")
}
