//! The one mapping from errors to gRPC status codes: the engine's (and
//! through it the store's and the domain's), and the gRPC layer's own
//! refusals (authentication, undecodable messages).

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

impl From<EngineError> for Status {
    fn from(err: EngineError) -> Status {
        to_status(err)
    }
}

/// A call the gRPC layer refuses before the engine sees it.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// No token, or one that is not configured.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// The token may not act for the tenant named.
    #[error("{0}")]
    PermissionDenied(String),
    /// The message does not decode as the request it should be.
    #[error("{0}")]
    Undecodable(String),
    /// The message is larger than `[server] max_message_bytes` (`found`: its
    /// size, when known).
    #[error(
        "the request is {} over this server's limit of {limit} bytes \
         ([server] max_message_bytes in its configuration file, 16 MiB by default): \
         send a smaller prompt, or ask the operator to raise the limit",
        size(.found)
    )]
    MessageTooLarge {
        /// The message's size in bytes, when known.
        found: Option<u64>,
        /// The limit in bytes.
        limit: usize,
    },
}

/// A message's size for [`Refusal::MessageTooLarge`]: `1048576 bytes,` or,
/// unknown, `larger than allowed:`.
fn size(found: &Option<u64>) -> String {
    found.map_or("larger than allowed:".into(), |n| format!("{n} bytes,"))
}

/// Maps a refusal of the gRPC layer to its status.
pub fn refusal_status(refusal: Refusal) -> Status {
    match refusal {
        // Who is calling is unknown: present a configured token.
        Refusal::Unauthenticated(message) => Status::unauthenticated(message),
        // The caller is known but bound to other tenants.
        Refusal::PermissionDenied(message) => Status::permission_denied(message),
        // The caller sent bytes that are no valid request: fix the client.
        Refusal::Undecodable(message) => Status::invalid_argument(message),
        // Too large to read at all (gRPC's code for a size over a limit, as
        // tonic answers it): the caller must send less, or the operator raise
        // the setting the message names.
        e @ Refusal::MessageTooLarge { .. } => Status::out_of_range(e.to_string()),
    }
}
