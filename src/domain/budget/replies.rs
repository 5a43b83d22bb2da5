//! What the budget operations answer: the replies both stores give, and how
//! long a store keeps settled and idempotent state.

use crate::domain::{Level, Readings};

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
}

/// Which checks of a plan denied (check i: the i-th bucket or concurrency
/// limit in plan order). Room for [`DeniedChecks::MAX`]: a plan has at most 3
/// levels × (5 rate kinds × 2 × 8 rates + 1) + 3 group slot limits = 246
/// checks (tier.rs caps rates per kind at 8). A mask of one number held 53
/// exact bits in Lua: a plan with more checks lost denials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeniedChecks([u64; 4]);

impl DeniedChecks {
    /// The most checks a mask holds.
    pub const MAX: usize = 256;

    /// Marks check `i` denied.
    pub fn insert(&mut self, i: usize) {
        debug_assert!(i < Self::MAX, "check {i} of at most {}", Self::MAX);
        if let Some(w) = self.0.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    /// Whether check `i` denied.
    pub fn contains(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// No check denied.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    /// reserve.lua's mask: 8 little-endian doubles of 32 bits each, the
    /// first holding checks 0–31. `None` when it is not one.
    pub fn from_script(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 64 {
            return None;
        }
        let mut out = DeniedChecks::default();
        for (k, chunk) in bytes.chunks_exact(8).enumerate() {
            let word = f64::from_le_bytes(chunk.try_into().ok()?);
            if !(0.0..=u32::MAX as f64).contains(&word) || word.fract() != 0.0 {
                return None;
            }
            out.0[k / 2] |= (word as u64) << (32 * (k % 2));
        }
        Some(out)
    }
}

/// Checks 0–63 as the bits of `mask`.
impl From<u64> for DeniedChecks {
    fn from(mask: u64) -> Self {
        DeniedChecks([mask, 0, 0, 0])
    }
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
pub struct Reclaimed([u64; 3]);

impl Reclaimed {
    /// The level's place in the packed form the reserve script returns:
    /// its count is bits `RECLAIM_BITS × index` up.
    pub fn index(level: Level) -> usize {
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
        /// The spend the reservation had reserved, µ$ (what a refund returns).
        reserved_spend: u64,
        /// The output tokens it had been granted (of its reserved tokens).
        reserved_output: u64,
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

#[cfg(test)]
mod tests {
    use super::DeniedChecks;

    #[test]
    fn denied_checks_past_53_keep_every_bit_from_the_script() {
        // Checks 3, 57 and 245 denied, as reserve.lua packs them.
        let words: [f64; 8] = [8.0, 2f64.powi(25), 0.0, 0.0, 0.0, 0.0, 0.0, 2f64.powi(21)];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mask = DeniedChecks::from_script(&bytes).expect("a mask");
        let denied: Vec<usize> = (0..DeniedChecks::MAX)
            .filter(|&i| mask.contains(i))
            .collect();
        assert_eq!(denied, [3, 57, 245]);
        let mut built = DeniedChecks::default();
        [3, 57, 245].into_iter().for_each(|i| built.insert(i));
        assert_eq!(built, mask);
        assert_eq!(DeniedChecks::from_script(&bytes[..56]), None);
    }
}
