//! A replica's leased share of the global level, for a store whose global
//! level lives apart from the tenants' (a Redis Cluster: [`super::ClusterStore`]).
//!
//! A reservation must not touch one shared key per request, and the global
//! limits must never be overspent. So each replica leases chunks of every
//! global bucket (and some concurrency slots) from the global key in one
//! rare call (`lua/global_lease.lua`) and spends them here, in memory, beside
//! the tenant-slot script's decision:
//!
//! - **Taking.** A reservation takes its global cost from the chunks held
//!   (a bucket's cost as [`BucketSpec::cost`] says; one slot) before the
//!   tenant script runs, and puts it back if the tenant level denies: all or
//!   nothing as the caller sees it. A bucket with a headroom floor also
//!   checks the global level as last read plus what is held.
//! - **Chunks.** A chunk is what 32 reservations of the recent average cost
//!   take or what a second of the recent spending takes, whichever is more,
//!   at least one reservation's cost, and at most [`MAX_SHARE`] of the limit:
//!   chunks grow with traffic and stay small against a small limit. A share
//!   in use is topped up when half a chunk is left.
//!   Redis gives what it has down to the floor, so the last units of a
//!   limit are leased too.
//! - **Returning.** Budget held longer than [`HOLD_US`] goes back to the
//!   global key (and refills nothing: a chunk taken was counted as spent
//!   when it was taken); budget of a calendar window that ended is dropped;
//!   an overage a commit charges beyond what is held goes to the global key
//!   as debt with the next call.
//! - **Slots.** A slot is freed only by the replica that leased it, exactly
//!   once: when the reservation settles there, when another replica's
//!   message says it settled (or renewed) elsewhere, or when its lease
//!   lapses. Redis counts each replica's slots under an expiry that outlives
//!   its reservations' leases, so a dead replica's slots come back on their
//!   own.
//!
//! The price: a replica holds at most [`MAX_SHARE`] of each limit unspent,
//! so a denial may leave up to that much per other replica unused until it
//! is returned (within [`HOLD_US`]); a slot settled on another replica
//! frees a sync later (at most [`SYNC_US`] twice).
//!
//! This file owns the share's state: what is held of each bucket, the
//! slots, and the reads every operation makes of them. The rest, by job:
//! - `take`: a reservation's or charge's global cost taken, and put back.
//! - `settle`: a settlement's deltas, and a reservation's slot freed or renewed.
//! - `lease`: the sync with the global key — what to ask, what the answer
//!   changes — and the readings this replica reports.
//!
//! The asks and answers themselves ([`EntryAsk`](crate::store::redis::EntryAsk),
//! [`EntryGrant`](crate::store::redis::EntryGrant)) are the
//! contract of `lua/global_lease.lua`, so they live with its call
//! (`store/redis/lease.rs`). The differential test
//! (`tests/store/differential/share.rs`) holds this arithmetic to the
//! memory store's.

mod lease;
mod settle;
mod take;
#[cfg(test)]
mod tests;

pub use settle::{deltas, release, renew, settle};
pub use take::{charge, put_back, take, uncharge};

use crate::domain::bucket::Cost;
use crate::domain::budget::reserve::spend_rates;
use crate::domain::budget::state::{LevelState, bucket_id};
use crate::domain::price::SpendRates;
use crate::domain::{BucketSpec, LevelPlan, ReservePlan};
use std::collections::HashMap;

/// The most of a limit one replica holds unspent.
pub const MAX_SHARE: f64 = 0.05;
/// A chunk covers at least this many reservations of the recent average cost.
pub const CHUNK_RESERVATIONS: f64 = 32.0;
/// ... and at least this long (µs) of the recent spending rate.
pub const CHUNK_US: f64 = 1_000_000.0;
/// Budget held this long (µs) unspent goes back to the global key.
pub const HOLD_US: f64 = 2_000_000.0;
/// How often (µs) a replica syncs with the global key when it has something
/// to return, to renew, or messages to read.
pub const SYNC_US: f64 = 100_000.0;
/// How long past its lease (µs) a slot of a reservation stays counted here:
/// the margin for a settle or renewal message from another replica.
pub const SLOT_GRACE_US: f64 = 2_000_000.0;
/// Redis counts a replica's slots this long (µs) past its last call, or past
/// its longest live lease.
pub const SLOTS_TTL_US: f64 = 10_000_000.0;

/// What one reservation asks of the global level.
#[derive(Clone, Copy, Debug)]
pub struct Need {
    /// Prompt tokens.
    pub prompt: f64,
    /// Output tokens wanted.
    pub max_output: f64,
    /// The fewest output tokens accepted.
    pub min_output: f64,
    /// What the prompt and the output cost.
    pub rates: SpendRates,
    /// The share of every limit to leave.
    pub headroom: f64,
    /// What the call declared in the dimensions the caller counts.
    pub declared: crate::domain::DimMap<u64>,
}

impl Need {
    /// What `plan` asks of the global level.
    pub fn of(plan: &ReservePlan) -> Self {
        Need {
            prompt: plan.prompt_tokens as f64,
            max_output: plan.max_output_tokens as f64,
            min_output: plan.min_output_tokens as f64,
            rates: spend_rates(plan),
            headroom: plan.headroom,
            declared: plan.declared,
        }
    }

    /// The cost with `output` output tokens granted.
    pub fn cost(&self, output: f64) -> Cost {
        let spend = self.rates.spend(output);
        Cost::reservation(
            self.prompt as u64,
            output as u64,
            spend as u64,
            &self.declared,
        )
    }
}

/// Budget of one global bucket held here.
#[derive(Clone, Debug)]
struct Held {
    id: f64,
    /// The bucket as last planned (a key's buckets come from the plans of
    /// every model group: each sync asks for all of them).
    spec: BucketSpec,
    /// Refunds and surpluses to give back with the next sync: never spent
    /// here, so the global key caps them at its limit, as one Redis does.
    returns: f64,
    /// What may be spent (negative: an overage owed to the global key).
    amount: f64,
    /// When what is held goes back (µs).
    until: f64,
    /// The end of the calendar window it was leased in (0: a rolling bucket).
    window_end: f64,
    /// The recent average cost of a reservation here.
    avg_cost: f64,
    /// The most a reservation that found too little asked for.
    wanted: f64,
    /// Spent since the last ask.
    spent: f64,
    /// The recent spending rate (per µs), as of the last ask.
    rate: f64,
    /// When the last ask was made (µs).
    asked_at: f64,
}

impl Slots {
    /// Until when the global key must count this replica's slots: past its
    /// longest live lease and the grace, and a while past now.
    fn until(&self, now: f64) -> f64 {
        let longest = self.inflight.values().fold(0.0f64, |m, e| m.max(*e));
        (longest + SLOT_GRACE_US).max(now + SLOTS_TTL_US)
    }
}

/// This replica's concurrency slots of one global entry.
#[derive(Clone, Debug, Default)]
struct Slots {
    /// What the global key counts for this replica.
    leased: f64,
    /// Leased and not in use.
    free: f64,
    /// Reservations holding one, by lease field, with their lease expiry.
    inflight: HashMap<String, f64>,
    /// A reservation found none free since the last sync.
    wanted: bool,
    /// When an ask last sent their count's expiry (µs).
    sent_at: f64,
}

/// One global entry's share (the level's buckets, or a model group's slots).
#[derive(Clone, Debug, Default)]
pub struct Share {
    /// The entry as last planned: what background syncs lease for.
    plan: Option<LevelPlan>,
    held: Vec<Held>,
    slots: Slots,
    /// The global key's state as the last sync left it.
    seen: Option<LevelState>,
    /// Slots every replica holds, as the last sync counted.
    seen_in_use: f64,
    /// Last time a reservation used this share (µs).
    used_at: f64,
}

/// What a reservation took from the shares, to put back if the tenant level
/// denies (or to trim once the grant is known).
#[derive(Clone, Debug, Default)]
pub struct Taken {
    /// Output tokens the global level can grant (the tenant may grant less).
    pub grant: f64,
    /// Per entry, per bucket: what was taken.
    amounts: Vec<Vec<f64>>,
    /// Per entry: the lease field of the slot taken, if any.
    slots: Vec<Option<String>>,
    /// When it was taken (µs).
    at: f64,
}

impl Share {
    /// The plan this share last served.
    pub fn plan(&self) -> Option<&LevelPlan> {
        self.plan.as_ref()
    }

    /// What is held of `b`, made if new. A calendar window's budget ends
    /// with it (debt too: the next window starts full), so a share never
    /// spends one window's chunk in the next.
    fn held_mut(&mut self, b: &BucketSpec, now: f64) -> &mut Held {
        let id = bucket_id(b);
        let window_end = b.window.map_or(0.0, |w| w.span.at(now).1);
        let i = match self.held.iter().position(|h| h.id == id) {
            Some(i) => i,
            None => {
                self.held.push(Held {
                    id,
                    spec: *b,
                    returns: 0.0,
                    amount: 0.0,
                    until: now + HOLD_US,
                    window_end,
                    avg_cost: 0.0,
                    wanted: 0.0,
                    spent: 0.0,
                    rate: 0.0,
                    asked_at: now,
                });
                self.held.len() - 1
            }
        };
        let held = &mut self.held[i];
        held.spec = *b;
        // Only forward: a caller with an older instant changes nothing.
        if window_end > held.window_end {
            held.amount = 0.0;
            held.returns = 0.0;
            held.window_end = window_end;
        }
        held
    }

    fn held_of(&self, b: &BucketSpec) -> f64 {
        let id = bucket_id(b);
        self.held
            .iter()
            .find(|h| h.id == id)
            .map_or(0.0, |h| h.amount)
    }

    /// The global key's level of `b` as last read, refilled to `now`.
    fn seen_level(&self, b: &BucketSpec, hint: usize, now: f64) -> f64 {
        self.seen
            .as_ref()
            .map_or(b.limit as f64, |s| s.level_at(b, hint, now))
    }

    /// What a reservation with `headroom` may spend of `b`: what is held,
    /// and no more than keeps the global level (as last read, plus what is
    /// held) at its floor.
    fn spendable(&self, b: &BucketSpec, hint: usize, headroom: f64, now: f64) -> f64 {
        let held = self.held_of(b);
        if headroom <= 0.0 {
            return held;
        }
        held.min(self.seen_level(b, hint, now) + held - b.floor(headroom))
    }

    /// Lapsed leases' slots back to free (none is settled after its lease
    /// and grace: another replica's late settle sends a message no one
    /// matches). Returns how many.
    fn reclaim(&mut self, now: f64) -> u64 {
        let before = self.slots.inflight.len();
        self.slots
            .inflight
            .retain(|_, exp| *exp + SLOT_GRACE_US > now);
        let lapsed = before - self.slots.inflight.len();
        self.slots.free += lapsed as f64;
        lapsed as u64
    }
}
