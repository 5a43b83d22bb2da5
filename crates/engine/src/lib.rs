//! ctxbudget's engine and estimator, re-exported by the service's crate as
//! `ctxbudget::engine` and `ctxbudget::estimator`:
//!
//! - [`estimator`]: token counting (tokenizers, the heuristic, the blocking
//!   pool) and the adaptive correction.
//! - [`engine`]: request → plan → store → decision over any
//!   [`store::Store`]; the circuit breaker and its settings, the failure
//!   policy, degraded mode, shadow quotas, cancellations.
//!
//! It depends on the store crate (whose [`domain`], [`store`] and
//! [`telemetry`] it re-exports) and no crate of ctxbudget above it: no
//! transport, configuration file or admin API can be imported.
#![forbid(unsafe_code)]

pub use ctxbudget_store::{domain, store, telemetry};
pub mod engine;
pub mod estimator;
