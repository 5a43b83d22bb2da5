//! The one mapping from engine errors to gRPC status codes.

use crate::engine::EngineError;
use crate::store::StoreError;
use tonic::Status;

/// Maps an engine error to the status a gateway acts on.
pub fn to_status(err: EngineError) -> Status {
    match err {
        // The caller must fix the request; retrying it unchanged cannot help.
        EngineError::Invalid(e) => Status::invalid_argument(e.to_string()),
        // The reservation is unknown or long gone: nothing to settle.
        EngineError::NotFound(message) => Status::not_found(message),
        // Well-formed, but the state it names forbids it (a spent idempotency key).
        EngineError::FailedPrecondition(message) => Status::failed_precondition(message),
        // The decision could not be made right now. UNAVAILABLE is what drives
        // the gateway's own fail-open / fail-closed choice, and is safe to retry.
        EngineError::Store(e @ (StoreError::Unavailable(_) | StoreError::Unanswered(_))) => {
            Status::unavailable(format!(
                "{e}; retry with backoff, or apply your gateway's fail-open/fail-closed policy"
            ))
        }
        // The store answered something unexpected: a bug or foreign data under
        // the key prefix. An operator must look; retrying will not help.
        EngineError::Store(e @ StoreError::Protocol(_)) => {
            Status::internal(format!("{e}; report this to the operator"))
        }
        // The service's own store settings are wrong (start-up refuses them, so
        // this is a bug if it is ever seen): an operator must fix them.
        EngineError::Store(e @ StoreError::Settings(_)) => {
            Status::internal(format!("{e}; report this to the operator"))
        }
    }
}
