//! The service end to end, in one test binary (one link of the library): a
//! real gRPC server on port 0 over either store, and the CLI around it. The
//! fault tests (`tests/faults.rs`) and the security tests (`tests/security.rs`)
//! stay binaries of their own: they kill, freeze and restart processes.
//!
//! Run one part with `cargo nextest run --test service -E 'test(/^conformance::/)'`.
#![allow(
    clippy::too_many_lines,
    reason = "a test is one scenario, read from start to end"
)]

#[path = "../support/mod.rs"]
mod support;

/// Generates `memory::<test>`, `redis::<test>` and `cluster::<test>` for
/// every behaviour named: each an `async fn <test>(Backend)` of the calling
/// module, run on every store (a local three-master Redis Cluster the last).
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Memory).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Redis).await
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Cluster).await
                }
            )*
        }
    };
}

mod alerts;
mod bench;
mod blocks;
mod cli_output;
mod cluster;
mod conformance;
mod content_correction;
mod cut_streams;
mod envoy;
mod envoy_answers;
mod estimator;
mod ext_proc;
mod fallback;
mod front_doors;
mod hostile_input;
mod images;
mod learned_levels;
mod learned_output;
mod ledger_cli;
mod limit_changes;
mod limit_statuses;
mod models;
mod models_cli;
mod money;
mod observability;
mod operations;
mod overload;
mod prices_cli;
mod queue;
mod queue_gone;
mod queue_replicas;
mod queue_scale;
mod quickstart;
mod server;
mod sessions;
mod tokenizer;
mod windows;
