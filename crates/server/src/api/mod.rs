//! The gRPC adapter over the application layer ([`crate::app`]): ctxbudget's
//! own tonic service, protobuf ↔ domain conversion (shared with the HTTP
//! API, which speaks the same messages as JSON), the authentication
//! interceptor, and the one place errors become `tonic::Status`. No budget
//! arithmetic and no authorization rule lives here. Envoy's services are
//! [`crate::gateway`]'s.

mod caller;
mod candidates;
pub mod codec;
mod convert;
mod errors;
pub mod http;
mod service;
/// What the service does with a request's bytes before any store call, as one
/// function: the fuzz target's entry (`fuzz/`). Compiled only under `cargo
/// fuzz` (which sets `--cfg fuzzing`) and for the unit tests, so it is no
/// part of the library's API.
#[cfg(any(fuzzing, test))]
pub mod validate;
#[cfg(test)]
mod validate_tests;

pub use caller::{caller_of, interceptor};
pub(crate) use convert::MAX_MODEL_BYTES;
pub use convert::reason_of;
pub use errors::code;
pub use service::BudgetApi;
