//! The application's errors: one kind each (what the caller should do about
//! it) and a message that says it. Every error below — the engine's, the
//! store's through it, the domain's invalid input, a refused caller, a shed
//! call — becomes one here, once; each transport maps the kind to its own
//! answer (gRPC a `Status`, HTTP a status code and JSON, Envoy's services
//! their answers), also once.

use crate::domain::InvalidInput;
use crate::engine::EngineError;
use crate::store::StoreError;
use std::fmt;

/// What a caller should do about an error: the kinds of gRPC's canonical
/// codes the service answers, named for what they mean here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request must change: a field in error, a body that is no request.
    Invalid,
    /// The request is larger than the service reads.
    TooLarge,
    /// No token, or one that is not configured.
    Unauthenticated,
    /// The caller is known but may not do this (a token bound to other
    /// tenants, a caller's token on the admin API).
    Forbidden,
    /// What the request names does not exist (any more).
    NotFound,
    /// Well-formed, but the state it names forbids it (a spent idempotency
    /// key, a replica whose configuration is its file).
    Conflict,
    /// A write made against a version that is no longer current.
    Stale,
    /// No room to work on the call now: retry after `retry_after_ms`.
    Exhausted,
    /// The call's own time ran out before it could be served.
    DeadlineExceeded,
    /// The store cannot answer now: retry with backoff, or apply the
    /// gateway's failure policy.
    Unavailable,
    /// A method or route the service does not serve.
    Unsupported,
    /// A fault of the service: an operator must look.
    Internal,
}

impl ErrorKind {
    /// Its gRPC canonical code name, as metrics, logs and the HTTP API's
    /// JSON errors spell it (`INVALID_ARGUMENT`, …).
    pub fn code_name(self) -> &'static str {
        match self {
            ErrorKind::Invalid => "INVALID_ARGUMENT",
            ErrorKind::TooLarge => "OUT_OF_RANGE",
            ErrorKind::Unauthenticated => "UNAUTHENTICATED",
            ErrorKind::Forbidden => "PERMISSION_DENIED",
            ErrorKind::NotFound => "NOT_FOUND",
            ErrorKind::Conflict => "FAILED_PRECONDITION",
            ErrorKind::Stale => "ABORTED",
            ErrorKind::Exhausted => "RESOURCE_EXHAUSTED",
            ErrorKind::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorKind::Unavailable => "UNAVAILABLE",
            ErrorKind::Unsupported => "UNIMPLEMENTED",
            ErrorKind::Internal => "INTERNAL",
        }
    }
}

/// An error of the application layer: its kind, what to do, and when
/// retrying helps, how long to wait first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppError {
    kind: ErrorKind,
    message: String,
    retry_after_ms: Option<u64>,
}

impl AppError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        AppError {
            kind,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// [`ErrorKind::Invalid`].
    pub fn invalid(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::Invalid, message)
    }

    /// [`ErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::NotFound, message)
    }

    /// [`ErrorKind::Forbidden`].
    pub fn forbidden(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::Forbidden, message)
    }

    /// [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        AppError::new(ErrorKind::Internal, message)
    }

    /// [`ErrorKind::TooLarge`]: a request of `found` bytes (when known)
    /// over the `limit` of `[server] max_message_bytes`.
    pub fn too_large(found: Option<u64>, limit: usize) -> Self {
        let size = found.map_or("larger than allowed:".into(), |n| format!("{n} bytes,"));
        AppError::new(
            ErrorKind::TooLarge,
            format!(
                "the request is {size} over this server's limit of {limit} bytes ([server] \
                 max_message_bytes in its configuration file, 16 MiB by default): send a \
                 smaller prompt, or ask the operator to raise the limit"
            ),
        )
    }

    /// The same error, saying retrying helps after `ms`.
    pub fn retry_after(mut self, ms: u64) -> Self {
        self.retry_after_ms = Some(ms);
        self
    }

    /// What the caller should do about it.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What happened and what to do.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// How long to wait before a retry, when the error says.
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.retry_after_ms
    }
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AppError {}

impl From<EngineError> for AppError {
    fn from(err: EngineError) -> Self {
        match err {
            // The caller must fix the request; retrying it unchanged cannot help.
            EngineError::Invalid(e) => AppError::invalid(e.to_string()),
            // The reservation is unknown or long gone: nothing to settle.
            EngineError::NotFound(message) => AppError::not_found(message),
            EngineError::FailedPrecondition(message) => AppError::new(ErrorKind::Conflict, message),
            EngineError::Store(e) => e.into(),
        }
    }
}

impl From<StoreError> for AppError {
    fn from(err: StoreError) -> Self {
        match err {
            // The decision could not be made right now: what drives the
            // gateway's own fail-open / fail-closed choice; safe to retry.
            e @ (StoreError::Unavailable(_) | StoreError::Unanswered(_)) => AppError::new(
                ErrorKind::Unavailable,
                format!(
                    "{e}; retry with backoff, or apply your gateway's fail-open/fail-closed \
                     policy"
                ),
            ),
            // The store answered something unexpected (a bug, or foreign data
            // under the key prefix), or the service's own store settings are
            // wrong (start-up refuses them): an operator must look.
            e @ (StoreError::Protocol(_) | StoreError::Settings(_)) => {
                AppError::internal(format!("{e}; report this to the operator"))
            }
        }
    }
}

impl From<InvalidInput> for AppError {
    fn from(err: InvalidInput) -> Self {
        AppError::invalid(err.to_string())
    }
}
