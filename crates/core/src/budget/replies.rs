//! What the budget operations answer: the replies both stores give, and how
//! long a store keeps settled and idempotent state.

use crate::checks::DeniedChecks;
use crate::{DimMap, Level, Readings};

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
    /// How long usage-ledger rows are kept; `None`: no ledger.
    pub ledger: Option<super::ledger::LedgerRetention>,
    /// The most threshold alerts one tenant's queue holds; 0: alert
    /// thresholds are not checked (a store in shadow).
    pub alert_queue: usize,
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
        /// Output tokens reserved: the most any level holds (less than the
        /// grant where every level holds the learned output).
        reserved_output: u64,
        /// Expired leases this call reclaimed (leases never settled).
        reclaimed: Reclaimed,
    },
    /// Refused; nothing changed.
    Denied {
        /// One per check, in plan order, before anything was taken.
        readings: Readings,
        /// The checks that denied.
        denied_mask: DeniedChecks,
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
pub struct Reclaimed([u64; 4]);

impl Reclaimed {
    /// The level's place in the packed form the reserve script returns:
    /// its count is bits `RECLAIM_BITS × index` up.
    pub fn index(level: Level) -> usize {
        match level {
            Level::Global => 0,
            Level::Tenant => 1,
            Level::User => 2,
            Level::Session => 3,
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
        /// The spend the reservation had reserved, µ$ (what a refund returns).
        reserved_spend: u64,
        /// The output tokens it had been granted (of its reserved tokens).
        reserved_output: u64,
        /// What it had declared in the dimensions the caller counts.
        reserved_declared: DimMap<u64>,
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
