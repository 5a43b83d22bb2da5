//! ctxbudget's service: the configuration, what operators do, the
//! application layer and every front door over it (gRPC, the HTTP API,
//! Envoy's rate limit service and external processor, the admin API),
//! alerts, live reload and the bootstrap. The `ctxbudget` crate re-exports
//! each module; its `# Layout` list (`src/lib.rs`) ranks them all.
//!
//! It depends on the engine crate (whose [`domain`], [`store`],
//! [`telemetry`], [`engine`] and [`estimator`] it re-exports) and on no crate
//! above it: the command line and the bench cannot be imported.
#![forbid(unsafe_code)]

pub use ctxbudget_engine::{domain, engine, estimator, store, telemetry};
pub mod admin;
pub mod alerts;
pub mod api;
pub mod app;
pub mod config;
pub mod gateway;
pub mod http;
pub mod reload;
pub mod server;

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
