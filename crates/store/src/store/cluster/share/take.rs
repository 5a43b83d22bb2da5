//! Taking a global cost from the shares, and putting it back: a
//! reservation's (its output grant decided as the global level can hold it)
//! and a charge's. Each is all or nothing across the plan's global entries;
//! what falls short is named, and each share marked with what it wanted,
//! so the next sync leases enough.

use super::{Need, Share, Taken};
use crate::domain::{BucketSpec, LevelPlan};

/// Takes `need` from the shares of `entries` (the plan's global entries, one
/// share each) for the reservation whose lease field is `lease`, lapsing at
/// `lease_exp` (µs). On success returns what was taken and the lapsed slots
/// reclaimed; otherwise the checks that fell short (by index among the
/// entries' checks), each share marked with what it wanted.
#[expect(
    clippy::too_many_lines,
    reason = "room, checks and the take share one pass's state, as reserve.rs does"
)]
pub fn take(
    entries: &[&LevelPlan],
    shares: &mut [&mut Share],
    need: &Need,
    lease: &str,
    lease_exp: f64,
    now: f64,
) -> (Result<Taken, Vec<usize>>, u64) {
    let mut reclaimed = 0;
    // The output the global level can grant: as much as every bucket holds.
    let mut room = need.max_output;
    for (lp, share) in entries.iter().zip(shares.iter_mut()) {
        // Cloned only when the plan changed: not per reservation.
        if share.plan.as_ref() != Some(*lp) {
            share.plan = Some((*lp).clone());
        }
        share.used_at = now;
        let lapsed = share.reclaim(now);
        // As reserve counts them: a group's slots only where the level has
        // no concurrency limit of its own (see `reserve::counts_reclaims`).
        let main_counts = entries.iter().any(|o| !o.slots && o.concurrency.is_some());
        if !lp.slots || !main_counts {
            reclaimed += lapsed;
        }
        for (hint, b) in lp.buckets.iter().enumerate() {
            share.held_mut(b, now);
            let can = share.spendable(b, hint, need.headroom, now);
            if let Some(r) = b.output_room(can, need.prompt, need.rates) {
                room = room.min(r);
            }
        }
    }
    let grant = room.floor().max(need.min_output).min(need.max_output);
    let cost = need.cost(grant);
    let mut short = Vec::new();
    let mut check = 0;
    for (lp, share) in entries.iter().zip(shares.iter_mut()) {
        for (hint, b) in lp.buckets.iter().enumerate() {
            let c = b.cost(cost) as f64;
            if share.spendable(b, hint, need.headroom, now) < c {
                short.push(check);
                let at_max = b.cost(need.cost(need.max_output)) as f64;
                let held = share.held_mut(b, now);
                held.wanted = held.wanted.max(at_max);
            }
            check += 1;
        }
        if let Some(limit) = lp.concurrency {
            let floor = need.headroom * limit as f64;
            let in_use = share.seen_in_use - share.slots.free.max(0.0);
            if share.slots.free < 1.0 || in_use + 1.0 > limit as f64 - floor {
                short.push(check);
                share.slots.wanted = true;
            }
            check += 1;
        }
    }
    if !short.is_empty() {
        return (Err(short), reclaimed);
    }
    let mut taken = Taken {
        grant,
        amounts: Vec::with_capacity(entries.len()),
        slots: Vec::with_capacity(entries.len()),
        at: now,
    };
    for (lp, share) in entries.iter().zip(shares.iter_mut()) {
        let mut amounts = Vec::with_capacity(lp.buckets.len());
        for b in &lp.buckets {
            let c = b.cost(cost) as f64;
            let held = share.held_mut(b, now);
            held.amount -= c;
            held.spent += c;
            held.avg_cost = match held.avg_cost {
                0.0 => c,
                avg => avg * 0.9 + c * 0.1,
            };
            amounts.push(c);
        }
        taken.amounts.push(amounts);
        taken.slots.push(lp.concurrency.map(|_| {
            share.slots.free -= 1.0;
            share.slots.inflight.insert(lease.to_owned(), lease_exp);
            lease.to_owned()
        }));
    }
    (Ok(taken), reclaimed)
}

/// Puts back what `taken` took beyond a grant of `granted` output tokens
/// (`None`: all of it, slot included: the reservation was not made).
pub fn put_back(
    entries: &[&LevelPlan],
    shares: &mut [&mut Share],
    taken: &Taken,
    need: &Need,
    granted: Option<f64>,
    now: f64,
) {
    let kept = granted.map(|g| need.cost(g));
    for (i, (lp, share)) in entries.iter().zip(shares.iter_mut()).enumerate() {
        for (k, b) in lp.buckets.iter().enumerate() {
            let took = taken.amounts[i][k];
            let keep = kept.map_or(0.0, |c| b.cost(c) as f64);
            // Taken in a window that has ended: that budget ended with it.
            let same_window = b
                .window
                .is_none_or(|w| w.span.at(taken.at).1 == w.span.at(now).1);
            if same_window {
                share.held_mut(b, now).amount += took - keep;
            }
        }
        if granted.is_none()
            && let Some(lease) = &taken.slots[i]
            && share.slots.inflight.remove(lease).is_some()
        {
            share.slots.free += 1.0;
        }
    }
}

/// Takes a charge from the shares: `cost(bucket)` from every bucket.
/// Enforced, every bucket must hold its cost and at least one unit, else
/// nothing is taken and the buckets short are returned (by index among the
/// entries' buckets, each share marked with what it wanted); forced, it is
/// taken into debt. Returns what each bucket gave.
pub fn charge(
    entries: &[&LevelPlan],
    shares: &mut [&mut Share],
    cost: impl Fn(&BucketSpec) -> f64,
    enforce: bool,
    now: f64,
) -> Result<Vec<Vec<f64>>, Vec<usize>> {
    let mut short = Vec::new();
    let mut i = 0;
    for (lp, share) in entries.iter().zip(shares.iter_mut()) {
        // Cloned only when the plan changed: not per reservation.
        if share.plan.as_ref() != Some(*lp) {
            share.plan = Some((*lp).clone());
        }
        share.used_at = now;
        for b in &lp.buckets {
            let c = cost(b);
            let held = share.held_mut(b, now);
            if enforce && held.amount < c.max(1.0) {
                held.wanted = held.wanted.max(c.max(1.0));
                short.push(i);
            }
            i += 1;
        }
    }
    if !short.is_empty() {
        return Err(short);
    }
    Ok(entries
        .iter()
        .zip(shares.iter_mut())
        .map(|(lp, share)| {
            lp.buckets
                .iter()
                .map(|b| {
                    let c = cost(b);
                    let held = share.held_mut(b, now);
                    held.amount -= c;
                    held.spent += c;
                    if c > 0.0 {
                        held.avg_cost = match held.avg_cost {
                            0.0 => c,
                            avg => avg * 0.9 + c * 0.1,
                        };
                    }
                    c
                })
                .collect()
        })
        .collect())
}

/// Puts back what [`charge`] took (the tenant level denied).
pub fn uncharge(entries: &[&LevelPlan], shares: &mut [&mut Share], took: &[Vec<f64>], now: f64) {
    for ((lp, share), amounts) in entries.iter().zip(shares.iter_mut()).zip(took) {
        for (b, c) in lp.buckets.iter().zip(amounts) {
            share.held_mut(b, now).amount += c;
        }
    }
}
