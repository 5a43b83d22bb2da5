//! gRPC's one mapping of the application's errors: each [`ErrorKind`] to its
//! `tonic::Status` code, the message as it is, and a retry hint as gRPC's
//! retry pushback (`grpc-retry-pushback-ms`).

use crate::app::{AppError, ErrorKind};
use tonic::{Code, Status};

/// The gRPC code of an error kind.
pub fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::Invalid => Code::InvalidArgument,
        // Too large to read at all: gRPC's code for a size over a limit, as
        // tonic answers it.
        ErrorKind::TooLarge => Code::OutOfRange,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::Forbidden => Code::PermissionDenied,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Conflict => Code::FailedPrecondition,
        ErrorKind::Stale => Code::Aborted,
        ErrorKind::Exhausted => Code::ResourceExhausted,
        ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
        // What drives the gateway's own fail-open / fail-closed choice.
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Internal => Code::Internal,
    }
}

impl From<AppError> for Status {
    fn from(e: AppError) -> Status {
        let mut status = Status::new(code(e.kind()), e.message());
        if let Some(ms) = e.retry_after_ms()
            && let Ok(v) = ms.to_string().parse()
        {
            status.metadata_mut().insert("grpc-retry-pushback-ms", v);
        }
        status
    }
}
