//! The processor's messages to Envoy: go on (with header and body
//! mutations), or answer the caller at once — a denial or an error as the
//! JSON error body of the API the caller speaks, with the status and headers
//! of docs/http.md.

use super::llm_request::Api;
use crate::api::http::{denial_status, error_status, reservation_headers, retry_after};
use crate::app::{AppError, ErrorKind};
use crate::domain::Denial;
use crate::engine::ReserveOutcome;
use crate::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use crate::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use crate::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
use crate::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
    BodySendMode, HeaderSendMode,
};
use crate::envoy::service::ext_proc::v3::processing_response::Response;
use crate::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, TrailersResponse, body_mutation,
};
use crate::envoy::r#type::v3::HttpStatus;
use serde_json::json;

/// Which message an answer replies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// `request_headers`.
    RequestHeaders,
    /// `request_body`.
    RequestBody,
    /// `response_headers`.
    ResponseHeaders,
    /// `response_body`.
    ResponseBody,
    /// `request_trailers`.
    RequestTrailers,
    /// `response_trailers`.
    ResponseTrailers,
}

/// Header and body changes to a message that goes on.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// Headers to set (overwriting).
    pub(super) set: Vec<(&'static str, String)>,
    /// Headers to remove.
    pub(super) remove: Vec<&'static str>,
    /// The body to send instead.
    pub(super) body: Option<Vec<u8>>,
    /// Drop this piece of a streamed body (it is sent whole later).
    pub(super) clear_body: bool,
    /// The headers that pick the route changed: Envoy picks it again.
    pub(super) clear_route_cache: bool,
}

/// Go on with the message `part`, changed as `changes` says.
pub(super) fn proceed(part: Part, changes: Changes) -> ProcessingResponse {
    let header_mutation =
        (!changes.set.is_empty() || !changes.remove.is_empty()).then(|| HeaderMutation {
            set_headers: changes.set.into_iter().map(|(k, v)| set(k, v)).collect(),
            remove_headers: changes.remove.into_iter().map(str::to_owned).collect(),
        });
    let body_mutation = match (changes.body, changes.clear_body) {
        (Some(body), _) => Some(body_mutation::Mutation::Body(body)),
        (None, true) => Some(body_mutation::Mutation::ClearBody(true)),
        (None, false) => None,
    };
    let common = CommonResponse {
        header_mutation,
        body_mutation: body_mutation.map(|m| BodyMutation { mutation: Some(m) }),
        clear_route_cache: changes.clear_route_cache,
        ..CommonResponse::default()
    };
    let response = match part {
        Part::RequestHeaders => Response::RequestHeaders(HeadersResponse {
            response: Some(common),
        }),
        Part::ResponseHeaders => Response::ResponseHeaders(HeadersResponse {
            response: Some(common),
        }),
        Part::RequestBody => Response::RequestBody(BodyResponse {
            response: Some(common),
        }),
        Part::ResponseBody => Response::ResponseBody(BodyResponse {
            response: Some(common),
        }),
        Part::RequestTrailers => Response::RequestTrailers(TrailersResponse::default()),
        Part::ResponseTrailers => Response::ResponseTrailers(TrailersResponse::default()),
    };
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// Go on with request headers, and send Envoy nothing more of this request
/// (when `allow_mode_override` lets it): a request the processor passes.
pub(super) fn pass_headers() -> ProcessingResponse {
    let mut r = proceed(Part::RequestHeaders, Changes::default());
    r.mode_override = Some(ProcessingMode {
        request_body_mode: BodySendMode::None as i32,
        response_header_mode: HeaderSendMode::Skip as i32,
        response_body_mode: BodySendMode::None as i32,
        request_trailer_mode: HeaderSendMode::Skip as i32,
        response_trailer_mode: HeaderSendMode::Skip as i32,
        ..ProcessingMode::default()
    });
    r
}

fn set(key: &str, value: String) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: String::new(),
            raw_value: value.into_bytes(),
        }),
        append: None,
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        keep_empty_value: false,
    }
}

/// An error answered at once.
#[derive(Debug)]
pub(super) struct Refusal {
    /// The HTTP status.
    pub(super) status: u16,
    /// The error's kind in the API's own words (`type`).
    pub(super) kind: &'static str,
    /// ctxbudget's own code: a denial's reason, or the error's.
    pub(super) code: &'static str,
    /// What happened and what to do.
    pub(super) message: String,
    /// Headers beside `content-type`.
    pub(super) headers: Vec<(&'static str, String)>,
    /// A denial's fields for the body's `ctxbudget` object.
    pub(super) denial: Option<Denial>,
}

impl Refusal {
    /// A denial of CheckAndReserve, with `x-ratelimit-*` headers when
    /// `with_headers`.
    pub(super) fn denied(out: &ReserveOutcome, with_headers: bool) -> Self {
        let d = out
            .denial
            .clone()
            .expect("a denied reservation has its denial");
        let status = denial_status(&d);
        let mut headers = match with_headers {
            true => reservation_headers(&out.limits, Some(&d)),
            false => Vec::new(),
        };
        if let Some(secs) = retry_after(&d) {
            headers.push(("retry-after", secs.to_string()));
        }
        Refusal {
            status,
            kind: kind_of(status),
            code: d.reason.as_str(),
            message: d.detail.clone(),
            headers,
            denial: Some(d),
        }
    }

    /// A request the processor cannot take: 400 with `message`.
    pub(super) fn bad_request(message: String) -> Self {
        Refusal::plain(400, "invalid_request", message)
    }

    /// A request body larger than can be read: 413 with `message`.
    pub(super) fn too_large(message: String) -> Self {
        Refusal::plain(413, "invalid_request", message)
    }

    /// A filter set up so that no call could be budgeted: 500 with
    /// `message`, naming the setting to change.
    pub(super) fn misconfigured(message: String) -> Self {
        Refusal::plain(500, "invalid_request", message)
    }

    /// A request on a path that is no LLM call, refused by `other_requests = "deny"`.
    pub(super) fn not_served(path: &str) -> Self {
        let shown: String = path.chars().take(200).collect();
        Refusal::plain(
            404,
            "not_an_llm_call",
            format!(
                "{shown} is not an LLM API this gateway serves ([ext_proc] paths); \
                 call one of those"
            ),
        )
    }

    /// An error of the application, with the HTTP status of its kind: the
    /// caller's mistake (400, 403), the store's (503, retry after a second)
    /// or the service's (500).
    pub(super) fn error(e: &AppError) -> Self {
        let status = error_status(e.kind());
        match e.kind() {
            ErrorKind::Invalid => Refusal::bad_request(e.message().to_owned()),
            ErrorKind::Forbidden => Refusal::plain(status, "permission_denied", e.message().into()),
            ErrorKind::Unavailable => {
                let mut r = Refusal::plain(
                    status,
                    "budget_store_unavailable",
                    format!("the budget could not be checked ({e}); retry shortly"),
                );
                r.headers.push(("retry-after", "1".into()));
                r
            }
            ErrorKind::Exhausted => {
                let mut r = Refusal::plain(status, "overloaded", e.message().into());
                let secs = e.retry_after_ms().unwrap_or(1000).div_ceil(1000).max(1);
                r.headers.push(("retry-after", secs.to_string()));
                r
            }
            _ => Refusal::plain(
                500,
                "budget_error",
                format!("the budget could not be checked ({e}); report this to the operator"),
            ),
        }
    }

    fn plain(status: u16, code: &'static str, message: String) -> Self {
        Refusal {
            status,
            kind: kind_of(status),
            code,
            message,
            headers: Vec::new(),
            denial: None,
        }
    }

    /// The body in `api`'s error format: OpenAI's `{"error": {message, type,
    /// code, param}}` or Anthropic's `{"type": "error", "error": {type,
    /// message}}`, with a `ctxbudget` object (reason, level, retry_after_ms)
    /// inside `error`.
    pub(super) fn body(&self, api: Option<Api>) -> Vec<u8> {
        let ours = match &self.denial {
            Some(d) => json!({
                "reason": d.reason.as_str(),
                "level": d.level.map(|l| l.as_str()),
                "dimension": d.dimension.map(|x| x.as_str()),
                "model_group": d.model_group,
                "retry_after_ms": d.retry_after_ms,
            }),
            None => json!({ "reason": self.code }),
        };
        let body = match api {
            Some(Api::Messages) => json!({
                "type": "error",
                "error": {
                    "type": anthropic_kind(self.status),
                    "message": self.message,
                    "ctxbudget": ours,
                },
            }),
            _ => json!({
                "error": {
                    "message": self.message,
                    "type": self.kind,
                    "param": null,
                    "code": self.code,
                    "ctxbudget": ours,
                },
            }),
        };
        serde_json::to_vec(&body).expect("JSON values serialize")
    }

    /// The `ImmediateResponse` that answers the caller with this error.
    pub(super) fn into_response(self, api: Option<Api>) -> ProcessingResponse {
        let body = self.body(api);
        let mut headers: Vec<HeaderValueOption> =
            self.headers.into_iter().map(|(k, v)| set(k, v)).collect();
        headers.push(set("content-type", "application/json".into()));
        let immediate = ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(self.status),
            }),
            headers: Some(HeaderMutation {
                set_headers: headers,
                remove_headers: Vec::new(),
            }),
            body,
            grpc_status: None,
            details: format!("ctxbudget_{}", self.code),
        };
        ProcessingResponse {
            response: Some(Response::ImmediateResponse(immediate)),
            ..ProcessingResponse::default()
        }
    }
}

/// OpenAI's error `type` for a status.
fn kind_of(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_exceeded",
        413 | 400 => "invalid_request_error",
        403 => "permission_error",
        404 => "not_found_error",
        503 => "service_unavailable",
        _ => "api_error",
    }
}

/// Anthropic's error `type` for a status.
fn anthropic_kind(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_error",
        413 => "request_too_large",
        400 => "invalid_request_error",
        403 => "permission_error",
        404 => "not_found_error",
        503 => "overloaded_error",
        _ => "api_error",
    }
}
