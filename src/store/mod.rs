//! Budget state: one [`Store`] trait, two implementations with the same
//! semantics — [`memory::MemoryStore`] (the default: nothing to install) and
//! [`redis::RedisStore`] (shared by every replica, changed only by the atomic Lua
//! scripts in `lua/`). The conformance suite in `tests/` runs one set of
//! behaviours against both.

pub mod config;
pub mod keys;
pub mod memory;
pub mod redis;
pub mod scripts;

use crate::domain::{LevelPlan, Readings, ReservationId, ReservePlan, TenantId, UserId};
use std::future::Future;

pub use crate::domain::budget::layout::EXACT_LEASES;
pub use crate::domain::budget::state;
pub use crate::domain::budget::{
    Reclaimed, RenewReply, ReserveReply, Retention, SettleReply, Settled,
};

/// Which reservation to settle, and the levels it touched (every level of the
/// reservation, limited or not, so a lease is released wherever it is held).
#[derive(Clone, Copy, Debug)]
pub struct Settlement<'a> {
    /// The reservation.
    pub id: &'a ReservationId,
    /// Global, tenant and (with a user) user levels, with their current limits.
    pub levels: &'a [LevelPlan],
}

/// The levels of one tenant (and user) to read.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    /// The tenant.
    pub tenant: &'a TenantId,
    /// The user, if any.
    pub user: Option<&'a UserId>,
}

/// The store could not answer. Every variant says whether a retry may help.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Unreachable, loading, out of memory, refusing writes: the call was not
    /// applied; retry or fail over.
    #[error("budget store unavailable: {0}")]
    Unavailable(String),
    /// The call was sent, or may have been, but no answer came (its deadline
    /// passed, the connection dropped): retry or fail over, knowing it may
    /// have been applied.
    #[error("budget store unavailable: {0}")]
    Unanswered(String),
    /// The store answered something the service does not understand: a bug or
    /// foreign data under the key prefix. Retrying will not help.
    #[error("budget store answered unexpectedly: {0}")]
    Protocol(String),
    /// The store's settings are wrong (a malformed URL, unreadable or
    /// mismatched TLS files): fix them; retrying will not help.
    #[error("budget store settings: {0}")]
    Settings(String),
}

impl StoreError {
    /// True when a retry may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Unanswered(_))
    }
}

/// Budget state with atomic reserve and settle operations.
pub trait Store: Send + Sync + 'static {
    /// Takes the plan's cost at every level, or nothing.
    fn reserve(
        &self,
        plan: &ReservePlan,
    ) -> impl Future<Output = Result<ReserveReply, StoreError>> + Send;

    /// Settles a reservation with `actual_tokens` used, of which
    /// `actual_prompt_tokens` were prompt (an estimator sample when the service
    /// counted the prompt).
    fn commit(
        &self,
        settlement: Settlement<'_>,
        actual_tokens: u64,
        actual_prompt_tokens: u64,
    ) -> impl Future<Output = Result<SettleReply, StoreError>> + Send;

    /// Returns a reservation's request and tokens.
    fn refund(
        &self,
        settlement: Settlement<'_>,
    ) -> impl Future<Output = Result<SettleReply, StoreError>> + Send;

    /// Extends a live reservation's lease to `ttl_ms` from now.
    fn renew(
        &self,
        settlement: Settlement<'_>,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<RenewReply, StoreError>> + Send;

    /// Reads the levels of `scope` without changing anything.
    /// With `exact`, a level of at most [`EXACT_LEASES`] leases is read whole
    /// for its real earliest lease expiry (GetStatus); otherwise that expiry
    /// may be a lower bound (cheap: refusals read limits this way).
    fn status(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> impl Future<Output = Result<Readings, StoreError>> + Send;

    /// The estimator samples (actual ÷ estimated prompt tokens, newest first)
    /// of each key.
    fn estimator_samples(
        &self,
        keys: &[String],
    ) -> impl Future<Output = Result<Vec<Vec<f64>>, StoreError>> + Send;

    /// The same backend with every key under `<prefix>shadow:`: where quotas in
    /// shadow keep their own buckets and leases, apart from the enforced ones.
    fn shadow(&self) -> Self
    where
        Self: Sized;

    /// Checks the store answers on every connection it holds, reconnecting
    /// the ones that broke, within a bounded time: the circuit breaker's probe
    /// before real calls may reach a recovering store.
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One line for the startup log: which store, where.
    fn describe(&self) -> String;
}
