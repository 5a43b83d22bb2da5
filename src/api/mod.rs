//! The gRPC adapter: tonic services (ctxbudget's own, and Envoy's rate limit
//! service in [`envoy`]), protobuf ↔ domain conversion, and the one
//! place errors become `tonic::Status`. No budget arithmetic lives here.

pub mod auth;
pub mod codec;
mod convert;
pub mod envoy;
mod errors;
mod service;
pub mod validate;

pub use envoy::EnvoyApi;
pub use errors::{Refusal, refusal_status, to_status};
pub use service::BudgetApi;
