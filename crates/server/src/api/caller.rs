//! gRPC's authentication: the interceptor in front of every ctxbudget and
//! Envoy service reads the `authorization` metadata and asks the
//! application's [`Auth`] who is calling; the handlers find the [`Caller`]
//! in the request's extensions.

use crate::app::{Auth, Caller};
use std::sync::Arc;
use tonic::{Request, Status};

/// The interceptor: it runs on the headers, before the body is decoded, so
/// an unauthenticated call is refused UNAUTHENTICATED whatever its body, and
/// touches nothing. The caller it finds goes into the request's extensions.
pub fn interceptor(
    auth: Arc<Auth>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static {
    move |mut request: Request<()>| {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match auth.authenticate(header)? {
            Some(caller) => {
                request.extensions_mut().insert(caller);
                Ok(request)
            }
            None => Ok(request),
        }
    }
}

/// The caller [`interceptor`] found, if authentication is on.
pub fn caller_of(extensions: &tonic::Extensions) -> Option<&Caller> {
    extensions.get::<Caller>()
}
