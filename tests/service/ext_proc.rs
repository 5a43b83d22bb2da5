//! Envoy's external processor end to end, on every store: a tonic client
//! plays Envoy's ext_proc filter exactly as its documentation describes the
//! protocol — one `Process` stream per HTTP request; request headers, the
//! body (buffered, or streamed in pieces), response headers, the answer
//! streamed in pieces, each awaiting its one answer; the stream half-closed
//! at the end, or dropped. It asserts the reservation, the rewritten output
//! limit, the 429/413 bodies and headers, and that the buckets end exactly as
//! the usage the answer reported.

use crate::support;

use ctxbudget::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use ctxbudget::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use ctxbudget::envoy::service::ext_proc::v3::processing_request::Request as Part;
use ctxbudget::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use ctxbudget::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, ImmediateResponse, ProcessingRequest,
    ProcessingResponse, ProtocolConfiguration, body_mutation,
};
use ctxbudget::gateway::ext_proc::reading::header_map;
use ctxbudget::pb::{self, Dimension, Level};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::{Backend, Harness};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

on_every_store!(
    a_buffered_request_and_json_answer_commit_the_reported_usage,
    streamed_answers_split_anywhere_commit_each_apis_usage,
    a_body_sent_in_pieces_is_held_back_and_sent_whole,
    an_upstream_failure_refunds_everything,
    a_stream_closed_mid_answer_commits_what_was_delivered,
    a_dropped_stream_settles_without_another_message,
    denials_answer_429_and_413_in_the_callers_api,
    concurrent_streams_never_exceed_the_concurrency_token_or_dollar_limit,
    a_spent_model_falls_back_to_the_next_named_in_the_header,
    a_session_header_holds_a_run_to_its_session_limits,
);

const CONFIG: &str = r#"
[ext_proc]
default_tier = "t"

[models.gpt-4o]
match = ["gpt-4o*"]

[tiers.t]
max_context_tokens = 20000
default_max_output_tokens = 1000
tenant = { tokens = [{ limit = 200000, window = "month" }, { limit = 2000, period = "1m" }], concurrency = 5 }

[prices.gpt-4o]
input = 2.50
output = 10.00

[tiers.crowd]
max_context_tokens = 20000
default_max_output_tokens = 1000
tenant = { tokens = [{ limit = 200000, window = "month" }, { limit = 2000, period = "1m" }], spend = [{ limit_usd = 0.02, window = "month" }], concurrency = 5 }

[models.primary]
match = ["primary-*"]

[tiers.t.models.primary]
tenant = { requests = [{ limit = 1, period = "1h" }] }

[tiers.agents]
max_context_tokens = 20000
default_max_output_tokens = 1000
user = { concurrency = 10 }
session = { concurrency = 1 }

[tiers.tight]
max_context_tokens = 20000
default_max_output_tokens = 1000
tenant = { tokens = [{ limit = 3000, window = "month" }], concurrency = 5 }
"#;

/// One HTTP request through Envoy: its processing stream.
struct Envoy {
    tx: Option<mpsc::Sender<ProcessingRequest>>,
    rx: Streaming<ProcessingResponse>,
    first: bool,
    mode: BodySendMode,
    answer_mode: BodySendMode,
}

impl Envoy {
    async fn open(h: &Harness, mode: BodySendMode) -> Envoy {
        let channel = Channel::from_shared(format!("http://{}", h.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let (tx, mut out) = mpsc::channel::<ProcessingRequest>(4);
        let requests = futures_util::stream::poll_fn(move |cx| out.poll_recv(cx));
        let rx = ExternalProcessorClient::new(channel)
            .process(requests)
            .await
            .expect("Process opens")
            .into_inner();
        Envoy {
            tx: Some(tx),
            rx,
            first: true,
            mode,
            answer_mode: BodySendMode::Streamed,
        }
    }

    /// Sends one message and waits for its answer.
    async fn send(&mut self, part: Part) -> Answer {
        let mut msg = ProcessingRequest {
            request: Some(part),
            ..ProcessingRequest::default()
        };
        if std::mem::take(&mut self.first) {
            // Only the first message carries the protocol configuration.
            msg.protocol_config = Some(ProtocolConfiguration {
                request_body_mode: self.mode as i32,
                response_body_mode: self.answer_mode as i32,
                send_body_without_waiting_for_header_response: false,
            });
        }
        self.tx.as_ref().unwrap().send(msg).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(30), self.rx.message())
            .await
            .expect("an answer within 30 s")
            .expect("the stream stays up")
            .expect("an answer");
        answer.response.expect("a response part")
    }

    /// Half-closes the stream and waits until the processor ends it (it has
    /// then settled what it held).
    async fn close(mut self) {
        self.tx = None;
        let end = tokio::time::timeout(Duration::from_secs(30), self.rx.message()).await;
        assert!(
            matches!(end, Ok(Ok(None))),
            "the processor ends the stream: {end:?}"
        );
    }
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(header_map(pairs)),
        end_of_stream,
        ..HttpHeaders::default()
    }
}

fn request_headers(path: &str, tenant: &str, tier: &str) -> Part {
    Part::RequestHeaders(headers(
        &[
            (":method", "POST"),
            (":path", path),
            ("content-type", "application/json"),
            ("accept-encoding", "gzip"),
            ("x-tenant-id", tenant),
            ("x-user-id", "alice"),
            ("x-tier", tier),
            ("anthropic-version", "2023-06-01"),
        ],
        false,
    ))
}

fn body(bytes: &[u8], end_of_stream: bool) -> HttpBody {
    HttpBody {
        body: bytes.to_vec(),
        end_of_stream,
        ..HttpBody::default()
    }
}

fn response_headers(status: u16, content_type: &str) -> Part {
    Part::ResponseHeaders(headers(
        &[
            (":status", &status.to_string()),
            ("content-type", content_type),
        ],
        false,
    ))
}

fn common(answer: &Answer) -> &CommonResponse {
    let r = match answer {
        Answer::RequestHeaders(h) | Answer::ResponseHeaders(h) => h.response.as_ref(),
        Answer::RequestBody(b) | Answer::ResponseBody(b) => b.response.as_ref(),
        other => panic!("expected a go-on answer, got {other:#?}"),
    };
    r.expect("a common response")
}

fn set_header<'a>(c: &'a CommonResponse, name: &str) -> Option<&'a str> {
    c.header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .find_map(|h| {
            let h = h.header.as_ref()?;
            (h.key == name).then(|| std::str::from_utf8(&h.raw_value).unwrap())
        })
}

fn new_body(c: &CommonResponse) -> Option<&[u8]> {
    match c.body_mutation.as_ref()?.mutation.as_ref()? {
        body_mutation::Mutation::Body(b) => Some(b),
        _ => None,
    }
}

fn immediate(answer: Answer) -> ImmediateResponse {
    match answer {
        Answer::ImmediateResponse(r) => r,
        other => panic!("expected an immediate response, got {other:#?}"),
    }
}

fn immediate_header<'a>(r: &'a ImmediateResponse, name: &str) -> Option<&'a str> {
    r.headers.as_ref()?.set_headers.iter().find_map(|h| {
        let h = h.header.as_ref()?;
        (h.key == name).then(|| std::str::from_utf8(&h.raw_value).unwrap())
    })
}

/// The tenant's limit of `dimension` (`period` 0: its calendar window), as
/// GetStatus reports it (each test tenant is of one tier).
async fn tenant_limit(
    h: &mut Harness,
    tenant: &str,
    dimension: Dimension,
    period: u64,
) -> pb::LimitStatus {
    let tier = match tenant {
        "crowd" => "crowd",
        "tiny" => "tight",
        _ => "t",
    };
    let s = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: tenant.into(),
            tier: tier.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    support::limit(&s.limits, Level::Tenant, dimension, period)
}

/// The tenant's tokens left this month (a calendar window: no refill, so
/// the count is exact).
async fn tokens_left(h: &mut Harness, tenant: &str) -> i64 {
    tenant_limit(h, tenant, Dimension::Tokens, 0)
        .await
        .remaining
}

/// The tenant's µ$ left this month.
async fn spend_left(h: &mut Harness, tenant: &str) -> i64 {
    tenant_limit(h, tenant, Dimension::Spend, 0).await.remaining
}

/// The tenant's reservations in flight.
async fn in_flight(h: &mut Harness, tenant: &str) -> i64 {
    let l = tenant_limit(h, tenant, Dimension::Concurrency, 0).await;
    l.limit as i64 - l.remaining
}

const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello to the world, politely."}],"max_tokens":400}"#;

/// Sends a chat request's headers and body; returns the body answer.
async fn request(envoy: &mut Envoy, path: &str, tenant: &str, tier: &str, json: &str) -> Answer {
    let a = envoy.send(request_headers(path, tenant, tier)).await;
    let c = common(&a);
    let removed = &c.header_mutation.as_ref().unwrap().remove_headers;
    assert!(
        removed.iter().any(|h| h == "accept-encoding"),
        "{removed:?}"
    );
    envoy
        .send(Part::RequestBody(body(json.as_bytes(), true)))
        .await
}

async fn a_buffered_request_and_json_answer_commit_the_reported_usage(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let before = tokens_left(&mut h, "acme").await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let a = request(&mut envoy, "/v1/chat/completions", "acme", "t", CHAT).await;
    // The body asks for 400 and gets them: sent on unchanged.
    assert!(new_body(common(&a)).is_none(), "{a:#?}");
    assert_eq!(in_flight(&mut h, "acme").await, 1);
    let reserved = before - tokens_left(&mut h, "acme").await;
    assert!(reserved > 400, "prompt + 400 output reserved: {reserved}");

    let a = envoy.send(response_headers(200, "application/json")).await;
    assert!(
        set_header(common(&a), "x-ratelimit-limit-tokens").is_some(),
        "{a:#?}"
    );
    let answer = json!({"id": "c1", "object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "Hello!"}}],
        "usage": {"prompt_tokens": 23, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}})
    .to_string();
    let (first, rest) = answer.as_bytes().split_at(40);
    envoy.send(Part::ResponseBody(body(first, false))).await;
    envoy.send(Part::ResponseBody(body(rest, true))).await;
    assert_eq!(
        before - tokens_left(&mut h, "acme").await,
        28,
        "exactly the usage"
    );
    assert_eq!(in_flight(&mut h, "acme").await, 0);
    envoy.close().await;
    assert_eq!(
        before - tokens_left(&mut h, "acme").await,
        28,
        "settled once"
    );

    // An output limit over the grant's room is rewritten, content-length with it.
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let big = CHAT.replace("\"max_tokens\":400", "\"max_tokens\":1000000");
    let a = envoy
        .send(request_headers("/v1/chat/completions", "acme", "t"))
        .await;
    common(&a);
    let a = envoy
        .send(Part::RequestBody(body(big.as_bytes(), true)))
        .await;
    assert!(
        matches!(a, Answer::ImmediateResponse(_)),
        "over the context: {a:#?}"
    );
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let none = CHAT.replace(",\"max_tokens\":400", "");
    let a = request(&mut envoy, "/v1/chat/completions", "acme", "t", &none).await;
    let c = common(&a);
    let sent: Value = serde_json::from_slice(new_body(c).expect("rewritten")).unwrap();
    assert_eq!(
        sent["max_completion_tokens"], 1000,
        "the tier's default, written"
    );
    let length: usize = set_header(c, "content-length").unwrap().parse().unwrap();
    assert_eq!(length, new_body(c).unwrap().len());
    envoy.close().await;
    // Closed before any answer: nothing delivered, everything refunded.
    assert_eq!(before - tokens_left(&mut h, "acme").await, 28);
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

/// Streamed answers of each API, their usage in the last event(s).
fn streams() -> Vec<(&'static str, String, String, u64)> {
    let chat = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":21,\"completion_tokens\":2}}\n\n",
        "data: [DONE]\n\n"
    );
    let responses = concat!(
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hello\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":19,\"output_tokens\":7}}}\n\n"
    );
    let anthropic = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":17,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
    );
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "stream": true, "max_tokens": 300,
            "messages": [{"role": "user", "content": "Hi"}]})
            .to_string(),
            chat.into(),
            23,
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-4o", "stream": true, "max_output_tokens": 300,
            "input": "Hi"})
            .to_string(),
            responses.into(),
            26,
        ),
        (
            "/v1/messages",
            json!({"model": "claude-x", "stream": true, "max_tokens": 300,
            "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]})
            .to_string(),
            anthropic.into(),
            29,
        ),
    ]
}

async fn streamed_answers_split_anywhere_commit_each_apis_usage(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    for (path, req, answer, used) in streams() {
        for step in [1usize, 7, 64] {
            let before = tokens_left(&mut h, "acme").await;
            let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
            let a = request(&mut envoy, path, "acme", "t", &req).await;
            if path == "/v1/chat/completions" {
                // The usage chunk is asked for.
                let sent: Value = serde_json::from_slice(new_body(common(&a)).unwrap()).unwrap();
                assert_eq!(sent["stream_options"]["include_usage"], true);
            }
            envoy
                .send(response_headers(200, "text/event-stream; charset=utf-8"))
                .await;
            let pieces: Vec<&[u8]> = answer.as_bytes().chunks(step).collect();
            for (i, piece) in pieces.iter().enumerate() {
                let last = i + 1 == pieces.len();
                let a = envoy.send(Part::ResponseBody(body(piece, last))).await;
                assert!(
                    new_body(common(&a)).is_none(),
                    "the answer passes unchanged"
                );
            }
            let charged = before - tokens_left(&mut h, "acme").await;
            assert_eq!(charged, used as i64, "{path} cut every {step} bytes");
            envoy.close().await;
        }
    }
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

async fn a_body_sent_in_pieces_is_held_back_and_sent_whole(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let mut envoy = Envoy::open(&h, BodySendMode::Streamed).await;
    let a = envoy
        .send(request_headers("/v1/messages", "acme", "t"))
        .await;
    let removed = &common(&a).header_mutation.as_ref().unwrap().remove_headers;
    assert!(removed.iter().any(|h| h == "content-length"), "{removed:?}");
    let req = json!({"model": "claude-x", "max_tokens": 1500, "messages": [{"role": "user", "content": "Hi there"}]})
        .to_string();
    let pieces: Vec<&[u8]> = req.as_bytes().chunks(10).collect();
    for piece in &pieces[..pieces.len() - 1] {
        let a = envoy.send(Part::RequestBody(body(piece, false))).await;
        let m = common(&a)
            .body_mutation
            .as_ref()
            .and_then(|m| m.mutation.clone());
        assert_eq!(
            m,
            Some(body_mutation::Mutation::ClearBody(true)),
            "held back"
        );
    }
    let a = envoy
        .send(Part::RequestBody(body(pieces[pieces.len() - 1], true)))
        .await;
    let sent: Value = serde_json::from_slice(new_body(common(&a)).expect("sent whole")).unwrap();
    assert_eq!(sent["messages"][0]["content"], "Hi there");
    assert_eq!(sent["max_tokens"], 1500);
    assert_eq!(in_flight(&mut h, "acme").await, 1);
    envoy.close().await;
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

async fn an_upstream_failure_refunds_everything(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let before = tokens_left(&mut h, "acme").await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    request(&mut envoy, "/v1/chat/completions", "acme", "t", CHAT).await;
    assert!(tokens_left(&mut h, "acme").await < before);
    envoy.send(response_headers(500, "application/json")).await;
    assert_eq!(tokens_left(&mut h, "acme").await, before, "all back");
    assert_eq!(in_flight(&mut h, "acme").await, 0);
    // The error body passes on; nothing more is charged.
    envoy
        .send(Part::ResponseBody(body(
            br#"{"error":{"message":"boom"}}"#,
            true,
        )))
        .await;
    envoy.close().await;
    assert_eq!(tokens_left(&mut h, "acme").await, before);
}

async fn a_stream_closed_mid_answer_commits_what_was_delivered(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let before = tokens_left(&mut h, "acme").await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let req = json!({"model": "gpt-4o", "stream": true, "max_tokens": 300,
        "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "Hi"}]});
    let a = request(
        &mut envoy,
        "/v1/chat/completions",
        "acme",
        "t",
        &req.to_string(),
    )
    .await;
    assert!(new_body(common(&a)).is_none(), "nothing to change");
    let reserved = before - tokens_left(&mut h, "acme").await;
    let prompt = reserved - 300;
    envoy.send(response_headers(200, "text/event-stream")).await;
    // "Hello, world!" is 4 tokens in o200k_base; the stream stops mid-event.
    let events = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello, \"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"world!\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"con"
    );
    envoy
        .send(Part::ResponseBody(body(events.as_bytes(), false)))
        .await;
    envoy.close().await;
    assert_eq!(
        before - tokens_left(&mut h, "acme").await,
        prompt + 4,
        "the prompt as reserved and the text delivered"
    );
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

async fn a_dropped_stream_settles_without_another_message(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let before = tokens_left(&mut h, "acme").await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    request(&mut envoy, "/v1/chat/completions", "acme", "t", CHAT).await;
    envoy.send(response_headers(200, "application/json")).await;
    assert_eq!(in_flight(&mut h, "acme").await, 1);
    // Envoy goes away: the gRPC call is dropped, no further message.
    drop(envoy);
    let deadline = Instant::now() + Duration::from_secs(30);
    while in_flight(&mut h, "acme").await != 0 {
        assert!(
            Instant::now() < deadline,
            "the reservation was never settled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        tokens_left(&mut h, "acme").await,
        before,
        "nothing was delivered: refunded"
    );
}

async fn denials_answer_429_and_413_in_the_callers_api(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    // 3000 tokens a month: a first call of 2000 output fits, the next does not.
    let ask = |max: u64| {
        json!({"model": "gpt-4o", "max_tokens": max, "messages": [{"role": "user", "content": "Hi"}]})
            .to_string()
    };
    let mut first = Envoy::open(&h, BodySendMode::Buffered).await;
    let a = request(
        &mut first,
        "/v1/chat/completions",
        "tiny",
        "tight",
        &ask(2000),
    )
    .await;
    common(&a);
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let r = immediate(
        request(
            &mut envoy,
            "/v1/chat/completions",
            "tiny",
            "tight",
            &ask(2000),
        )
        .await,
    );
    assert_eq!(r.status.unwrap().code, 429);
    let retry: u64 = immediate_header(&r, "retry-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 0);
    assert_eq!(
        immediate_header(&r, "x-ratelimit-limit-tokens"),
        Some("3000")
    );
    assert_eq!(
        immediate_header(&r, "content-type"),
        Some("application/json")
    );
    let err: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(err["error"]["type"], "rate_limit_exceeded", "{err}");
    assert_eq!(err["error"]["code"], "tpm_exceeded", "{err}");
    assert_eq!(err["error"]["ctxbudget"]["level"], "tenant", "{err}");
    assert!(err["error"]["message"].as_str().unwrap().len() > 10);
    // Anthropic callers get Anthropic's error shape; too large is 413, no retry.
    let huge = json!({"model": "claude-x", "max_tokens": 50000, "messages": [{"role": "user", "content": "Hi"}]})
        .to_string();
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let r = immediate(request(&mut envoy, "/v1/messages", "acme", "t", &huge).await);
    assert_eq!(r.status.unwrap().code, 413);
    assert!(immediate_header(&r, "retry-after").is_none());
    let err: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(err["type"], "error", "{err}");
    assert_eq!(err["error"]["type"], "request_too_large", "{err}");
    // No tenant: 400, naming the header; nothing reserved.
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    envoy
        .send(Part::RequestHeaders(headers(
            &[(":path", "/v1/chat/completions")],
            false,
        )))
        .await;
    let r = immediate(
        envoy
            .send(Part::RequestBody(body(CHAT.as_bytes(), true)))
            .await,
    );
    assert_eq!(r.status.unwrap().code, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("x-tenant-id"));
    // Another path passes untouched.
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let a = envoy
        .send(Part::RequestHeaders(headers(
            &[(":path", "/healthz"), ("x-tenant-id", "acme")],
            true,
        )))
        .await;
    assert!(common(&a).header_mutation.is_none());
    first.close().await;
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

/// 200 streamed requests at once against a concurrency of 5, 2000 tokens a
/// minute and $0.02 a month: never more than 5 reserved at a time, never
/// more tokens or dollars than the limits, and every reservation settled to
/// the usage its stream reported (tokens and µ$ exact).
async fn concurrent_streams_never_exceed_the_concurrency_token_or_dollar_limit(backend: Backend) {
    let h = Harness::start(backend, CONFIG).await;
    let started = Instant::now();
    let active = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let most = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut tasks = Vec::new();
    let h = std::sync::Arc::new(h);
    for i in 0..200u64 {
        let (h, active, most) = (h.clone(), active.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            use std::sync::atomic::Ordering::SeqCst;
            let req = json!({"model": "gpt-4o", "stream": true, "max_tokens": 200,
                "messages": [{"role": "user", "content": format!("Question {i}")}]})
            .to_string();
            // A caller that retries while the slots are full, and gives up
            // on any other denial (tokens or dollars spent).
            let mut envoy;
            let mut tries = 0;
            loop {
                envoy = Envoy::open(&h, BodySendMode::Buffered).await;
                envoy.send(request_headers("/v1/chat/completions", "crowd", "crowd")).await;
                let a = envoy.send(Part::RequestBody(body(req.as_bytes(), true))).await;
                let Answer::ImmediateResponse(r) = a else { break };
                assert_eq!(r.status.unwrap().code, 429, "{r:?}");
                envoy.close().await;
                tries += 1;
                if r.details != "ctxbudget_concurrency_exceeded" || tries == 30 {
                    return Err(r.details);
                }
                tokio::time::sleep(Duration::from_millis(5 + i % 10)).await;
            }
            let now = active.fetch_add(1, SeqCst) + 1;
            most.fetch_max(now, SeqCst);
            envoy.send(response_headers(200, "text/event-stream")).await;
            let used = 10 + i % 7;
            let events = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"ok\"}}}}]}}\n\n\
                 data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":{}}}}}\n\n",
                used - 9
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
            // Out of the slot before the last piece reaches the processor.
            active.fetch_sub(1, SeqCst);
            envoy.send(Part::ResponseBody(body(events.as_bytes(), true))).await;
            envoy.close().await;
            // µ$: 9 prompt tokens at 2.50 and the rest at 10.00 per million.
            Ok((used, (9 * 2_500_000 + (used - 9) * 10_000_000).div_ceil(1_000_000)))
        }));
    }
    let (mut committed, mut cost, mut allowed) = (0, 0, 0);
    let mut denials = std::collections::BTreeMap::<String, u32>::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok((used, micros)) => {
                committed += used as i64;
                cost += micros as i64;
                allowed += 1;
            }
            Err(why) => *denials.entry(why).or_default() += 1,
        }
    }
    assert!(
        denials.contains_key("ctxbudget_tpm_exceeded"),
        "the token limit was reached: {allowed} allowed, {denials:?}"
    );
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most <= 5, "{most} reserved at once over a concurrency of 5");
    assert!(allowed >= 20, "only {allowed} of 200 allowed");
    // What the 2000-a-minute limit allowed: its size and its refill since.
    let refill = 2000.0 * started.elapsed().as_secs_f64() / 60.0;
    assert!(
        committed as f64 <= 2000.0 + refill,
        "{committed} tokens spent over a limit of 2000 a minute"
    );
    let mut h = std::sync::Arc::into_inner(h).expect("every task ended");
    assert_eq!(in_flight(&mut h, "crowd").await, 0);
    assert_eq!(
        200_000 - tokens_left(&mut h, "crowd").await,
        committed,
        "every reservation settled to its usage ({allowed} allowed)"
    );
    let spent = 20_000 - spend_left(&mut h, "crowd").await;
    assert!(spent <= 20_000, "{spent} µ$ spent over a limit of 20000");
    assert_eq!(spent, cost, "every reservation settled to its cost");
}

/// `ctxbudget ext-proc get|set|reset` (the real binary) changes how every
/// replica reads requests within a second; a bad document changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_changes_the_reading_live() {
    use crate::operations::{ctl, ctl_ok, document, temp_dir};
    let mut h = Harness::start(Backend::Redis, CONFIG).await;
    let redis = h.redis.take().expect("a Redis");
    let got = ctl_ok(&redis, &["ext-proc", "get"]);
    assert!(
        got.contains("tenant_header = \"x-tenant-id\"") && got.contains("default_tier = \"t\""),
        "{got}"
    );
    let dir = temp_dir("ext-proc");
    let doc = "tenant_header = \"x-org\"\ndefault_tier = \"t\"\n";
    let out = ctl_ok(
        &redis,
        &["ext-proc", "set", &document(&dir, "xp.toml", doc)],
    );
    assert!(out.contains("external processor"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
        let head = headers(
            &[(":path", "/v1/chat/completions"), ("x-org", "neworg")],
            false,
        );
        envoy.send(Part::RequestHeaders(head)).await;
        let a = envoy
            .send(Part::RequestBody(body(CHAT.as_bytes(), true)))
            .await;
        envoy.close().await;
        if !matches!(a, Answer::ImmediateResponse(_)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new header never applied: {a:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A default tier that does not exist is refused, nothing written.
    let bad = document(&dir, "bad.toml", "default_tier = \"gold\"\n");
    let err = ctl(&redis, &["ext-proc", "set", &bad])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ext_proc.default_tier") && err.contains("gold"),
        "{err}"
    );
    assert!(ctl_ok(&redis, &["ext-proc", "get"]).contains("x-org"));
    ctl_ok(&redis, &["ext-proc", "reset"]);
    assert!(ctl_ok(&redis, &["ext-proc", "get"]).contains("none is stored"));
    h.redis = Some(redis);
    let _ = std::fs::remove_dir_all(dir);
}

/// An ext_authz filter's verified identity, forwarded as metadata, wins
/// over the headers a caller can set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_identity_wins_over_headers() {
    use ctxbudget::envoy::config::core::v3::Metadata;
    use prost_types::{Struct, Value as Field, value::Kind};
    let mut h = Harness::start(Backend::Memory, CONFIG).await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let mut ns = Struct::default();
    ns.fields.insert(
        "tenant".into(),
        Field {
            kind: Some(Kind::StringValue("verified".into())),
        },
    );
    let msg = ProcessingRequest {
        request: Some(request_headers("/v1/chat/completions", "spoofed", "t")),
        metadata_context: Some(Metadata {
            filter_metadata: [("envoy.filters.http.ext_authz".to_owned(), ns)].into(),
            ..Metadata::default()
        }),
        ..ProcessingRequest::default()
    };
    envoy.tx.as_ref().unwrap().send(msg).await.unwrap();
    envoy.rx.message().await.unwrap().unwrap();
    envoy.first = false;
    envoy
        .send(Part::RequestBody(body(CHAT.as_bytes(), true)))
        .await;
    assert_eq!(in_flight(&mut h, "verified").await, 1);
    assert_eq!(in_flight(&mut h, "spoofed").await, 0);
    envoy.close().await;
    assert_eq!(in_flight(&mut h, "verified").await, 0);
}

/// A stream longer than the lease keeps its slot: each message past half
/// the lease renews it, and the end commits as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stream_renews_its_lease() {
    let config = format!(
        "{CONFIG}\n[reservations]\ndefault_lease_ttl_ms = 1500\nmax_lease_ttl_ms = 60000\n\
         retention_ms = 60000\nidempotency_ttl_ms = 60000\nretry_jitter_ms = 0\n\
         concurrency_retry_ms = 1000\n"
    );
    let mut h = Harness::start(Backend::Memory, &config).await;
    let before = tokens_left(&mut h, "acme").await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    request(&mut envoy, "/v1/chat/completions", "acme", "t", CHAT).await;
    envoy.send(response_headers(200, "text/event-stream")).await;
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"la \"}}]}\n\n";
    // Four leases long, a piece every 300 ms.
    let end = Instant::now() + Duration::from_millis(6000);
    while Instant::now() < end {
        envoy
            .send(Part::ResponseBody(body(chunk.as_bytes(), false)))
            .await;
        assert_eq!(in_flight(&mut h, "acme").await, 1, "the slot is still held");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let usage =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":60}}\n\n";
    envoy
        .send(Part::ResponseBody(body(usage.as_bytes(), true)))
        .await;
    envoy.close().await;
    assert_eq!(before - tokens_left(&mut h, "acme").await, 80);
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

/// An Envoy that skips the request headers, or sends a streamed body with
/// trailers, is told which setting to change; nothing is reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_filter_is_told_what_to_set() {
    let mut h = Harness::start(Backend::Memory, CONFIG).await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    let r = immediate(
        envoy
            .send(Part::RequestBody(body(CHAT.as_bytes(), true)))
            .await,
    );
    assert_eq!(r.status.unwrap().code, 500);
    assert!(String::from_utf8_lossy(&r.body).contains("request_header_mode"));
    let mut envoy = Envoy::open(&h, BodySendMode::Streamed).await;
    envoy
        .send(request_headers("/v1/chat/completions", "acme", "t"))
        .await;
    envoy
        .send(Part::RequestBody(body(CHAT.as_bytes(), false)))
        .await;
    let trailers =
        Part::RequestTrailers(ctxbudget::envoy::service::ext_proc::v3::HttpTrailers::default());
    let r = immediate(envoy.send(trailers).await);
    assert_eq!(r.status.unwrap().code, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("BUFFERED"));
    // Fallback models with a streamed body: the route could not follow.
    let mut envoy = Envoy::open(&h, BodySendMode::Streamed).await;
    let head = headers(
        &[
            (":path", "/v1/chat/completions"),
            ("x-tenant-id", "acme"),
            ("x-fallback-models", "m2"),
        ],
        false,
    );
    envoy.send(Part::RequestHeaders(head)).await;
    let r = immediate(
        envoy
            .send(Part::RequestBody(body(CHAT.as_bytes(), true)))
            .await,
    );
    assert_eq!(r.status.unwrap().code, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("BUFFERED"));
    // Body modes that cannot budget a call are refused at the headers.
    for (request, answer, names) in [
        (
            BodySendMode::None,
            BodySendMode::Streamed,
            "request_body_mode NONE",
        ),
        (
            BodySendMode::FullDuplexStreamed,
            BodySendMode::Streamed,
            "FULL_DUPLEX_STREAMED",
        ),
        (
            BodySendMode::Buffered,
            BodySendMode::None,
            "response_body_mode NONE",
        ),
    ] {
        let mut envoy = Envoy::open(&h, request).await;
        envoy.answer_mode = answer;
        let r = immediate(
            envoy
                .send(request_headers("/v1/chat/completions", "acme", "t"))
                .await,
        );
        assert_eq!(r.status.unwrap().code, 500);
        assert!(String::from_utf8_lossy(&r.body).contains(names), "{r:?}");
    }
    // An older Envoy that does not say its modes and sends no body: the
    // answer is refused rather than passed unbudgeted.
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    envoy.first = false;
    common(
        &envoy
            .send(request_headers("/v1/chat/completions", "acme", "t"))
            .await,
    );
    let r = immediate(envoy.send(response_headers(200, "application/json")).await);
    assert_eq!(r.status.unwrap().code, 500);
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

/// A buffered body followed by trailers comes without end_of_stream (and,
/// with request_trailer_mode SKIP, nothing after it): it is whole, reserved
/// and rewritten all the same. Chat's `n` reserves the output per choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_body_with_trailers_and_n_choices_is_budgeted() {
    let mut h = Harness::start(Backend::Memory, CONFIG).await;
    let before = tokens_left(&mut h, "acme").await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    envoy
        .send(request_headers("/v1/chat/completions", "acme", "t"))
        .await;
    let two = CHAT.replace("\"max_tokens\":400", "\"max_tokens\":400,\"n\":2");
    let a = envoy
        .send(Part::RequestBody(body(two.as_bytes(), false)))
        .await;
    assert!(
        new_body(common(&a)).is_none(),
        "400 per choice granted: unchanged"
    );
    let reserved = before - tokens_left(&mut h, "acme").await;
    assert!(reserved > 800, "two choices of 400 reserved: {reserved}");
    envoy.send(response_headers(200, "application/json")).await;
    // The answer's end comes as trailers (SKIP: no message): the stream
    // closes, and the whole JSON answer is still read for its usage.
    let answer = br#"{"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":30}}"#;
    envoy.send(Part::ResponseBody(body(answer, false))).await;
    envoy.close().await;
    assert_eq!(before - tokens_left(&mut h, "acme").await, 50);
}

/// A message over `[server] max_message_bytes` ends the stream with an
/// error, which Envoy's failure_mode_allow decides on — not a clean close,
/// which would let the request through unbudgeted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_ends_the_stream_with_an_error() {
    let config = format!("[server]\nlisten = \"127.0.0.1:0\"\nmax_message_bytes = 65536\n{CONFIG}");
    let mut h = Harness::start(Backend::Memory, &config).await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    envoy
        .send(request_headers("/v1/chat/completions", "acme", "t"))
        .await;
    let msg = ProcessingRequest {
        request: Some(Part::RequestBody(body(&vec![b' '; 100_000], true))),
        ..ProcessingRequest::default()
    };
    envoy.tx.as_ref().unwrap().send(msg).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(30), envoy.rx.message())
        .await
        .unwrap();
    assert!(end.is_err(), "the stream ends with an error: {end:?}");
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

/// Redis gone: the service's failure policy decides. `fail_closed` answers
/// 503 with `retry-after` in the caller's API; `local` (the default) decides
/// from the replica's memory and settles there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_the_failure_policy_decides() {
    for policy in ["fail_closed", "local"] {
        let config = format!("{CONFIG}\n[resilience]\npolicy = \"{policy}\"\n");
        let mut h = Harness::start(Backend::Redis, &config).await;
        drop(h.redis.take());
        let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
        let a = request(&mut envoy, "/v1/chat/completions", "acme", "t", CHAT).await;
        if policy == "fail_closed" {
            let r = immediate(a);
            assert_eq!(r.status.unwrap().code, 503);
            assert_eq!(immediate_header(&r, "retry-after"), Some("1"));
            let err: Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(err["error"]["code"], "budget_store_unavailable", "{err}");
            envoy.close().await;
            continue;
        }
        common(&a);
        envoy.send(response_headers(200, "application/json")).await;
        let answer = br#"{"usage":{"prompt_tokens":20,"completion_tokens":3}}"#;
        envoy.send(Part::ResponseBody(body(answer, true))).await;
        envoy.close().await;
    }
}

/// An upstream that compresses its answer anyway (the processor removed
/// `accept-encoding`): the usage cannot be read, so the call is charged its
/// grant — the prompt as reserved and the whole output granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_answer_is_charged_its_grant() {
    let mut h = Harness::start(Backend::Memory, CONFIG).await;
    let before = tokens_left(&mut h, "acme").await;
    let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
    request(&mut envoy, "/v1/chat/completions", "acme", "t", CHAT).await;
    let reserved = before - tokens_left(&mut h, "acme").await;
    let head = headers(
        &[
            (":status", "200"),
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ],
        false,
    );
    envoy.send(Part::ResponseHeaders(head)).await;
    envoy
        .send(Part::ResponseBody(body(&[0x1f, 0x8b, 8, 0, 1, 2, 3], true)))
        .await;
    envoy.close().await;
    assert_eq!(
        before - tokens_left(&mut h, "acme").await,
        reserved,
        "prompt + 400 granted"
    );
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}

/// `x-session-id`: one call in flight per run of the `agents` tier; the
/// user's other runs go on.
async fn a_session_header_holds_a_run_to_its_session_limits(backend: Backend) {
    let h = Harness::start(backend, CONFIG).await;
    let ask = json!({"model": "gpt-4o", "max_tokens": 10,
        "messages": [{"role": "user", "content": "Hi"}]})
    .to_string();
    let open = |session: &'static str| {
        let h = &h;
        let ask = ask.clone();
        async move {
            let mut envoy = Envoy::open(h, BodySendMode::Buffered).await;
            let head = headers(
                &[
                    (":path", "/v1/chat/completions"),
                    ("x-tenant-id", "acme"),
                    ("x-user-id", "alice"),
                    ("x-tier", "agents"),
                    ("x-session-id", session),
                ],
                false,
            );
            envoy.send(Part::RequestHeaders(head)).await;
            let a = envoy
                .send(Part::RequestBody(body(ask.as_bytes(), true)))
                .await;
            (envoy, a)
        }
    };
    let (first, a) = open("run-1").await;
    common(&a);
    let (_, a) = open("run-1").await;
    let r = immediate(a);
    assert_eq!(r.status.unwrap().code, 429);
    let err: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(err["error"]["ctxbudget"]["level"], "session", "{err}");
    let (other, a) = open("run-2").await;
    common(&a);
    // The first run's call ends: its slot is free again.
    for envoy in [first, other] {
        let mut envoy = envoy;
        envoy.send(response_headers(200, "application/json")).await;
        let answer = br#"{"usage":{"prompt_tokens":8,"completion_tokens":2}}"#;
        envoy.send(Part::ResponseBody(body(answer, true))).await;
        envoy.close().await;
    }
    let (again, a) = open("run-1").await;
    common(&a);
    drop(again);
}

/// `x-fallback-models`: the body's model first, then those named; the one
/// reserved goes in the body and in `x-ctxbudget-model` (routes pick again).
async fn a_spent_model_falls_back_to_the_next_named_in_the_header(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let ask = json!({"model": "primary-1", "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}]})
    .to_string();
    let mut chosen = Vec::new();
    for _ in 0..2 {
        let mut envoy = Envoy::open(&h, BodySendMode::Buffered).await;
        let head = headers(
            &[
                (":path", "/v1/chat/completions"),
                ("x-tenant-id", "acme"),
                ("x-fallback-models", "gpt-4o-mini, primary-1"),
                ("x-ctxbudget-model", "forged-by-the-caller"),
            ],
            false,
        );
        let a = envoy.send(Part::RequestHeaders(head)).await;
        let removed = &common(&a).header_mutation.as_ref().unwrap().remove_headers;
        assert!(
            removed.iter().any(|h| h == "x-ctxbudget-model"),
            "a caller's copy goes"
        );
        let a = envoy
            .send(Part::RequestBody(body(ask.as_bytes(), true)))
            .await;
        let c = common(&a);
        let model = set_header(c, "x-ctxbudget-model")
            .expect("the model chosen")
            .to_owned();
        let sent: Value = serde_json::from_slice(new_body(c).unwrap_or(ask.as_bytes())).unwrap();
        assert_eq!(
            sent["model"],
            model.as_str(),
            "the body goes to the model chosen"
        );
        assert!(c.clear_route_cache, "the route is picked again");
        chosen.push(model);
        // Answered and committed: the request is spent.
        envoy.send(response_headers(200, "application/json")).await;
        let answer = br#"{"usage":{"prompt_tokens":8,"completion_tokens":2}}"#;
        envoy.send(Part::ResponseBody(body(answer, true))).await;
        envoy.close().await;
    }
    // primary takes one request an hour: the second call falls back.
    assert_eq!(chosen, ["primary-1", "gpt-4o-mini"]);
    assert_eq!(in_flight(&mut h, "acme").await, 0);
}
