//! ctxbudget decides, before every upstream call an LLM gateway makes, whether
//! the request fits its budget: requests, tokens and a concurrency slot at the
//! global, tenant and user levels, reserved all or nothing and settled with the
//! real usage afterwards.
//!
//! # Layout
//! The modules in layers, lowest first: each imports only modules listed
//! before it (the modules one item names share a layer). `src/layout_tests.rs`
//! reads the ranks from this list and fails on an import that runs up it, and
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

pub mod admin;
pub mod alerts;
pub mod api;
pub mod app;
/// The budget domain: the `ctxbudget-core` crate (`crates/core`).
pub use ctxbudget_core as domain;
/// The engine and the estimator: the `ctxbudget-engine` crate (`crates/engine`).
pub use ctxbudget_engine::{engine, estimator};
/// The stores and telemetry: the `ctxbudget-store` crate (`crates/store`).
pub use ctxbudget_store::{store, telemetry};
pub mod bench;
pub mod cli;
pub mod config;
pub mod gateway;
pub mod http;
pub mod reload;
pub mod server;

#[cfg(test)]
mod layout_tests;

/// Generated code for `proto/ctxbudget/v1/budget.proto`.
#[allow(missing_docs, clippy::all, clippy::too_many_lines)]
pub mod pb {
    tonic::include_proto!("ctxbudget.v1");
    include!(concat!(env!("OUT_DIR"), "/ctxbudget.v1.serde.rs"));

    /// The encoded descriptor set, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/ctxbudget_descriptor.bin"));
}

/// Envoy's rate limit service and external processor APIs (the parts served;
/// `proto/envoy/`), in
/// Envoy's package hierarchy. Its descriptors are in [`pb::FILE_DESCRIPTOR_SET`].
#[allow(missing_docs, clippy::all, clippy::too_many_lines)]
pub mod envoy {
    /// `envoy.config.*`.
    pub mod config {
        /// `envoy.config.core`.
        pub mod core {
            /// `envoy.config.core.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    /// `envoy.extensions.*`.
    pub mod extensions {
        /// `envoy.extensions.filters`.
        pub mod filters {
            /// `envoy.extensions.filters.http`.
            pub mod http {
                /// `envoy.extensions.filters.http.ext_proc`.
                pub mod ext_proc {
                    /// `envoy.extensions.filters.http.ext_proc.v3`.
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.ext_proc.v3");
                    }
                }
            }
        }
        /// `envoy.extensions.common`.
        pub mod common {
            /// `envoy.extensions.common.ratelimit`.
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`.
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    /// `envoy.service.*`.
    pub mod service {
        /// `envoy.service.ext_proc`.
        pub mod ext_proc {
            /// `envoy.service.ext_proc.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ext_proc.v3");
            }
        }
        /// `envoy.service.ratelimit`.
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    /// `envoy.type.*`.
    pub mod r#type {
        /// `envoy.type.v3`.
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}
