//! The stores through the [`ctxbudget::store::Store`] trait, in one test
//! binary (one link of the library):
//!
//! - `differential`: random operation sequences on the memory store and on a
//!   real Redis, every reply, status read and key compared exactly (and the
//!   Redis Cluster store's global share held to the memory store's global
//!   level);
//! - `suite`: one behaviour per test, generated for both stores
//!   (`suite::memory::<test>` and `suite::redis::<test>`);
//! - `ledger`: the usage ledger, the same way (`ledger::memory::<test>`…);
//! - `memory_store`, `redis_store`, `cluster_store`: what only one store shows;
//! - `properties`: invariants of the budget arithmetic (proptest).
//!
//! Run one part with `cargo nextest run --test store -E 'test(/^differential::/)'`.
#![allow(
    clippy::too_many_lines,
    reason = "a test is one scenario, read from start to end"
)]

#[path = "../support/mod.rs"]
mod support;

#[macro_use]
mod suite;

mod cluster_store;
mod differential;
mod ledger;
mod memory_store;
mod properties;
mod redis_store;
