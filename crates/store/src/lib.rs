//! ctxbudget's stores and telemetry, re-exported by the service's crate as
//! `ctxbudget::store` and `ctxbudget::telemetry`:
//!
//! - [`store`]: the [`store::Store`] trait; the memory store (a map, a lock
//!   and TTLs around [`domain::budget`]), the Redis store (client, pool, one
//!   file per call, reply decoding, error classification), the Redis Cluster
//!   store, the Lua scripts (`lua/`, built by `build.rs` from their rules),
//!   every Redis key; the live configuration's documents in Redis.
//! - [`telemetry`]: every metric name and its recording, the exporter,
//!   logging.
//!
//! It depends on the core crate (re-exported here as [`domain`]) and no
//! crate of ctxbudget above it: the engine, the transports and the
//! configuration cannot be imported.
#![forbid(unsafe_code)]

pub use ctxbudget_core as domain;
pub mod store;
pub mod telemetry;
