//! Budget state: one [`Store`] trait, two implementations with the same
//! semantics — [`memory::MemoryStore`] (the default: nothing to install) and
//! [`redis::RedisStore`] (shared by every replica, changed only by the atomic Lua
//! scripts in `lua/`). The conformance suite in `tests/` runs one set of
//! behaviours against both.

pub mod keys;
pub mod memory;
pub mod redis;
pub mod scripts;
pub mod state;

use crate::domain::{Level, LevelPlan, Readings, ReservationId, ReservePlan, TenantId, UserId};
use std::future::Future;

/// The most leases a level may hold for an exact status read to scan it
/// (status.lua's EXACT): the scan costs Redis CPU per lease, on one thread.
pub const EXACT_LEASES: u64 = 64;

/// How long settled and idempotent state is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// A reservation's record outlives its lease (or its settlement) by this
    /// long: a late Commit still charges, a repeat answers ALREADY_SETTLED.
    pub record_ms: u64,
    /// How long an idempotency key remembers its reservation.
    pub idempotency_ms: u64,
    /// Estimator samples kept per key (the adaptive window).
    pub samples: usize,
}

/// The answer to a reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveReply {
    /// Taken; readings after the cost was taken.
    Allowed {
        /// One per check, in plan order.
        readings: Readings,
        /// Output tokens granted (the max, or less with reduced output).
        granted_output: u64,
        /// Expired leases this call reclaimed (leases never settled).
        reclaimed: Reclaimed,
    },
    /// Refused; nothing changed.
    Denied {
        /// One per check, in plan order, before anything was taken.
        readings: Readings,
        /// Bit i set: check i denied.
        denied_mask: u64,
        /// Expired leases this call reclaimed (leases never settled).
        reclaimed: Reclaimed,
    },
    /// The idempotency key matched an earlier reservation, returned instead.
    Replayed {
        /// The earlier reservation's nonce.
        nonce: String,
        /// Its reserved tokens.
        tokens: u64,
        /// Milliseconds its lease has left (0 once lapsed).
        lease_expires_in_ms: u64,
        /// Current readings; nothing was taken.
        readings: Readings,
        /// Expired leases this call reclaimed (leases never settled).
        reclaimed: Reclaimed,
    },
    /// The idempotency key belongs to a different request.
    IdempotencyConflict,
    /// The idempotency key's reservation was settled (`settled`) or its lease
    /// lapsed: there is nothing live to return.
    IdempotencySpent {
        /// Committed or refunded, rather than lapsed.
        settled: bool,
    },
}

impl ReserveReply {
    /// Expired leases the call reclaimed.
    pub fn reclaimed(&self) -> Reclaimed {
        match self {
            ReserveReply::Allowed { reclaimed, .. }
            | ReserveReply::Denied { reclaimed, .. }
            | ReserveReply::Replayed { reclaimed, .. } => *reclaimed,
            _ => Reclaimed::default(),
        }
    }
}

/// Expired leases a reserve call reclaimed, per level: a lease lapsed without
/// Commit or Refund. One reservation holds a lease at every level with a
/// concurrency limit, so it counts once at each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed([u64; 3]);

impl Reclaimed {
    fn index(level: Level) -> usize {
        match level {
            Level::Global => 0,
            Level::Tenant => 1,
            Level::User => 2,
        }
    }

    /// Adds `n` leases reclaimed at `level`.
    pub fn add(&mut self, level: Level, n: u64) {
        self.0[Self::index(level)] += n;
    }

    /// Leases reclaimed at `level`.
    pub fn at(&self, level: Level) -> u64 {
        self.0[Self::index(level)]
    }
}

/// How a reservation was settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Committed with this token delta (actual - reserved).
    Committed(i64),
    /// Refunded these tokens.
    Refunded(u64),
}

/// The answer to Commit or Refund.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleReply {
    /// Settled now.
    Applied {
        /// How.
        settled: Settled,
        /// The service's raw prompt count the reservation was made with (0 when
        /// the caller counted).
        estimated_prompt_tokens: u64,
    },
    /// Settled before; nothing changed.
    AlreadySettled(Settled),
    /// No such reservation.
    NotFound,
}

/// The answer to RenewLease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewReply {
    /// The lease now lapses in this many milliseconds.
    Renewed {
        /// Milliseconds until the renewed lease lapses.
        expires_in_ms: u64,
    },
    /// The reservation was settled.
    AlreadySettled,
    /// The lease had lapsed; its slot stays released.
    Expired,
    /// No such reservation.
    NotFound,
}

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
