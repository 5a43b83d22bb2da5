//! The application layer, under every front door (gRPC, the HTTP API,
//! Envoy's rate limit service and external processor, the admin API): who is
//! calling and what they may do (`caller`), whether there is room to work on
//! a decision now (`admission`), and each operation a caller may ask of the
//! engine, with its tenant binding checked (`service`). It knows no
//! transport: a front door authenticates the header it received, converts
//! its request to the domain's once, calls here, and converts the outcome or
//! the [`AppError`] to its own answer once.
//!
//! - `caller`: tokens, their tenants and roles; refusals counted.
//! - `admission`: the gate of `[server] max_in_flight` slots.
//! - `error`: [`AppError`] and its [`ErrorKind`]s; the engine's errors as
//!   them.
//! - `service`: [`App`], the operations for a caller.
//! - `timed`: an operation's span, duration and code, recorded.
//! - `trace`: the caller's trace context, and a decision on the span.

pub mod admission;
pub mod caller;
mod error;
mod service;
mod timed;
pub mod trace;

pub use admission::{Gate, Permit, Slot};
pub use caller::{Auth, Caller, KeptTokens, check_tenant};
pub use error::{AppError, ErrorKind};
pub use service::App;
pub use timed::{span, timed};
