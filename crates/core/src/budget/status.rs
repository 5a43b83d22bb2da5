//! Status: read the budgets of some levels without changing anything
//! (`crates/store/lua/status.lua` is its Redis port). Lapsed leases are counted out but
//! not reclaimed.

use super::level::StoredLevel;
use super::state;
use crate::layout::EXACT_LEASES;
use crate::{LevelPlan, Readings};

/// Readings of `plan`'s levels at `now_us` from what the store holds (one
/// entry per level). A level's leases are counted whole when `exact` and it
/// holds at most [`EXACT_LEASES`], or once its stored (lower-bound) earliest
/// expiry has passed; otherwise the stored count and bound are read.
pub fn status(
    now_us: i64,
    plan: &[LevelPlan],
    levels: &[Option<&StoredLevel>],
    exact: bool,
) -> Readings {
    let now = now_us as f64;
    let mut states = Vec::with_capacity(plan.len());
    let mut leases = Vec::with_capacity(plan.len());
    for (lp, stored) in plan.iter().zip(levels) {
        let live = stored
            .filter(|l| {
                let s = &l.state;
                lp.concurrency.is_some()
                    && s.n > 0.0
                    && ((exact && s.n <= EXACT_LEASES as f64) || (s.e > 0.0 && now >= s.e))
            })
            .map(|l| l.live_leases(now));
        states.push(stored.map(|l| l.state.clone()));
        leases.push(live);
    }
    state::readings(plan, &states, &leases, now)
}
