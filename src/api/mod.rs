//! The gRPC adapter: ctxbudget's own tonic service, protobuf ↔ domain
//! conversion, authentication, the admission gate, and the one place errors
//! become `tonic::Status`. No budget arithmetic lives here. Envoy's services
//! are [`crate::gateway`]'s, over these.

pub mod admission;
pub mod auth;
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

pub(crate) use convert::MAX_MODEL_BYTES;
pub use convert::reason_of;
pub use errors::{Refusal, refusal_status, to_status};
pub use service::BudgetApi;
pub(crate) use service::{span, timed_with};
