//! ctxbudget decides, before every upstream call an LLM gateway makes, whether
//! the request fits its budget: requests, tokens and a concurrency slot at the
//! global, tenant and user levels, reserved all or nothing and settled with the
//! real usage afterwards.
//!
//! # Layout
//! - [`domain`]: limits, bucket arithmetic, plans and decisions; pure, no I/O.
//! - [`store`]: the [`store::Store`] trait, its memory and Redis (Lua) stores, key layout.
//! - [`engine`]: request → plan → store → decision, over any store.
//! - [`estimator`]: token counting and the adaptive multiplier.
//! - [`api`]: the tonic service; protobuf conversion and error mapping only.
//! - [`config`]: defaults, TOML file, env and flags → validated settings.
//! - [`server`]: bootstrap; `run(settings, listener, shutdown)`.
//! - [`reload`]: configuration changes without a restart (Redis watch, SIGHUP).
//! - [`cli`]: the `ctxbudget` command line.
//! - [`bench`]: `ctxbudget bench`, the load generator and overspend check.
//! - [`telemetry`]: logging setup and every metric name.
//! - [`pb`]: the generated `ctxbudget.v1` protobuf types, client and server.
#![forbid(unsafe_code)]

pub mod api;
pub mod bench;
pub mod cli;
pub mod config;
pub mod domain;
pub mod engine;
pub mod estimator;
pub mod reload;
pub mod server;
pub mod store;
pub mod telemetry;

#[cfg(test)]
mod layout_tests;

/// Generated code for `proto/ctxbudget/v1/budget.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("ctxbudget.v1");

    /// The encoded descriptor set, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/ctxbudget_descriptor.bin"));
}
