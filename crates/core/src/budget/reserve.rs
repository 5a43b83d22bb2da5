//! Reserve: take one request, the prompt and output tokens and a concurrency
//! lease at every level, all or nothing (`crates/store/lua/reserve.lua` is its Redis port).
//!
//! Everything is read and checked before anything is written: only lapsed
//! leases are reclaimed early, which changes no outcome. Output tokens are
//! granted as many as every token and output-token bucket can hold, up to the
//! max; fewer than the min is a denial (min = max: all or nothing).
//!
//! What each bucket takes: requests 1, tokens prompt + output, input tokens
//! the prompt, output tokens the output. With headroom `h` (the request's
//! priority), a bucket denies unless it keeps `h × limit` after the cost, and
//! a concurrency limit unless `n + 1 ≤ limit − h × limit`.
//!
//! Size: the one reserve algorithm, kept whole so it reads beside
//! `crates/store/lua/reserve.lua` step for step, and its unit tests.

use super::alerts;
use super::ledger::{self, Entry};
use super::level::{Lease, StoredLevel};
use super::record::{LearnedOutput, Record, RecordState};
use super::replies::{Reclaimed, ReserveReply, Retention};
use super::state::{self, BucketState, LevelState, bucket_id, ceil_ms};
use crate::alert::Crossing;
use crate::bucket::Cost;
use crate::checks::DeniedChecks;
use crate::layout::{MAX_FOREIGN, MAX_TTL_US, RECLAIM_CAP};
use crate::price::SpendRates;
use crate::{LevelPlan, ReservePlan};

/// An earlier reservation under the request's idempotency key.
#[derive(Clone, Copy, Debug)]
pub struct Earlier<'a> {
    /// Its nonce, as the idempotency entry holds it.
    pub nonce: &'a str,
    /// Its record.
    pub record: &'a Record,
}

/// What a reserve decided, and what the store must keep.
#[derive(Debug)]
pub struct Reserved {
    /// The answer.
    pub reply: ReserveReply,
    /// The new reservation's record and how long to keep it (ms), when taken.
    pub record: Option<(Record, u64)>,
    /// How long to keep the idempotency entry → this nonce (ms), when taken
    /// under a key.
    pub idempotency_ms: Option<u64>,
    /// What the new reservation adds to the usage ledger, when taken with
    /// the ledger on.
    pub ledger: Option<Entry>,
    /// The alert thresholds it crossed, when taken (`super::alerts`).
    pub crossings: Vec<Crossing>,
}

impl Reserved {
    fn only(reply: ReserveReply) -> Self {
        Reserved {
            reply,
            record: None,
            idempotency_ms: None,
            ledger: None,
            crossings: Vec::new(),
        }
    }
}

/// Each level as read: the working copy of its state this call writes (the
/// levels themselves stay as they were, reclaiming aside, until everything
/// fits), with every bucket's level now.
struct Read {
    after: Vec<LevelState>,
    /// Per bucket in plan order: its index in the working state, its level now.
    buckets: Vec<(usize, f64)>,
    /// Output tokens every token bucket can hold besides the prompt.
    room: f64,
    /// Per level: its overrun credit now, where it holds the learned output
    /// (empty, never allocated, without a learned output).
    credits: Vec<Option<f64>>,
    reclaimed: Reclaimed,
}

/// Reserves `plan` at `now_us` on `levels` (one per plan level, `None` where
/// the store holds nothing). `lease` names this reservation's lease field.
pub fn reserve(
    now_us: i64,
    plan: &ReservePlan,
    earlier: Option<Earlier<'_>>,
    levels: &mut [Option<StoredLevel>],
    lease: Lease,
    retention: &Retention,
) -> Reserved {
    let now = now_us as f64;
    let replay = match earlier.map(|e| replay_of(plan, e, now)).transpose() {
        Ok(replay) => replay,
        Err(reply) => return Reserved::only(reply),
    };
    let mut read = read_levels(plan, levels, now);
    // The output to grant: all of it, or as much as fits, never below the min.
    let grant = read.room.floor().max(plan.min_output_tokens as f64);
    let held = Held::of(plan, &read.credits, grant);
    let mut crossings = Vec::new();
    let (denied, ttls) = check(plan, &mut read, &held, now, &mut crossings);
    let reclaimed = read.reclaimed;
    let readings = |levels: &[Option<StoredLevel>]| {
        state::readings_of(&plan.levels, |i| Some(&levels[i].as_ref()?.state), &[], now)
    };
    if let Some((nonce, tokens, lease_expires_in_ms)) = replay {
        return Reserved::only(ReserveReply::Replayed {
            nonce,
            tokens,
            lease_expires_in_ms,
            readings: readings(levels),
            reclaimed,
        });
    }
    if !denied.is_empty() {
        return Reserved::only(ReserveReply::Denied {
            readings: readings(levels),
            denied_mask: denied,
            reclaimed,
        });
    }
    let exp = take(plan, levels, read.after, ttls, now_us, lease);
    take_credits(levels, &read.credits, &held, grant, now);
    let mut record = new_record(plan, grant, exp, retention.ledger.map_or(0.0, |_| now));
    record.learned = held.learned(plan);
    let ledger = retention.ledger.map(|_| ledger::reserved(now, record.cost));
    Reserved {
        reply: ReserveReply::Allowed {
            readings: readings(levels),
            granted_output: grant as u64,
            reserved_output: held.largest(plan) as u64,
            reclaimed,
        },
        record: Some((record, plan.lease_ttl_ms + retention.record_ms)),
        idempotency_ms: plan
            .idempotency_key
            .as_ref()
            .map(|_| retention.idempotency_ms),
        ledger,
        crossings,
    }
}

/// The record of a reservation just taken with `grant` output tokens and a
/// lease lapsing at `exp`, in the ledger since `ledger_at` (0: not).
fn new_record(plan: &ReservePlan, grant: f64, exp: f64, ledger_at: f64) -> Record {
    Record {
        state: RecordState::Reserved,
        cost: plan.prompt_tokens as f64 + grant,
        lease_expires_us: exp,
        mask: plan.lease_mask(),
        owner: plan.id.owner_tag(),
        fingerprint: plan.fingerprint,
        amount: 0.0,
        estimated: plan.estimated_prompt_tokens as f64,
        output: grant,
        spend: spend_rates(plan).spend(grant),
        ledger_at,
        mix: plan.prompt_mix,
        learned: None,
        declared: plan.declared.map(|_, &n| n as f64),
    }
}

/// What each level holds of a reservation granted `grant` output tokens.
struct Held {
    /// The granted output and its spend.
    grant: (f64, f64),
    /// The learned output and its spend, when some level holds it.
    learned: Option<(f64, f64)>,
    /// Per level: whether it holds the learned output.
    at: Vec<bool>,
}

impl Held {
    fn of(plan: &ReservePlan, credits: &[Option<f64>], grant: f64) -> Self {
        let rates = spend_rates(plan);
        let learned = plan
            .learned_output
            .map(|l| l as f64)
            .filter(|&l| l < grant && credits.iter().any(Option::is_some));
        Held {
            grant: (grant, rates.spend(grant)),
            learned: learned.map(|l| (l, rates.spend(l))),
            // Empty (no allocation) unless some level holds the learned output.
            at: match learned {
                Some(_) => credits.iter().map(Option::is_some).collect(),
                None => Vec::new(),
            },
        }
    }

    /// The output and spend level `i` holds.
    fn at(&self, i: usize) -> (f64, f64) {
        match self.learned {
            Some(l) if self.at.get(i) == Some(&true) => l,
            _ => self.grant,
        }
    }

    /// The most output any level holds: the learned output when every level
    /// that holds output ([`LevelPlan::holds_output`]) holds it, else the
    /// grant.
    fn largest(&self, plan: &ReservePlan) -> f64 {
        let grant_held = plan
            .levels
            .iter()
            .zip(&self.at)
            .any(|(lp, &at)| lp.holds_output() && !at);
        match self.learned {
            Some((learned, _)) if !grant_held => learned,
            _ => self.grant.0,
        }
    }

    /// The record's learned output: which levels hold it, when some do.
    fn learned(&self, plan: &ReservePlan) -> Option<LearnedOutput> {
        let (output, spend) = self.learned?;
        let mask = plan
            .levels
            .iter()
            .zip(&self.at)
            .filter(|&(_, &at)| at)
            .fold(0, |m, (lp, _)| m | lp.bit());
        Some(LearnedOutput {
            mask,
            output,
            spend,
        })
    }
}

/// Takes from each level holding the learned output what calls in flight
/// may still overrun there: the grant less what it holds.
fn take_credits(
    levels: &mut [Option<StoredLevel>],
    credits: &[Option<f64>],
    held: &Held,
    grant: f64,
    now: f64,
) {
    let Some((learned, _)) = held.learned else {
        return;
    };
    for ((stored, credit), &at) in levels.iter_mut().zip(credits).zip(&held.at) {
        if let (Some(credit), true) = (credit, at) {
            let stored = stored.get_or_insert_with(StoredLevel::default);
            stored.credit = Some((credit - (grant - learned), now));
        }
    }
}

/// The earlier reservation to return instead, as (nonce, tokens, lease ms
/// left), or why there is none to return.
fn replay_of(
    plan: &ReservePlan,
    earlier: Earlier<'_>,
    now: f64,
) -> Result<(String, u64, u64), ReserveReply> {
    let rec = earlier.record;
    if rec.fingerprint != plan.fingerprint {
        return Err(ReserveReply::IdempotencyConflict);
    }
    if rec.state != RecordState::Reserved || rec.lease_expires_us <= now {
        return Err(ReserveReply::IdempotencySpent {
            settled: rec.state != RecordState::Reserved,
        });
    }
    let left = ceil_ms(rec.lease_expires_us - now);
    Ok((earlier.nonce.to_owned(), rec.cost as u64, left))
}

/// Reads every level: each bucket's level now (a bucket the state lacks is
/// full), and the leases, reclaiming lapsed ones once the earliest expiry
/// has passed.
fn read_levels(plan: &ReservePlan, levels: &mut [Option<StoredLevel>], now: f64) -> Read {
    let prompt = plan.prompt_tokens as f64;
    let rates = spend_rates(plan);
    let max = plan.max_output_tokens as f64;
    let mut read = Read {
        after: Vec::with_capacity(plan.levels.len()),
        buckets: Vec::with_capacity(plan.levels.iter().map(|l| l.buckets.len()).sum()),
        room: max,
        credits: Vec::new(),
        reclaimed: Reclaimed::default(),
    };
    let learned = plan.learned_output.map(|l| l as f64).filter(|&l| l < max);
    for (i, (lp, stored)) in plan.levels.iter().zip(levels.iter_mut()).enumerate() {
        if let Some(stored) = stored.as_mut()
            && lp.concurrency.is_some()
            && stored.state.e > 0.0
            && now >= stored.state.e
        {
            let dropped = stored.reclaim(now);
            if counts_reclaims(&plan.levels, i) {
                read.reclaimed.add(lp.level, dropped.min(RECLAIM_CAP));
            }
        }
        // The level holds the learned output while its credit covers what
        // calls in flight could use beyond it.
        let credit = match (lp.overrun, learned) {
            (Some(o), Some(l)) => {
                Some(o.now(stored.as_ref().and_then(|s| s.credit), now)).filter(|&c| c >= max - l)
            }
            _ => None,
        };
        // A level holding `holds` bounds the grant only below it.
        let holds = credit.and(learned).unwrap_or(max);
        if learned.is_some() {
            read.credits.push(credit);
        }
        let mut s = stored.as_ref().map(|s| s.state.clone()).unwrap_or_default();
        for (hint, b) in lp.buckets.iter().enumerate() {
            let (k, l) = s.read_bucket(b, hint, now);
            let above_floor = l - b.floor(plan.headroom);
            if let Some(room) = b.output_room(above_floor, prompt, rates)
                && room < read.room
                && room < holds
            {
                read.room = room;
            }
            read.buckets.push((k, l));
        }
        read.after.push(s);
    }
    read
}

/// The plan's spend rates, as the scripts receive them (`sp`, `op`).
pub fn spend_rates(plan: &ReservePlan) -> SpendRates {
    plan.spend_rates()
}

/// Whether entry `i`'s lapsed leases count in the reclaimed figures: a
/// level's own entry's always; a model group's slots only when their level
/// keeps no lease of its own (else one lapsed reservation would count twice).
pub fn counts_reclaims(levels: &[LevelPlan], i: usize) -> bool {
    let lp = &levels[i];
    !lp.slots
        || !levels
            .iter()
            .any(|o| o.level == lp.level && !o.slots && o.concurrency.is_some())
}

/// Checks every bucket and limit in plan order, taking the cost in the working
/// states (each level what it holds: [`Held`]). Returns the denied checks and
/// each level's time to refill (µs).
fn check(
    plan: &ReservePlan,
    read: &mut Read,
    held: &Held,
    now: f64,
    crossings: &mut Vec<Crossing>,
) -> (DeniedChecks, Vec<f64>) {
    let h = plan.headroom;
    let (mut denied, mut i) = (DeniedChecks::default(), 0);
    let mut ttls = Vec::with_capacity(plan.levels.len());
    let mut found = read.buckets.iter();
    let declared = plan.declared.map(|_, &n| n as f64);
    for (at, (lp, s)) in plan.levels.iter().zip(&mut read.after).enumerate() {
        let (output, spend) = held.at(at);
        let cost = Cost::reservation(plan.prompt_tokens as f64, output, spend, &declared);
        let mut ttl = 0.0f64;
        for (b, &(k, l)) in lp.buckets.iter().zip(found.by_ref()) {
            let c = cost.of(b.dimension);
            if b.denies(l, c, h) {
                denied.insert(i);
            }
            i += 1;
            let level = l - c;
            alerts::crossed(at, b, (l, level), now, crossings);
            s.buckets[k] = BucketState {
                id: bucket_id(b),
                level,
                t: now,
                limit: b.limit as f64,
            };
            ttl = ttl.max(b.keep_us(level, now));
        }
        if let Some(limit) = lp.concurrency {
            let limit = limit as f64;
            if s.n + 1.0 > limit - h * limit {
                denied.insert(i);
            }
            i += 1;
        }
        ttls.push(ttl);
    }
    (denied, ttls)
}

/// Everything fits: writes every level and its lease. Returns the lease expiry.
fn take(
    plan: &ReservePlan,
    levels: &mut [Option<StoredLevel>],
    after: Vec<LevelState>,
    ttls: Vec<f64>,
    now_us: i64,
    lease: Lease,
) -> f64 {
    let now = now_us as f64;
    let lease_ttl = plan.lease_ttl_ms as f64 * 1000.0;
    let exp = now + lease_ttl;
    for (((lp, mut s), mut ttl), stored) in plan.levels.iter().zip(after).zip(ttls).zip(levels) {
        let stored = stored.get_or_insert_with(StoredLevel::default);
        // A session's key lives its session_ttl at most, but outlives its leases.
        ttl = ttl.min(lp.max_life_us());
        if lp.concurrency.is_some() {
            s.n += 1.0;
            if s.e == 0.0 || exp < s.e {
                s.e = exp;
            }
            ttl = ttl.max(lease_ttl);
            stored.leases.insert(lease, exp);
        }
        drop_foreign(&mut s, lp.buckets.len(), now);
        stored.store(s, now_us, ttl.min(MAX_TTL_US));
    }
    exp
}

/// Keeps this call's buckets and any other touched this instant (time = now),
/// and at most [`MAX_FOREIGN`] others, the most recently used.
pub(super) fn drop_foreign(s: &mut LevelState, known: usize, now: f64) {
    if s.buckets.len() <= known + MAX_FOREIGN {
        return;
    }
    let mut times: Vec<f64> = s
        .buckets
        .iter()
        .filter(|b| b.t != now)
        .map(|b| b.t)
        .collect();
    if times.len() <= MAX_FOREIGN {
        // The rest were touched this instant, by this call or another.
        return;
    }
    times.sort_by(|a, b| b.total_cmp(a));
    let cutoff = times[MAX_FOREIGN - 1];
    s.buckets.retain(|b| b.t == now || b.t >= cutoff);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::RECLAIM_CAP;
    use crate::{BucketSpec, Dimension, Level, ReservationId, TenantId};

    const NOW: i64 = 1_800_000_000_000_000;

    fn plan(concurrency: Option<u64>, tokens: u64, prompt: u64, max: u64, min: u64) -> ReservePlan {
        let tpm = BucketSpec {
            level: Level::Tenant,
            dimension: Dimension::Tokens,
            limit: tokens,
            period_secs: 60,
            group: 0,
            window: None,
            alert_at: Default::default(),
        };
        ReservePlan {
            id: ReservationId::generate(TenantId::parse("t").unwrap(), None, "p".into(), "".into()),
            levels: vec![LevelPlan {
                level: Level::Tenant,
                group: None,
                slots: false,
                buckets: vec![tpm],
                concurrency,
                overrun: None,
                idle_secs: None,
            }],
            model_group: None,
            headroom: 0.0,
            price: Default::default(),
            prompt_tokens: prompt,
            max_output_tokens: max,
            min_output_tokens: min,
            estimated_prompt_tokens: 0,
            prompt_mix: None,
            learned_output: None,
            lease_ttl_ms: 1000,
            idempotency_key: None,
            fingerprint: 7,
            declared: Default::default(),
        }
    }

    fn retention() -> Retention {
        Retention {
            record_ms: 60_000,
            idempotency_ms: 60_000,
            samples: 8,
            ledger: None,
            alert_queue: 0,
        }
    }

    #[test]
    fn output_is_reduced_to_what_fits_and_a_min_above_it_denies_without_writing() {
        let mut levels = vec![None];
        let out = reserve(
            NOW,
            &plan(None, 100, 30, 200, 10),
            None,
            &mut levels,
            Lease(0xa),
            &retention(),
        );
        let ReserveReply::Allowed { granted_output, .. } = out.reply else {
            panic!("{:?}", out.reply)
        };
        assert_eq!(granted_output, 70);
        assert_eq!(
            out.record.map(|(r, ttl)| (r.cost, ttl)),
            Some((100.0, 61_000))
        );
        let level = levels[0].clone().expect("written");
        assert_eq!(level.state.buckets[0].level, 0.0);

        let out = reserve(
            NOW,
            &plan(None, 100, 1, 200, 10),
            None,
            &mut levels,
            Lease(0xb),
            &retention(),
        );
        assert!(matches!(
            out.reply,
            ReserveReply::Denied { denied_mask, .. } if denied_mask == DeniedChecks::from(1)
        ));
        assert!(out.record.is_none());
        assert_eq!(levels[0].as_ref(), Some(&level), "a denial writes nothing");
    }

    #[test]
    fn reclaimed_leases_are_counted_up_to_the_cap_the_scripts_pack() {
        let lapsed = NOW as f64 - 1.0;
        let mut stored = StoredLevel::default();
        stored.state.n = (RECLAIM_CAP + 5) as f64;
        stored.state.e = lapsed;
        stored.state.x = NOW as f64 + 1e9;
        stored.expires_at_us = NOW + 1_000_000_000;
        for i in 0..RECLAIM_CAP + 5 {
            stored.leases.insert(Lease(u128::from(i)), lapsed);
        }
        let mut levels = vec![Some(stored)];
        let out = reserve(
            NOW,
            &plan(Some(1), 100, 1, 1, 1),
            None,
            &mut levels,
            Lease(u128::MAX),
            &retention(),
        );
        assert_eq!(out.reply.reclaimed().at(Level::Tenant), RECLAIM_CAP);
        let level = levels[0].as_ref().unwrap();
        assert_eq!(
            (level.state.n, level.leases.len()),
            (1.0, 1),
            "every lapsed lease went"
        );
    }
}
