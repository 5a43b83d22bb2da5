//! A replica's leased share of the global level, for a store whose global
//! level lives apart from the tenants' (a Redis Cluster: `store::cluster`).
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
//! Size: the share's arithmetic in one place (take, put back, settle, the
//! lease request and its reply), beside its unit tests.

use super::settle::Deltas;
use super::state::{LevelState, bucket_id};
use crate::domain::bucket::{Cost, to_milli};
use crate::domain::price::SpendRates;
use crate::domain::{BucketSpec, LevelPlan, Reading};
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
    /// The prompt at the input price (tokens × µ$ per million).
    pub sp: f64,
    /// The output price (µ$ per million).
    pub op: f64,
    /// The share of every limit to leave.
    pub headroom: f64,
}

impl Need {
    /// The cost with `output` output tokens granted.
    pub fn cost(&self, output: f64) -> Cost {
        let spend = self.rates().spend(output);
        Cost::reservation(self.prompt as u64, output as u64, spend as u64)
    }

    /// The spend rates of the prompt and the output.
    pub fn rates(&self) -> SpendRates {
        SpendRates {
            prompt: self.sp,
            output: self.op,
        }
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

/// One bucket of a sync: what to lease, what to give back.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketAsk {
    /// The bucket.
    pub spec: BucketSpec,
    /// How much to lease.
    pub want: f64,
    /// Given back (positive) or owed as debt (negative).
    pub give: f64,
}

/// One global entry of a sync.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryAsk {
    /// The entry's buckets.
    pub buckets: Vec<BucketAsk>,
    /// The concurrency limit; `None`: no slots.
    pub concurrency: Option<u64>,
    /// Slots to lease.
    pub want_slots: f64,
    /// Slots to give back.
    pub give_slots: f64,
    /// Until when (µs) Redis counts this replica's slots.
    pub slots_until: f64,
}

/// What the global key answered for one entry.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryGrant {
    /// Its state after the call.
    pub state: Option<LevelState>,
    /// Per bucket of the ask: what was leased.
    pub granted: Vec<f64>,
    /// What the key counts for this replica now.
    pub slots_mine: f64,
    /// What it counts for every replica.
    pub slots_in_use: f64,
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

/// Takes `need` from the shares of `entries` (the plan's global entries, one
/// share each) for the reservation whose lease field is `lease`, lapsing at
/// `lease_exp` (µs). On success returns what was taken and the lapsed slots
/// reclaimed; otherwise the checks that fell short (by index among the
/// entries' checks), each share marked with what it wanted.
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
            if let Some(r) = b.output_room(can, need.prompt, need.rates()) {
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

/// Moves the shares by a settlement's `deltas`: an overage is taken from
/// what is held, into debt if need be; a surplus or refund goes back to the
/// global key with the next sync (capped there at the limit, as on one
/// Redis), never spent here.
pub fn settle(entries: &[&LevelPlan], shares: &mut [&mut Share], deltas: Deltas, now: f64) {
    for (lp, share) in entries.iter().zip(shares.iter_mut()) {
        for b in &lp.buckets {
            let d = deltas.of(b.dimension);
            let held = share.held_mut(b, now);
            if d > 0.0 {
                held.amount -= d;
            } else if d < 0.0 {
                held.returns -= d;
            }
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

/// Frees the slot the reservation with lease field `lease` holds here.
/// False when this replica holds none for it (another replica leased it: a
/// message must tell that one).
pub fn release(share: &mut Share, lease: &str) -> bool {
    match share.slots.inflight.remove(lease) {
        Some(_) => {
            share.slots.free += 1.0;
            true
        }
        None => false,
    }
}

/// Moves the lapse of the slot the reservation `lease` holds here to `exp`
/// (µs; 0: released). False when this replica holds none for it.
pub fn renew(share: &mut Share, lease: &str, exp: f64) -> bool {
    if exp <= 0.0 {
        return release(share, lease);
    }
    match share.slots.inflight.get_mut(lease) {
        Some(e) => {
            *e = exp;
            true
        }
        None => false,
    }
}

impl Share {
    /// What a sync at `now` asks for this entry of `lp`: chunks to lease
    /// where a reservation found too little (or what is held runs low while
    /// in use), budget to give back or owe, slots to lease or give back.
    /// `None` when there is nothing to ask.
    /// With `renew`, an entry holding slots is asked for even with nothing
    /// to change (its slots' count renewed, the messages read).
    pub fn ask(&mut self, lp: &LevelPlan, now: f64, renew: bool) -> Option<EntryAsk> {
        let busy = now - self.used_at < HOLD_US;
        let mut any = false;
        let mut buckets = Vec::with_capacity(self.held.len());
        // Every bucket held, whichever model group's plan it came with.
        for i in 0..self.held.len() {
            let b = self.held[i].spec;
            let held = self.held_mut(&b, now);
            let limit = b.limit as f64;
            // No history yet: the reservation that wanted is the average.
            let avg = if held.avg_cost > 0.0 {
                held.avg_cost
            } else {
                held.wanted
            };
            // The rate since the last ask, smoothed.
            let elapsed = now - held.asked_at;
            if elapsed > 0.0 {
                held.rate = held.rate * 0.5 + 0.5 * held.spent / elapsed;
                held.spent = 0.0;
                held.asked_at = now;
            }
            let chunk = (avg * CHUNK_RESERVATIONS)
                .max(held.rate * CHUNK_US)
                .min(limit * MAX_SHARE)
                .max(held.wanted)
                .max(1.0);
            let mut give = 0.0;
            let mut want = 0.0;
            // Debt is paid at once; budget held too long, or idle, goes home.
            if held.amount < 0.0 || now >= held.until || !busy {
                give = held.amount;
            } else if held.amount > 2.0 * chunk {
                give = held.amount - chunk;
            }
            // Given back (or owed) as of now: reservations meanwhile see it gone.
            held.amount -= give;
            let left = held.amount.max(0.0);
            // Topped up before it runs dry while in use.
            if held.wanted > 0.0 || (busy && left < chunk / 2.0) {
                want = (chunk - left).max(held.wanted - left);
            }
            give += held.returns;
            held.returns = 0.0;
            if want > 0.0 || give != 0.0 {
                any = true;
            }
            buckets.push(BucketAsk {
                spec: b,
                want: want.max(0.0).ceil(),
                give,
            });
        }
        let (mut want_slots, mut give_slots) = (0.0, 0.0);
        let mut slots_until = 0.0;
        if let Some(limit) = lp.concurrency {
            self.reclaim(now);
            let chunk = (limit as f64 * MAX_SHARE).floor().max(1.0);
            let s = &mut self.slots;
            if s.wanted || (busy && s.free < (chunk / 4.0).max(1.0)) {
                want_slots = (chunk - s.free).max(1.0);
            } else if !busy && s.free > 0.0 {
                give_slots = s.free;
            } else if s.free > 2.0 * chunk {
                give_slots = s.free - chunk;
            }
            s.free -= give_slots;
            slots_until = s.until(now);
            // The global key counts this replica's slots under an expiry:
            // renewed at least every second while it holds any.
            let due = s.leased > 0.0 && (renew || now - s.sent_at >= 1e6);
            any |= want_slots > 0.0 || give_slots > 0.0 || due;
            if any {
                s.sent_at = now;
            }
        }
        any.then_some(EntryAsk {
            buckets,
            concurrency: lp.concurrency,
            want_slots,
            give_slots,
            slots_until,
        })
    }

    /// True when this share holds slots: it must sync now and then, to
    /// renew their count and read messages.
    pub fn holds_slots(&self) -> bool {
        self.slots.leased > 0.0
    }

    /// True when a reservation here holds one of its slots (another replica
    /// may send a message about it).
    pub fn has_inflight(&self) -> bool {
        !self.slots.inflight.is_empty()
    }

    /// After a sync that failed: budget given back stays gone (it may have
    /// reached the global key: never counted twice), debt is owed again (sent
    /// with the next sync), and slots are recounted by the next sync that
    /// succeeds.
    pub fn failed(&mut self, ask: &EntryAsk, now: f64) {
        for a in &ask.buckets {
            if a.give < 0.0 {
                self.held_mut(&a.spec, now).amount += a.give;
            }
        }
    }

    /// An ask that changes nothing but reads the global key (and renews this
    /// replica's slots): for a status read. Serves `lp` from now on.
    pub fn observe(&mut self, lp: &LevelPlan, now: f64) -> EntryAsk {
        self.plan.get_or_insert_with(|| lp.clone());
        for b in &lp.buckets {
            self.held_mut(b, now);
        }
        EntryAsk {
            buckets: self
                .held
                .iter()
                .map(|h| BucketAsk {
                    spec: h.spec,
                    want: 0.0,
                    give: 0.0,
                })
                .collect(),
            concurrency: lp.concurrency,
            want_slots: 0.0,
            give_slots: 0.0,
            slots_until: self.slots.until(now),
        }
    }

    /// Takes in what the global key answered to `ask`.
    pub fn apply(&mut self, ask: &EntryAsk, grant: &EntryGrant, now: f64) {
        for (a, got) in ask.buckets.iter().zip(&grant.granted) {
            let held = self.held_mut(&a.spec, now);
            held.amount += got;
            held.wanted = 0.0;
            if *got > 0.0 {
                held.until = now + HOLD_US;
            }
        }
        if ask.concurrency.is_some() {
            let s = &mut self.slots;
            s.wanted = false;
            // What Redis counts for this replica is the truth: what is not in
            // use of it is free (less, if a pause let Redis drop the count).
            s.leased = grant.slots_mine;
            s.free = grant.slots_mine - s.inflight.len() as f64;
            self.seen_in_use = grant.slots_in_use;
        }
        self.seen = grant.state.clone();
    }

    /// Readings of `lp` as this replica sees the global level: the key's
    /// level as last read plus what is held, and the slots in use.
    pub fn readings(&self, lp: &LevelPlan, now: f64, out: &mut Vec<Reading>) {
        for (hint, b) in lp.buckets.iter().enumerate() {
            let level = (self.seen_level(b, hint, now) + self.held_of(b)).min(b.limit as f64);
            out.push(Reading::Bucket {
                milli: to_milli(level),
            });
        }
        if lp.concurrency.is_some() {
            let active = (self.seen_in_use - self.slots.free.max(0.0)).max(0.0);
            let earliest = self
                .slots
                .inflight
                .values()
                .fold(f64::INFINITY, |m, e| m.min(*e));
            out.push(Reading::Concurrency {
                active: active as u64,
                earliest_expiry_ms: match earliest.is_finite() {
                    true => ((earliest - now) / 1000.0).ceil().max(0.0) as u64,
                    false => 0,
                },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Dimension, Level};

    fn global(requests: u64, concurrency: Option<u64>) -> LevelPlan {
        LevelPlan {
            level: Level::Global,
            group: None,
            slots: false,
            buckets: vec![BucketSpec {
                level: Level::Global,
                dimension: Dimension::Requests,
                limit: requests,
                period_secs: 3600,
                group: 0,
                window: None,
            }],
            concurrency,
        }
    }

    const NEED: Need = Need {
        prompt: 10.0,
        max_output: 5.0,
        min_output: 5.0,
        sp: 0.0,
        op: 0.0,
        headroom: 0.0,
    };

    /// Answers `ask` as a global key holding `level` requests would, leasing
    /// what it has; returns what is left.
    fn answer(share: &mut Share, lp: &LevelPlan, level: &mut f64, slots: &mut f64, now: f64) {
        let Some(ask) = share.ask(lp, now, false) else {
            return;
        };
        let b = &ask.buckets[0];
        *level = (*level + b.give).min(lp.buckets[0].limit as f64);
        let got = b.want.min(*level).max(0.0);
        *level -= got;
        let mine = share.slots.leased - ask.give_slots + ask.want_slots.min(*slots);
        *slots -= ask.want_slots.min(*slots) - ask.give_slots;
        let grant = EntryGrant {
            state: None,
            granted: vec![got],
            slots_mine: mine,
            slots_in_use: mine,
        };
        share.apply(&ask, &grant, now);
    }

    #[test]
    fn a_share_leases_chunks_and_never_spends_more_than_it_leased() {
        let lp = global(100, None);
        let mut share = Share::default();
        let mut level = 100.0;
        let mut granted = 0;
        for i in 0..200 {
            let now = i as f64;
            let lease = format!("#{i}");
            let try_take =
                |share: &mut Share| take(&[&lp], &mut [share], &NEED, &lease, 1e9, now).0;
            let mut result = try_take(&mut share);
            if result.is_err() {
                answer(&mut share, &lp, &mut level, &mut 0.0, now);
                result = try_take(&mut share);
            }
            if result.is_ok() {
                granted += 1;
            }
        }
        assert_eq!(granted, 100, "every unit of the limit, and no more");
        assert_eq!(level, 0.0);
    }

    #[test]
    fn a_denied_reservation_puts_back_what_it_took_and_unused_budget_goes_home() {
        let lp = global(1000, Some(4));
        let mut share = Share::default();
        let (mut level, mut slots) = (1000.0, 4.0);
        assert!(
            take(&[&lp], &mut [&mut share], &NEED, "#a", 1e9, 0.0)
                .0
                .is_err()
        );
        answer(&mut share, &lp, &mut level, &mut slots, 0.0);
        assert_eq!(
            level,
            1000.0 - 32.0,
            "a chunk is 32 reservations, under 5% of the limit"
        );
        assert_eq!(slots, 3.0, "5% of 4 slots is at least one");
        let taken = take(&[&lp], &mut [&mut share], &NEED, "#a", 1e9, 1.0)
            .0
            .unwrap();
        put_back(&[&lp], &mut [&mut share], &taken, &NEED, None, 1.0);
        assert_eq!(share.held_of(&lp.buckets[0]), 32.0);
        assert_eq!(share.slots.free, 1.0);
        // Idle past the hold: everything goes back.
        answer(&mut share, &lp, &mut level, &mut slots, 1.0 + HOLD_US);
        assert_eq!((level, slots), (1000.0, 4.0));
    }

    #[test]
    fn a_slot_is_freed_once_whichever_way_it_comes_back() {
        let lp = global(1000, Some(10));
        let mut share = Share::default();
        let (mut level, mut slots) = (1000.0, 10.0);
        let _ = take(&[&lp], &mut [&mut share], &NEED, "#a", 5e6, 0.0);
        answer(&mut share, &lp, &mut level, &mut slots, 0.0);
        take(&[&lp], &mut [&mut share], &NEED, "#a", 5e6, 0.0)
            .0
            .unwrap();
        let free = share.slots.free;
        assert!(release(&mut share, "#a"));
        assert!(!release(&mut share, "#a"), "a second release frees nothing");
        assert!(!renew(&mut share, "#a", 0.0));
        assert_eq!(share.slots.free, free + 1.0);
        take(&[&lp], &mut [&mut share], &NEED, "#b", 5e6, 0.0)
            .0
            .unwrap();
        assert_eq!(share.reclaim(5e6 + SLOT_GRACE_US), 1, "lapsed after grace");
        assert!(!release(&mut share, "#b"));
    }

    #[test]
    fn an_overage_is_owed_and_a_refund_goes_home_unspent() {
        let lp = global(1000, None);
        let mut share = Share::default();
        let deltas = Deltas {
            dtok: 0.0,
            dreq: -1.0,
            din: 0.0,
            dout: 0.0,
            dspend: 0.0,
        };
        settle(&[&lp], &mut [&mut share], deltas, 0.0);
        assert_eq!(
            share.held_of(&lp.buckets[0]),
            0.0,
            "a refund is not spent here"
        );
        let ask = share.ask(&lp, 0.0, false).unwrap();
        assert_eq!(
            ask.buckets[0].give, 1.0,
            "it goes to the global key, capped there"
        );
        let owed = Deltas {
            dreq: 3.0,
            ..deltas
        };
        settle(&[&lp], &mut [&mut share], owed, 0.0);
        let ask = share.ask(&lp, 0.0, false).unwrap();
        assert_eq!(ask.buckets[0].give, -3.0, "the debt goes to the global key");
    }

    #[test]
    fn held_slots_renew_their_count_every_second_while_steady() {
        let lp = global(1000, Some(100));
        let mut share = Share::default();
        let (mut level, mut slots) = (1000.0, 100.0);
        let _ = take(&[&lp], &mut [&mut share], &NEED, "#a", 60e6, 0.0);
        answer(&mut share, &lp, &mut level, &mut slots, 0.0);
        take(&[&lp], &mut [&mut share], &NEED, "#a", 60e6, 0.0)
            .0
            .unwrap();
        // Steady: slots in use, some free, buckets topped up: nothing to change.
        share.ask(&lp, 1.0, false);
        assert!(
            share
                .ask(&lp, 2.0, false)
                .is_none_or(|a| a.want_slots == 0.0)
        );
        let ask = share.ask(&lp, 1.1e6, false).expect("the count is renewed");
        assert!(
            ask.slots_until >= 60e6 + SLOT_GRACE_US,
            "past the longest lease"
        );
    }
}
