//! ctxbudget decides, before every upstream call an LLM gateway makes, whether
//! the request fits its budget: requests, tokens and a concurrency slot at the
//! global, tenant and user levels, reserved all or nothing and settled with the
//! real usage afterwards.
//!
//! This crate is the `ctxbudget` binary's: the command line ([`cli`]) and
//! the bench ([`mod@bench`]). Every other module is a crate of the workspace
//! below it, re-exported here under its name: [`domain`] is
//! `ctxbudget-core`; [`telemetry`] and [`store`] are `ctxbudget-store`;
//! [`estimator`] and [`engine`] are `ctxbudget-engine`; the rest, from
//! [`config`] to [`server`], `ctxbudget-server` (docs/architecture.md).
//!
//! # Layout
//! The modules in layers, lowest first: each imports only modules listed
//! before it (the modules one item names share a layer); a crate depends only
//! on the crates below it. `src/layout_tests.rs` reads every crate's sources,
//! takes the ranks from this list and fails on an import that runs up it, and
//! on files of one module that use one another.
//! - [`domain`]: pure, no I/O. Levels, tiers and limits; bucket arithmetic;
//!   plans and decisions; and [`domain::budget`], the one algorithm of every
//!   store operation (reserve, settle, renew, status) with the constants and
//!   byte layout the Lua scripts receive from it.
//! - [`telemetry`]: every metric name and its recording, the exporter, logging.
//! - [`store`]: the [`store::Store`] trait; the memory store (a map, a lock and
//!   TTLs around [`domain::budget`]), the Redis store (client, pool, one file
//!   per call, reply decoding, error classification), the Lua scripts, every
//!   Redis key; the live configuration's documents in Redis (`config_repo`).
//! - [`estimator`]: token counting and the adaptive multiplier.
//! - [`engine`]: request → plan → store → decision over any store; the circuit
//!   breaker and its settings, the failure policy, degraded mode, shadow
//!   quotas, cancellations.
//! - [`config`]: defaults, TOML file, env and flags → validated settings for
//!   every layer below, one file per section; the live configuration's
//!   documents as sections.
//! - [`admin`]: what operators and finance do, for the CLI and the admin
//!   API alike: changes to the live configuration (each document kind's
//!   rules, blocks, the versioned, audited write, its history), usage
//!   reports and reconciliation from any store.
//! - [`app`]: the application layer under every front door: callers (tokens,
//!   tenant bindings, roles), the admission gate, each operation for a
//!   caller, and [`app::AppError`] with its kinds. No transport type.
//! - [`pb`] and [`envoy`]: the generated protobuf types (`ctxbudget.v1`, and
//!   the part of Envoy's API served), client and server.
//! - [`api`]: ctxbudget's tonic service over [`app`]; protobuf conversion
//!   (shared with the HTTP API), the authentication interceptor, and the one
//!   mapping of error kinds to `tonic::Status`.
//! - [`gateway`]: Envoy's rate limit service and external processor, over
//!   [`app`]; their answers.
//! - [`http`]: the HTTP listener: every RPC as `POST /v1/…` through the
//!   [`api`] conversions to [`app`], the admin API (`/admin/v1/…`) on
//!   [`admin`], the console, the OpenAPI document; its one mapping of error
//!   kinds to HTTP.
//! - [`alerts`]: threshold alerts' delivery: claimed from the store's queues,
//!   POSTed signed to the receiver, logged and counted.
//! - [`reload`]: configuration changes without a restart (Redis watch, SIGHUP).
//! - [`server`]: bootstrap; `run(settings, listener, shutdown)`.
//! - [`bench`]: `ctxbudget bench`, the load generator and overspend check.
//! - [`cli`]: the `ctxbudget` command line.
#![forbid(unsafe_code)]

/// The service's modules: the `ctxbudget-server` crate (`crates/server`),
/// with the crates below it re-exported by it.
pub use ctxbudget_server::{
    admin, alerts, api, app, config, domain, engine, envoy, estimator, gateway, http, pb, reload,
    server, store, telemetry,
};
pub mod bench;
pub mod cli;

#[cfg(test)]
mod layout_tests;
