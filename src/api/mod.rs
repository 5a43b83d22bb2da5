//! The gRPC adapter: tonic services (ctxbudget's own, and Envoy's rate limit
//! service in [`envoy`]), protobuf ↔ domain conversion, and the one
//! place errors become `tonic::Status`. No budget arithmetic lives here.

pub mod admission;
pub mod auth;
mod candidates;
pub mod codec;
mod convert;
pub mod envoy;
mod errors;
pub mod ext_proc;
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

pub use convert::reason_of;
pub use envoy::EnvoyApi;
pub use envoy::descriptor::LiveMap;
pub use errors::{Refusal, refusal_status, to_status};
pub use service::BudgetApi;
