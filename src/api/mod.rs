//! The gRPC adapter: tonic service, protobuf ↔ domain conversion, and the one
//! place errors become `tonic::Status`. No budget arithmetic lives here.

pub mod auth;
pub mod codec;
mod convert;
mod errors;
mod service;
pub mod validate;

pub use errors::to_status;
pub use service::BudgetApi;
