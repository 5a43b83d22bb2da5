//! Requests over `[server] max_message_bytes`. tonic refuses them before
//! decoding — which must stay so: the limit bounds what a caller can make the
//! server buffer — with OUT_OF_RANGE and its own words ("Error, decoded message
//! length too large"), which do not say which setting to change. This wrapper
//! puts [`AppError::too_large`]'s message, naming the setting, in place
//! of tonic's on those responses, and passes every other response through.

use crate::app::AppError;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// How tonic's refusal of an oversized message begins (tonic 0.14,
/// `codec/decode.rs`); the test `requests_above_the_message_limit_are_refused_clearly`
/// notices when a tonic upgrade changes it.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// A gRPC service whose refusals of oversized requests name the setting.
#[derive(Clone)]
pub(super) struct MessageLimit<S> {
    inner: S,
    limit: usize,
}

impl<S> MessageLimit<S> {
    /// `inner`, whose decoding limit is `limit` bytes.
    pub(super) fn new(inner: S, limit: usize) -> Self {
        MessageLimit { inner, limit }
    }
}

impl<S: NamedService> NamedService for MessageLimit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for MessageLimit<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let limit = self.limit;
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            // A refusal before decoding is a trailers-only response: its
            // status is in the headers.
            if let Some(status) = Status::from_header_map(response.headers())
                && status.code() == Code::OutOfRange
                && status.message().starts_with(TONIC_TOO_LARGE)
            {
                let refusal = AppError::too_large(found_bytes(status.message()), limit);
                // Only a message with bytes no header may carry fails here;
                // tonic's own text then stays.
                let _ = Status::from(refusal).add_header(response.headers_mut());
            }
            Ok(response)
        })
    }
}

/// The size in tonic's text: `… found 1048576 bytes, the limit is …`.
fn found_bytes(message: &str) -> Option<u64> {
    let (_, rest) = message.split_once("found ")?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_is_read_from_tonics_text() {
        let text = "Error, decoded message length too large: found 102412 bytes, the limit is: \
                    65536 bytes";
        assert!(text.starts_with(TONIC_TOO_LARGE));
        assert_eq!(found_bytes(text), Some(102_412));
        assert_eq!(found_bytes("found nothing"), None);
    }
}
