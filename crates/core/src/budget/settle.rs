//! Settle: Commit (the real usage) or Refund (nothing used) one reservation
//! (`crates/store/lua/settle.lua` is its Redis port).
//!
//! Commit charges an overage even into debt and returns a surplus without
//! overfilling; it touches token buckets only (tokens by actual − reserved,
//! input tokens by the prompt that counts − the prompt reserved, output tokens
//! by the completion − the output granted). Refund returns the tokens and the
//! request. Both free the lease, lapsed or not (a lapsed one only if no
//! reserve reclaimed it yet). A level left with no lease has no earliest
//! expiry (0); otherwise the stored expiry stays a lower bound: finding the
//! next lease on every settle would scan every lease. A settled record is kept
//! for the record retention, so repeats answer already-settled and change
//! nothing.

use super::alerts;
use super::ledger::{self, Entry};
use super::level::{Lease, StoredLevel};
use super::record::{Record, RecordState};
use super::replies::{Retention, SettleReply, Settled};
use super::state::{BucketState, bucket_id};
use super::usage::Settle;
use crate::alert::Crossing;
use crate::bucket::Cost;
use crate::mix::EstimatorSample;
use crate::{DimMap, Dimension, LevelPlan};

/// What a settle decided, and what the store must keep.
#[derive(Debug)]
pub struct SettleOutcome {
    /// The answer.
    pub reply: SettleReply,
    /// The settled record and how long to keep it (ms), when applied.
    pub record: Option<(Record, u64)>,
    /// An estimator sample to add, when a commit settles a prompt the
    /// service counted: with the prompt's mix when the record has one.
    pub sample: Option<EstimatorSample>,
    /// What the settlement adds to the usage ledger, with the ledger on.
    pub ledger: Option<Entry>,
    /// A completion sample (its output tokens) to add, when a commit's tier
    /// learns its output ([`Usage::output_kept`]).
    pub output_sample: Option<u64>,
    /// The alert thresholds the settlement crossed (`super::alerts`).
    pub crossings: Vec<Crossing>,
}

impl SettleOutcome {
    fn only(reply: SettleReply) -> Self {
        SettleOutcome {
            reply,
            record: None,
            sample: None,
            ledger: None,
            output_sample: None,
            crossings: Vec::new(),
        }
    }
}

/// Settles the reservation whose record is `record` (`None`: not found) for
/// the caller whose owner tag is `owner`, at `now_us`, on `levels` (one per
/// entry of `plan`: every level of the reservation, limited or not).
#[allow(clippy::too_many_arguments)]
pub fn settle(
    now_us: i64,
    how: Settle,
    owner: u64,
    record: Option<&Record>,
    plan: &[LevelPlan],
    levels: &mut [Option<StoredLevel>],
    lease: Lease,
    retention: &Retention,
) -> SettleOutcome {
    let rec = match unsettled(record, owner) {
        Ok(rec) => rec,
        Err(reply) => return SettleOutcome::only(reply),
    };
    let now = now_us as f64;
    let (deltas, settled) = Deltas::settling(how, rec);
    let mut crossings = Vec::new();
    for (at, (lp, stored)) in plan.iter().zip(levels.iter_mut()).enumerate() {
        let deltas = match rec.held_at(lp.bit()) {
            (output, _) if output == rec.output => deltas,
            (output, spend) => {
                give_back(lp, stored, rec.output - output, now);
                let cost = rec.cost - rec.output + output;
                Deltas::moving(how, cost, output, spend, &rec.declared).0
            }
        };
        // A live lease is certainly still there; a lapsed one may have been reclaimed.
        let holds = rec.mask & lp.bit() != 0
            && (rec.lease_expires_us > now
                || stored
                    .as_ref()
                    .is_some_and(|s| s.leases.contains_key(&lease)));
        let touched = lp.buckets.iter().any(|b| deltas.of(b.dimension) != 0.0);
        if touched || holds {
            settle_level(at, &mut crossings, lp, stored, holds, deltas, lease, now_us);
        }
    }
    let (state, amount) = match settled {
        Settled::Refunded(_) => (RecordState::Refunded, rec.cost),
        Settled::Committed(_) => (RecordState::Committed, deltas[Dimension::Tokens]),
    };
    let sample = match how {
        Settle::Commit(usage) if rec.estimated > 0.0 && usage.prompt > 0 && usage.learn => {
            Some(EstimatorSample::of(usage.prompt, rec.estimated, rec.mix))
        }
        _ => None,
    };
    let settled_record = Record {
        state,
        amount,
        ..rec.clone()
    };
    SettleOutcome {
        reply: SettleReply::Applied {
            settled,
            estimated_prompt_tokens: rec.estimated as u64,
            reserved_spend: rec.spend as u64,
            reserved_output: rec.output as u64,
            reserved_declared: rec.declared.map(|_, &v| v as u64),
        },
        record: Some((settled_record, retention.record_ms)),
        sample,
        ledger: retention.ledger.map(|_| ledger::settled(now, how, rec)),
        output_sample: match how {
            Settle::Commit(u) if u.learn && u.output_kept > 0 => Some(u.tokens - u.prompt),
            _ => None,
        },
        crossings,
    }
}

/// The caller's record if it is still to settle; otherwise the answer.
fn unsettled(record: Option<&Record>, owner: u64) -> Result<&Record, SettleReply> {
    let Some(rec) = record.filter(|r| r.owner == owner) else {
        return Err(SettleReply::NotFound);
    };
    match rec.state {
        RecordState::Committed => Err(SettleReply::AlreadySettled(Settled::Committed(
            rec.amount as i64,
        ))),
        RecordState::Refunded => Err(SettleReply::AlreadySettled(Settled::Refunded(
            rec.amount as u64,
        ))),
        RecordState::Reserved => Ok(rec),
    }
}

/// What settling moves per dimension: what was used less what was reserved
/// ([`Cost::change_to`]), so the whole reservation back on a refund.
/// Positive: taken (an overage); negative: returned.
pub type Deltas = Cost<f64>;

impl Deltas {
    /// What settling `rec` by `how` moves, and how it reads once settled.
    fn settling(how: Settle, rec: &Record) -> (Deltas, Settled) {
        Deltas::moving(how, rec.cost, rec.output, rec.spend, &rec.declared)
    }

    /// What settling by `how` a reservation of `cost` tokens, `output` of
    /// them granted output, `spend` µ$ and what it `declared` moves, and how it reads once
    /// settled: the one rule both this module and a store that keeps a level
    /// apart (the cluster's leased global level) follow. A reservation's
    /// cost per dimension is [`Cost::reservation`]'s; a commit's usage is one
    /// request, its tokens, input, completion and cost; a refund uses nothing.
    pub fn moving(
        how: Settle,
        cost: f64,
        output: f64,
        spend: f64,
        declared: &DimMap<f64>,
    ) -> (Deltas, Settled) {
        let reserved = Cost::reservation(cost - output, output, spend, declared);
        match how {
            Settle::Refund => (
                reserved.change_to(Cost::default()),
                Settled::Refunded(cost as u64),
            ),
            Settle::Commit(usage) => {
                let deltas = reserved.change_to(usage.used());
                (deltas, Settled::Committed(deltas[Dimension::Tokens] as i64))
            }
        }
    }
}

/// Gives a level holding the learned output back the credit its reservation
/// took (`taken`: the grant less what it held), never above the capacity.
/// A credit no longer stored (its key lapsed) is full already; a credit of
/// capacity 0 (its limit since lowered) is none, as for settle.lua.
fn give_back(lp: &LevelPlan, stored: &mut Option<StoredLevel>, taken: f64, now: f64) {
    if let (Some(o), Some(stored)) = (lp.overrun.filter(|o| o.capacity > 0), stored.as_mut())
        && stored.credit.is_some()
    {
        let credit = (o.now(stored.credit, now) + taken).min(o.capacity as f64);
        stored.credit = Some((credit, now));
    }
}

/// Frees the lease (when `holds`) and moves every bucket by its delta.
#[expect(
    clippy::too_many_arguments,
    reason = "settle.lua's per-level step, argument for argument"
)]
fn settle_level(
    at: usize,
    crossings: &mut Vec<Crossing>,
    lp: &LevelPlan,
    stored: &mut Option<StoredLevel>,
    holds: bool,
    deltas: Deltas,
    lease: Lease,
    now_us: i64,
) {
    let now = now_us as f64;
    let stored = stored.get_or_insert_with(StoredLevel::default);
    let st = &mut stored.state;
    if holds && st.n > 0.0 {
        st.n -= 1.0;
    }
    // The last lease goes: no earliest expiry left.
    if holds && st.n == 0.0 {
        st.e = 0.0;
    }
    let mut ttl = 0.0f64;
    for b in &lp.buckets {
        let delta = deltas.of(b.dimension);
        if delta == 0.0 {
            continue;
        }
        let id = bucket_id(b);
        let (k, l) = match st.buckets.iter().position(|x| x.id == id) {
            Some(k) => (k, st.level_at(b, k, now)),
            None => {
                st.buckets.push(BucketState {
                    id,
                    level: 0.0,
                    t: 0.0,
                    limit: 0.0,
                });
                (st.buckets.len() - 1, b.limit as f64)
            }
        };
        let level = b.settle(l, delta);
        alerts::crossed(at, b, (l, level), now, crossings);
        st.buckets[k] = BucketState {
            id,
            level,
            t: now,
            limit: b.limit as f64,
        };
        ttl = ttl.max(b.keep_us(level, now));
    }
    if holds {
        stored.leases.remove(&lease);
    }
    stored.outlive(now_us, ttl.min(lp.max_life_us()));
}
