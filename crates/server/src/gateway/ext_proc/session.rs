//! One processing stream — one HTTP request through Envoy — from its request
//! headers to its settlement. Each message Envoy sends gets its one answer;
//! whatever order they come in, and however the stream ends, a reservation
//! made here ends committed (the usage the provider reported, else the
//! prompt as counted and the completion text delivered) or refunded (the
//! upstream failed, or nothing reached the caller). A stream left open with
//! no message lapses with its lease: leases are renewed only as messages
//! arrive.
//!
//! Size: one state machine, message by message; split, the order of its
//! states would be spread over files.

use super::answer::{Changes, Part, Refusal, pass_headers, proceed};
use super::llm_request::{Api, LlmRequest, NotRead};
use super::reading::{Reading, RequestHead};
use super::usage::{AnswerReader, Usage};
use crate::api::http::reservation_headers;
use crate::app::{App, Caller, Slot, trace};
use crate::config::OtherRequests;
use crate::domain::plan::ReserveRequest;
use crate::domain::{Prompt, PromptInput, ReservationId};
use crate::engine::{CommitRequest, Completion};
use crate::envoy::config::core::v3::Metadata;
use crate::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use crate::envoy::service::ext_proc::v3::processing_request::Request as Message;
use crate::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use crate::store::Store;
use crate::telemetry;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Status;

/// Where a stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No request headers yet.
    Start,
    /// An LLM call whose body is being read.
    Reading,
    /// Not an LLM call, or answered at once: every message goes on unchanged.
    Passing,
    /// Reserved; the answer is being read.
    Reserved,
    /// Settled (or nothing to settle): messages go on unchanged.
    Done,
}

/// A reservation held by the stream.
#[derive(Debug)]
struct Held {
    id: ReservationId,
    /// The prompt as reserved (the service's count, corrected).
    prompt_tokens: u64,
    /// The output granted: what an answer that cannot be read is charged.
    granted_output: u64,
    /// When the lease was last granted or renewed, and for how long.
    leased_at: Instant,
    lease: Duration,
}

/// The request header naming the model a call with fallback models goes
/// to, for routes to match on.
pub(super) const CHOSEN_MODEL_HEADER: &str = "x-ctxbudget-model";

/// One processing stream's state.
pub(super) struct Session<S> {
    app: Arc<App<S>>,
    reading: Arc<Reading>,
    /// The authenticated gRPC caller, whose token may be bound to tenants.
    authenticated: Option<Caller>,
    max_body_bytes: usize,
    state: State,
    head: RequestHead,
    metadata: Option<Metadata>,
    /// How Envoy sends the request body (`protocol_config`; BUFFERED when
    /// an older Envoy does not say): STREAMED pieces are held back here and
    /// the body sent whole at its end.
    body_mode: BodySendMode,
    /// How Envoy sends the answer, when it says.
    answer_mode: Option<BodySendMode>,
    body: Vec<u8>,
    api: Option<Api>,
    held: Option<Held>,
    answer: Option<AnswerReader>,
    /// The answer is compressed (its upstream ignored the removed
    /// `accept-encoding`): its usage cannot be read.
    encoded: bool,
    /// With fallback models: the candidate reserved.
    chosen_model: Option<String>,
    /// The `x-ratelimit-*` headers of the reservation, for the answer.
    limit_headers: Vec<(&'static str, String)>,
}

impl<S: Store> Session<S> {
    pub(super) fn new(
        app: Arc<App<S>>,
        reading: Arc<Reading>,
        authenticated: Option<Caller>,
        max_body_bytes: usize,
    ) -> Self {
        Session {
            app,
            reading,
            authenticated,
            max_body_bytes,
            state: State::Start,
            head: RequestHead::default(),
            metadata: None,
            body_mode: BodySendMode::Buffered,
            answer_mode: None,
            body: Vec::new(),
            api: None,
            held: None,
            answer: None,
            encoded: false,
            chosen_model: None,
            limit_headers: Vec::new(),
        }
    }

    /// Whether Envoy streams the request body.
    fn streamed(&self) -> bool {
        self.body_mode == BodySendMode::Streamed
    }

    /// The answer to one message (every message gets exactly one); a
    /// message with no part is an error that ends the stream.
    pub(super) async fn on_message(
        &mut self,
        msg: ProcessingRequest,
    ) -> Result<ProcessingResponse, Status> {
        if let Some(p) = &msg.protocol_config {
            self.body_mode =
                BodySendMode::try_from(p.request_body_mode).unwrap_or(BodySendMode::None);
            self.answer_mode = BodySendMode::try_from(p.response_body_mode).ok();
        }
        if msg.metadata_context.is_some() {
            self.metadata = msg.metadata_context;
        }
        Ok(match msg.request {
            Some(Message::RequestHeaders(h)) => self.request_headers(h),
            Some(Message::RequestBody(b)) => self.request_body(b).await,
            Some(Message::ResponseHeaders(h)) => self.response_headers(h).await,
            Some(Message::ResponseBody(b)) => self.response_body(b).await,
            Some(Message::RequestTrailers(_)) => self.request_trailers(),
            Some(Message::ResponseTrailers(_)) => {
                self.end_of_answer().await;
                proceed(Part::ResponseTrailers, Changes::default())
            }
            None => {
                return Err(Status::invalid_argument(
                    "a ProcessingRequest with no request part: nothing to answer",
                ));
            }
        })
    }

    fn request_headers(&mut self, h: HttpHeaders) -> ProcessingResponse {
        if self.state != State::Start {
            return proceed(Part::RequestHeaders, Changes::default());
        }
        self.head = RequestHead::from_map(h.headers.as_ref());
        if !self.reading.is_llm_path(&self.head.path) {
            return match self.reading.other_requests() {
                OtherRequests::Pass => {
                    self.state = State::Passing;
                    telemetry::ext_proc_request("passed");
                    pass_headers()
                }
                OtherRequests::Deny => self.refuse(Refusal::not_served(&self.head.path)),
            };
        }
        self.api = Api::of_path(&self.head.path);
        if let Some(r) = self.unworkable_modes() {
            return self.refuse(r);
        }
        if h.end_of_stream {
            return self.other_body(Part::RequestHeaders, "the request has no body".into());
        }
        self.state = State::Reading;
        // The answer must come uncompressed for its usage to be read; a
        // streamed body is sent whole at its end, its length then unknown.
        // The model header is the processor's to set: a caller's copy could
        // pick a route other than the model reserved.
        let mut remove = vec!["accept-encoding", CHOSEN_MODEL_HEADER];
        if self.streamed() {
            remove.push("content-length");
        }
        proceed(
            Part::RequestHeaders,
            Changes {
                remove,
                ..Changes::default()
            },
        )
    }

    /// The filter's body modes, when they cannot budget a call: a request
    /// body not sent (NONE) or sent in a mode the processor does not take,
    /// or an answer not sent (NONE: every call would be refunded).
    fn unworkable_modes(&self) -> Option<Refusal> {
        let body_ok = matches!(
            self.body_mode,
            BodySendMode::Buffered | BodySendMode::Streamed | BodySendMode::BufferedPartial
        );
        let answer_ok = self.answer_mode != Some(BodySendMode::None);
        if body_ok && answer_ok {
            return None;
        }
        let r = Refusal::misconfigured(format!(
            "the budget's external processor cannot budget this call with \
             request_body_mode {} and response_body_mode {}: set the ext_proc filter's \
             processing_mode to request_body_mode BUFFERED (or STREAMED) and \
             response_body_mode STREAMED (docs/ext_proc.md)",
            self.body_mode.as_str_name(),
            self.answer_mode.map_or("unset", |m| m.as_str_name()),
        ));
        Some(r)
    }

    async fn request_body(&mut self, b: HttpBody) -> ProcessingResponse {
        if self.state == State::Start {
            // Envoy skipped the headers: no caller to charge, and passing the
            // request would spend unbudgeted. Loud, so the setting is fixed.
            let r = Refusal::misconfigured(
                "the budget's external processor needs the request headers: set the ext_proc \
                 filter's processing_mode.request_header_mode to SEND (docs/ext_proc.md)"
                    .into(),
            );
            return self.refuse(r);
        }
        if self.state != State::Reading {
            return proceed(Part::RequestBody, Changes::default());
        }
        if self.body.len() + b.body.len() > self.max_body_bytes {
            let message = format!(
                "the request body is over {} bytes, the most the budget service reads \
                 ([server] max_message_bytes); shorten it",
                self.max_body_bytes
            );
            let r = Refusal::too_large(message);
            return self.refuse(r);
        }
        self.body.extend_from_slice(&b.body);
        match (self.body_mode, b.end_of_stream) {
            // A piece of a streamed body: held back, sent whole at the end.
            (BodySendMode::Streamed, false) => {
                return proceed(
                    Part::RequestBody,
                    Changes {
                        clear_body: true,
                        ..Changes::default()
                    },
                );
            }
            // Only what fit in Envoy's buffer: the rest cannot be read.
            (BodySendMode::BufferedPartial, false) => {
                let r = Refusal::too_large(
                    "the request body is larger than Envoy's buffer (BUFFERED_PARTIAL sent only \
                     its start): shorten it, or raise the listener's \
                     per_connection_buffer_limit_bytes"
                        .into(),
                );
                return self.refuse(r);
            }
            // BUFFERED sends the whole body in one message, without
            // end_of_stream when trailers follow: it is whole all the same.
            _ => {}
        }
        let body = std::mem::take(&mut self.body);
        self.body_ended(body).await
    }

    /// The whole request body: read, reserved for, rewritten (or refused).
    async fn body_ended(&mut self, body: Vec<u8>) -> ProcessingResponse {
        let anthropic = self.head.get("anthropic-version").is_some();
        let mut call = match LlmRequest::parse(&self.head.path, anthropic, &body) {
            Ok(call) => call,
            Err(NotRead::Other(why)) => return self.other_body_with(Part::RequestBody, why, body),
            Err(NotRead::Invalid(why)) => {
                return self.refuse(Refusal::bad_request(why));
            }
        };
        self.api = Some(call.api);
        match self.reserve(&mut call).await {
            Ok(granted) => {
                let ask_usage = self.reading.section.stream_usage;
                let chosen = self.chosen_model.take();
                let rewritten = call.rewrite(granted, ask_usage, chosen.as_deref());
                self.state = State::Reserved;
                let mut changes = Changes::default();
                if let Some(model) = chosen {
                    // Routes may match the model reserved: Envoy picks again.
                    changes.clear_route_cache = true;
                    changes.set.push((CHOSEN_MODEL_HEADER, model));
                }
                match rewritten {
                    Some(new) => {
                        if !self.streamed() {
                            changes.set.push(("content-length", new.len().to_string()));
                        }
                        changes.body = Some(new);
                    }
                    // Pieces were held back: send the body whole.
                    None if self.streamed() => changes.body = Some(body),
                    None => {}
                }
                proceed(Part::RequestBody, changes)
            }
            Err(refusal) => self.refuse(*refusal),
        }
    }

    /// Request trailers while the body is still being read: only a
    /// streamed body gets here (a buffered one is whole in its one message),
    /// and its held-back pieces cannot go with trailers: refused. (With
    /// request_trailer_mode SKIP no message would come, and the backstop in
    /// `response_headers` refuses the answer.)
    fn request_trailers(&mut self) -> ProcessingResponse {
        if self.state == State::Reading {
            return self.refuse(Refusal::bad_request(
                "a streamed request body with trailers cannot be budgeted (its pieces were held \
                 back to be sent whole): send the body BUFFERED"
                    .into(),
            ));
        }
        proceed(Part::RequestTrailers, Changes::default())
    }

    /// The models the request names to fall back to after `call`'s.
    fn fallbacks(&self, call: &LlmRequest) -> Result<Vec<String>, Box<Refusal>> {
        let fallbacks = self
            .reading
            .fallbacks(&self.head, &call.model)
            .map_err(|e| Box::new(Refusal::bad_request(e.to_string())))?;
        if !fallbacks.is_empty() && self.streamed() {
            // Envoy may have sent the headers upstream already: the route
            // could not follow the model chosen.
            return Err(Box::new(Refusal::bad_request(
                "fallback models need the request body BUFFERED (a streamed body's route is \
                 picked before the model is chosen): drop the fallback header or buffer the body"
                    .into(),
            )));
        }
        Ok(fallbacks)
    }

    /// A slot of the admission gate for the reservation: a decision among
    /// the replica's others (the stream itself holds none).
    async fn slot(&self) -> Result<Slot, Box<Refusal>> {
        let permit = self.app.gate().admit(None).await;
        Ok(Slot::new(permit.map_err(|e| Box::new(Refusal::error(&e)))?))
    }

    /// Reserves for `call` (its messages move into the count); the output
    /// limit granted, or the answer to give.
    async fn reserve(&mut self, call: &mut LlmRequest) -> Result<u64, Box<Refusal>> {
        let caller = self
            .reading
            .caller(&self.head, self.metadata.as_ref())
            .map_err(|e| Box::new(Refusal::bad_request(e.to_string())))?;
        // Refused before the body's fallbacks are read, as the application
        // refuses it (the reservation checks it again).
        crate::app::check_tenant(self.authenticated.as_ref(), caller.tenant.as_str())
            .map_err(|e| Box::new(Refusal::error(&e)))?;
        let fallbacks = self.fallbacks(call)?;
        let req = ReserveRequest {
            tenant: caller.tenant,
            user: caller.user,
            session: caller.session,
            tier: caller.tier,
            model: call.model.clone(),
            fallbacks,
            statuses: Default::default(),
            prompt: PromptInput::Text(Prompt::Messages(std::mem::take(&mut call.messages))),
            max_output_tokens: call.output_to_reserve(),
            min_output_tokens: None,
            idempotency_key: None,
            lease_ttl_ms: None,
            priority: caller.priority,
            declared: Default::default(),
        };
        let named = !req.fallbacks.is_empty();
        let wait = self.reading.max_wait(&self.head);
        let wait = wait.map_err(|e| Box::new(Refusal::bad_request(e.to_string())))?;
        let (who, slot) = (self.authenticated.as_ref(), self.slot().await?);
        let reserve = self.app.reserve(who, req, wait, Some(&slot));
        let parent = self.head.trace_parent();
        let out = (trace::traced("ExtProc/CheckAndReserve", None, parent, reserve).await)
            .map(|mut out| {
                if named {
                    self.chosen_model = out.chosen_model.take();
                }
                out
            })
            .map_err(|e| Box::new(Refusal::error(&e)))?;
        let with_headers = self.reading.section.headers;
        if out.denial.is_some() {
            return Err(Box::new(Refusal::denied(&out, with_headers)));
        }
        let id = out.reservation_id.as_deref().unwrap_or_default();
        let id = ReservationId::parse(id).map_err(|e| Box::new(Refusal::error(&e.into())))?;
        if with_headers {
            self.limit_headers = reservation_headers(&out.limits, None);
        }
        telemetry::ext_proc_request("reserved");
        self.held = Some(Held {
            id,
            prompt_tokens: out.reserved_tokens - out.reserved_output_tokens,
            granted_output: out.granted_max_output_tokens,
            leased_at: Instant::now(),
            lease: Duration::from_millis(out.lease_expires_in_ms),
        });
        Ok(out.granted_max_output_tokens)
    }

    async fn response_headers(&mut self, h: HttpHeaders) -> ProcessingResponse {
        if self.state == State::Reading {
            // An LLM call whose body was never read whole: passing its answer
            // would spend unbudgeted.
            let r = Refusal::misconfigured(
                "the answer began before the budget's external processor read the whole \
                 request body (a streamed body that never ended, or a body mode that sends \
                 none): send the body BUFFERED (docs/ext_proc.md)"
                    .into(),
            );
            return self.refuse(r);
        }
        if self.state != State::Reserved || self.answer.is_some() {
            return proceed(Part::ResponseHeaders, Changes::default());
        }
        let head = RequestHead::from_map(h.headers.as_ref());
        let value = |name: &str| head.get(name).unwrap_or_default();
        let status: u16 = value(":status").parse().unwrap_or(0);
        if status >= 400 {
            // The provider bills no failed call: everything goes back.
            self.settle().await;
            return proceed(Part::ResponseHeaders, Changes::default());
        }
        self.answer = Some(AnswerReader::new(value("content-type")));
        self.encoded = !matches!(value("content-encoding").trim(), "" | "identity");
        self.renew_if_due().await;
        let set = std::mem::take(&mut self.limit_headers);
        let response = proceed(
            Part::ResponseHeaders,
            Changes {
                set,
                ..Changes::default()
            },
        );
        if h.end_of_stream {
            self.end_of_answer().await;
        }
        response
    }

    async fn response_body(&mut self, b: HttpBody) -> ProcessingResponse {
        if self.state == State::Reserved {
            let answer = self.answer.get_or_insert_with(|| AnswerReader::new(""));
            answer.feed(&b.body);
            if b.end_of_stream {
                self.end_of_answer().await;
            } else {
                self.renew_if_due().await;
            }
        }
        proceed(Part::ResponseBody, Changes::default())
    }

    /// The answer ended: read what is left, and settle.
    async fn end_of_answer(&mut self) {
        if let Some(a) = &mut self.answer {
            a.finish();
        }
        self.settle().await;
    }

    /// The stream ended (Envoy closed it, or it broke): settle what is held.
    pub(super) async fn close(&mut self) {
        self.end_of_answer().await;
    }

    /// Commits the usage reported, else what was delivered; refunds when
    /// nothing was.
    async fn settle(&mut self) {
        self.state = State::Done;
        let Some(held) = self.held.take() else { return };
        let answer = self.answer.as_mut();
        let delivered = answer.as_ref().is_some_and(|a| a.delivered_bytes() > 0);
        let reserved = Usage {
            prompt_tokens: held.prompt_tokens,
            ..Usage::default()
        };
        let commit = match answer {
            // Unreadable: charged as the grant, the most it can be.
            Some(_) if delivered && self.encoded => Some((
                "delivered",
                reserved,
                Completion::Tokens(held.granted_output),
            )),
            Some(a) => match a.usage() {
                Some(u) => Some(("usage", u, Completion::Tokens(u.completion_tokens))),
                None if delivered => {
                    let prompt = a.reported_prompt().unwrap_or(reserved);
                    Some(("delivered", prompt, Completion::Text(a.delivered_text())))
                }
                None => None,
            },
            None => None,
        };
        let result = match commit {
            Some((how, u, completion)) => {
                let req = CommitRequest {
                    id: held.id.clone(),
                    prompt_tokens: u.prompt_tokens,
                    completion,
                    cached_prompt_tokens: u.cached_prompt_tokens,
                    cache_write_prompt_tokens: u.cache_write_prompt_tokens,
                    cache_write_1h_prompt_tokens: u.cache_write_1h_prompt_tokens,
                    reasoning_tokens: u.reasoning_tokens,
                    declared: Default::default(),
                };
                let who = self.authenticated.as_ref();
                let commit = self.app.commit(who, req);
                let (id, parent) = (trace::shown(&held.id), self.head.trace_parent());
                let committed =
                    trace::traced("ExtProc/Commit", id.as_deref(), parent, commit).await;
                committed.map(|_| how)
            }
            None => {
                let refund = self.app.refund(self.authenticated.as_ref(), &held.id);
                let (id, parent) = (trace::shown(&held.id), self.head.trace_parent());
                let refunded = trace::traced("ExtProc/Refund", id.as_deref(), parent, refund).await;
                refunded.map(|_| "refunded")
            }
        };
        match result {
            Ok(how) => telemetry::ext_proc_settled(how),
            Err(e) => {
                telemetry::ext_proc_settled("failed");
                tracing::warn!(reservation = %held.id, error = %e,
                    "cannot settle the reservation of an ext_proc stream; its lease will lapse");
            }
        }
    }

    /// Renews the lease once half of it has passed (a long stream).
    async fn renew_if_due(&mut self) {
        let Some(held) = &mut self.held else { return };
        if held.leased_at.elapsed() < held.lease / 2 {
            return;
        }
        match self
            .app
            .renew(self.authenticated.as_ref(), &held.id, None)
            .await
        {
            Ok(r) if r.expires_in_ms > 0 => {
                held.leased_at = Instant::now();
                held.lease = Duration::from_millis(r.expires_in_ms);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(reservation = %held.id, error = %e, "lease renewal failed"),
        }
    }

    /// A body that is no LLM call: passed or refused, as configured.
    fn other_body(&mut self, part: Part, why: String) -> ProcessingResponse {
        self.other_body_with(part, why, Vec::new())
    }

    fn other_body_with(&mut self, part: Part, why: String, body: Vec<u8>) -> ProcessingResponse {
        match self.reading.other_requests() {
            OtherRequests::Pass => {
                self.state = State::Passing;
                telemetry::ext_proc_request("passed");
                let body = (self.streamed() && part == Part::RequestBody).then_some(body);
                proceed(
                    part,
                    Changes {
                        body,
                        ..Changes::default()
                    },
                )
            }
            OtherRequests::Deny => {
                let message = format!(
                    "{why}: {} takes an OpenAI chat completions, OpenAI Responses or \
                     Anthropic messages request",
                    self.head.path.chars().take(200).collect::<String>()
                );
                self.refuse(Refusal::bad_request(message))
            }
        }
    }

    /// Answers the caller at once; the stream has nothing more to do.
    fn refuse(&mut self, refusal: Refusal) -> ProcessingResponse {
        self.state = State::Done;
        telemetry::ext_proc_request(match refusal.denial {
            Some(_) => "denied",
            None => "refused",
        });
        refusal.into_response(self.api)
    }
}
