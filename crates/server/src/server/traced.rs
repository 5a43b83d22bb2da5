//! The caller's trace for gRPC: a call that came with W3C `traceparent`
//! metadata is worked on with that context as its parent
//! ([`crate::app::trace`]), so the span of its operation joins the caller's
//! trace. With traces off a call passes through untouched.

use crate::app::trace;
use futures_util::future::Either;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::server::NamedService;

/// A gRPC service whose calls run in their caller's trace context.
#[derive(Clone)]
pub(super) struct Traced<S> {
    inner: S,
}

impl<S> Traced<S> {
    /// `inner`, its calls in their callers' trace contexts.
    pub(super) fn new(inner: S) -> Self {
        Traced { inner }
    }
}

impl<S: NamedService> NamedService for Traced<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Traced<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        match trace::parent_of(request.headers()) {
            None => Either::Left(self.inner.call(request)),
            parent => Either::Right(Box::pin(trace::within(parent, self.inner.call(request)))),
        }
    }
}
