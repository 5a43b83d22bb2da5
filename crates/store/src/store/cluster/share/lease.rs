//! The share's side of a sync with the global key (`lua/global_lease.lua`):
//! what to ask for each entry (chunks to lease, budget to give back or owe,
//! slots), what the answer changes, what a failed sync leaves — and the
//! readings this replica reports of the global level (the key as last read
//! plus what is held).

use super::{CHUNK_RESERVATIONS, CHUNK_US, HOLD_US, MAX_SHARE, Share};
use crate::domain::bucket::to_milli;
use crate::domain::{LevelPlan, Reading};
use crate::store::redis::{BucketAsk, EntryAsk, EntryGrant};

impl Share {
    /// What a sync at `now` asks for this entry of `lp`: chunks to lease
    /// where a reservation found too little (or what is held runs low while
    /// in use), budget to give back or owe, slots to lease or give back.
    /// `None` when there is nothing to ask.
    /// With `renew`, an entry holding slots is asked for even with nothing
    /// to change (its slots' count renewed, the messages read).
    #[expect(
        clippy::too_many_lines,
        reason = "one pass over the buckets and slots builds the ask"
    )]
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
