//! Renew: extend (or shorten) a live reservation's concurrency lease
//! (`crates/store/lua/renew.lua` is its Redis port). A lapsed lease is not re-taken: its
//! slot stays released.

use super::level::{Lease, StoredLevel};
use super::record::{Record, RecordState};
use super::replies::{RenewReply, Retention};
use crate::LevelPlan;
use crate::layout::MAX_TTL_US;

/// Renews the lease of the reservation whose record is `record` (`None`: not
/// found) for the caller whose owner tag is `owner`, to `ttl_ms` from
/// `now_us`. Returns the answer and, when renewed, the record to keep and for
/// how long (ms).
#[allow(clippy::too_many_arguments)]
pub fn renew(
    now_us: i64,
    owner: u64,
    record: Option<&Record>,
    plan: &[LevelPlan],
    levels: &mut [Option<StoredLevel>],
    lease: Lease,
    ttl_ms: u64,
    retention: &Retention,
) -> (RenewReply, Option<(Record, u64)>) {
    let Some(rec) = record.filter(|r| r.owner == owner) else {
        return (RenewReply::NotFound, None);
    };
    let now = now_us as f64;
    if rec.state != RecordState::Reserved {
        return (RenewReply::AlreadySettled, None);
    }
    if rec.lease_expires_us <= now {
        return (RenewReply::Expired, None);
    }
    let ttl = ttl_ms as f64 * 1000.0;
    let exp = now + ttl;
    for (lp, stored) in plan.iter().zip(levels.iter_mut()) {
        if rec.mask & lp.bit() != 0
            && let Some(stored) = stored.as_mut()
            && let Some(held) = stored.leases.get_mut(&lease)
        {
            *held = exp;
            // A shorter lease may now be the earliest to lapse.
            if stored.state.e == 0.0 || exp < stored.state.e {
                stored.state.e = exp;
            }
            stored.outlive(now_us, ttl.min(MAX_TTL_US));
        }
    }
    let renewed = Record {
        lease_expires_us: exp,
        ..rec.clone()
    };
    (
        RenewReply::Renewed {
            expires_in_ms: ttl_ms,
        },
        Some((renewed, ttl_ms + retention.record_ms)),
    )
}
