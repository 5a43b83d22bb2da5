//! The third column: the Redis Cluster store's global share
//! (`ctxbudget::store::cluster::share`) on the same operations, held to the
//! memory store's global level.
//!
//! # How
//! Before each reservation, charge and settlement with a global entry, every
//! global entry gets a fresh share that has just leased the whole of the
//! memory store's level: it holds each bucket's level exactly (read from the
//! memory store's state, as `f64`), the global key is left at zero, and the
//! slots the memory store counts in use are the key's, held elsewhere. The
//! share then does what `ClusterStore` does around its tenant slot (the
//! tenant's levels, its users' and sessions' with them), with the memory
//! store's reply standing in for the tenant's: [`share::take`], then
//! [`share::put_back`] to the grant (or all of it when the reply is not an
//! allowance); [`share::charge`], then [`share::uncharge`] if it was denied;
//! [`share::deltas`] of the settle reply, then [`share::settle`]. Last, one
//! sync: the share's ask ([`Share::ask`]: what it gives back, owes, wants) is
//! answered as `crates/store/lua/global_lease.lua` would (what comes back, capped at the
//! limit; what is wanted, leased from that) and the share's readings must
//! be the memory store's.
//!
//! # What must agree
//! A share holding the whole level decides as one store: its denied checks
//! are exactly the global checks the memory store denied (the grant is
//! decided before the tenant's levels are asked, and the global checks pass
//! at any grant up to the global room), its grant is never below the memory
//! store's (equal unless another level bound it), and what each bucket is
//! left with, its returns and debts through the sync included, reads as the
//! memory store's level (to a thousandth: the share adds and takes back in
//! another order, so a level may differ in its last bits; every rule moves
//! whole units). The concurrency in use after a reservation agrees too.
//!
//! # What may differ, and is not compared
//! - A real replica holds a chunk, not the whole level: it grants from what
//!   it holds, and budget it holds misses the key's refill past the limit
//!   until it goes home (the module doc of the share: "the price"). Those
//!   are its lease policy, exercised by the share's unit tests and the
//!   cluster suites on a real cluster, not its arithmetic.
//! - A replayed or refused idempotent retry: one store answers it before it
//!   reads a level; the cluster takes from the share first, so a share short
//!   denies it. Counted, not compared.
//! - Slots across operations (freed by settle or messages, lapsing after a
//!   grace): each episode's share starts from the memory store's count, so
//!   only a reservation's slot check and count are compared; the earliest
//!   lease expiry, reclaimed counts, and the count after a settle are not.
//!   A count above a lowered limit reads as the limit on a share.

use super::{Seen, count};
use ctxbudget::domain::budget::state::{BucketState, LevelState, bucket_id};
use ctxbudget::domain::budget::{
    ChargePlan, ChargeReply, DeniedChecks, ReserveReply, Settle, SettleReply, StoredLevel,
};
use ctxbudget::domain::{
    BucketSpec, Level, LevelPlan, ManualClock, Reading, Readings, ReservePlan, TenantId,
};
use ctxbudget::store::cluster::share::{self, Need, Share};
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys, lease_field};
use ctxbudget::store::memory::MemoryStore;
use ctxbudget::store::redis::EntryGrant;
use ctxbudget::store::{Scope, Store};
use std::sync::LazyLock;

/// The keys of both stores, where the global levels are found.
static KEYS: LazyLock<Keys> = LazyLock::new(|| Keys::new(DEFAULT_PREFIX).unwrap());

/// One operation's global entries, each with a share that leased all of it.
pub(super) struct Episode {
    entries: Vec<LevelPlan>,
    shares: Vec<Share>,
    /// Per entry: the slots this replica holds, as seeded.
    mine: Vec<f64>,
    /// Plan-order positions of the entries' checks, and of their buckets.
    checks: Vec<usize>,
    buckets: Vec<usize>,
    tenant: TenantId,
    now: f64,
}

impl Episode {
    /// The episode of an operation on `levels` at the memory store's now, as
    /// the store holds them before it; `None` without a global entry.
    pub(super) fn before(
        memory: &MemoryStore<ManualClock>,
        levels: &[LevelPlan],
        tenant: &TenantId,
        now: i64,
    ) -> Option<Self> {
        if levels.iter().all(|lp| lp.level != Level::Global) {
            return None;
        }
        let now = now as f64;
        let mut ep = Episode {
            entries: Vec::new(),
            shares: Vec::new(),
            mine: Vec::new(),
            checks: Vec::new(),
            buckets: Vec::new(),
            tenant: tenant.clone(),
            now,
        };
        let (mut check, mut bucket) = (0, 0);
        for lp in levels {
            let (n, b) = (lp.reading_count(), lp.buckets.len());
            if lp.level == Level::Global {
                ep.checks.extend(check..check + n);
                ep.buckets.extend(bucket..bucket + b);
                let stored = memory.stored_level(&KEYS.plan_level(lp, Scope::new(tenant, None)));
                let (share, mine) = leased_whole(lp, stored.as_ref(), now);
                ep.entries.push(lp.clone());
                ep.shares.push(share);
                ep.mine.push(mine);
            }
            check += n;
            bucket += b;
        }
        Some(ep)
    }

    /// A reservation the memory store answered with `reply`.
    pub(super) fn reserve(
        &mut self,
        plan: &ReservePlan,
        reply: &ReserveReply,
        seen: &mut Seen,
    ) -> Result<(), String> {
        let need = Need::of(plan);
        let lease = lease_field(&plan.id);
        let exp = self.now + plan.lease_ttl_ms as f64 * 1000.0;
        let entries: Vec<&LevelPlan> = self.entries.iter().collect();
        let mut shares: Vec<&mut Share> = self.shares.iter_mut().collect();
        let (taken, _) = share::take(&entries, &mut shares, &need, &lease, exp, self.now);
        let short = taken.as_ref().err().cloned().unwrap_or_default();
        let granted = match reply {
            ReserveReply::Allowed { granted_output, .. } => {
                let Ok(taken) = &taken else {
                    return Err(format!(
                        "memory allowed ({granted_output} output tokens), the share fell short \
                         at global checks {short:?} of {need:?}"
                    ));
                };
                let g = *granted_output as f64;
                if g > taken.grant {
                    return Err(format!(
                        "memory granted {g} output tokens, the share's global room only {}",
                        taken.grant
                    ));
                }
                count(
                    seen,
                    match g == taken.grant {
                        true => "share took the global grant",
                        false => "share took more, another level granting less",
                    },
                );
                Some(g)
            }
            ReserveReply::Denied { denied_mask, .. } => {
                let memory = positions(denied_mask, &self.checks);
                if memory != short {
                    return Err(format!(
                        "denied global checks: memory {memory:?}, share {short:?} (of {need:?})"
                    ));
                }
                count(
                    seen,
                    match short.is_empty() {
                        true => "share put back, another level denying",
                        false => "share short where memory denied",
                    },
                );
                None
            }
            _ if taken.is_err() => {
                count(seen, "share short before an idempotent answer");
                None
            }
            _ => None,
        };
        if let Ok(taken) = &taken {
            share::put_back(&entries, &mut shares, taken, &need, granted, self.now);
        }
        Ok(())
    }

    /// A charge the memory store answered with `reply`.
    pub(super) fn charge(
        &mut self,
        plan: &ChargePlan,
        reply: &ChargeReply,
        seen: &mut Seen,
    ) -> Result<(), String> {
        let entries: Vec<&LevelPlan> = self.entries.iter().collect();
        let mut shares: Vec<&mut Share> = self.shares.iter_mut().collect();
        let cost = |b: &BucketSpec| plan.cost(b.dimension) as f64;
        let took = share::charge(&entries, &mut shares, cost, plan.enforce, self.now);
        let memory = match reply {
            ChargeReply::Denied { denied_mask, .. } => positions(denied_mask, &self.buckets),
            ChargeReply::Charged { .. } => Vec::new(),
        };
        let short = took.as_ref().err().cloned().unwrap_or_default();
        if memory != short {
            return Err(format!(
                "denied global buckets of a charge: memory {memory:?}, share {short:?}"
            ));
        }
        match (&took, reply) {
            (Ok(took), ChargeReply::Denied { .. }) => {
                share::uncharge(&entries, &mut shares, took, self.now);
                count(seen, "share uncharged, another level denying");
            }
            (Ok(_), _) => count(seen, "share charged"),
            (Err(_), _) => count(seen, "share short of a charge"),
        }
        Ok(())
    }

    /// A settlement the memory store answered with `reply`.
    pub(super) fn settle(&mut self, how: Settle, reply: &SettleReply, seen: &mut Seen) {
        if let Some(deltas) = share::deltas(how, reply) {
            let entries: Vec<&LevelPlan> = self.entries.iter().collect();
            let mut shares: Vec<&mut Share> = self.shares.iter_mut().collect();
            share::settle(&entries, &mut shares, deltas, self.now);
            count(seen, "share settled");
        }
    }

    /// Syncs once, then compares the share's readings with the memory
    /// store's levels now (with `slots`, the concurrency in use too).
    pub(super) async fn compare(
        mut self,
        memory: &MemoryStore<ManualClock>,
        slots: bool,
        seen: &mut Seen,
    ) -> Result<(), String> {
        self.sync(seen);
        let mut ours = Vec::new();
        for (lp, share) in self.entries.iter().zip(&self.shares) {
            share.readings(lp, self.now, &mut ours);
        }
        let scope = Scope {
            tenant: &self.tenant,
            user: None,
            session: None,
        };
        let theirs = memory.status(scope, &self.entries, false).await.unwrap();
        let limits = self.entries.iter().flat_map(|lp| {
            let buckets = lp.buckets.iter().map(|_| None);
            buckets.chain(lp.concurrency.map(Some))
        });
        let agree = ours.len() == theirs.len()
            && ours
                .iter()
                .zip(&theirs)
                .zip(limits)
                .all(|((o, t), limit)| match (o, t) {
                    (Reading::Bucket { milli: o }, Reading::Bucket { milli: t }) => {
                        (o - t).abs() <= 1
                    }
                    (
                        Reading::Concurrency { active: o, .. },
                        Reading::Concurrency { active: t, .. },
                    ) => !slots || limit.is_none_or(|l| *t > l) || o == t,
                    _ => false,
                });
        match agree {
            true => Ok(()),
            false => Err(format!(
                "global levels after the operation:\n    memory {}\n    share  {}",
                show(&theirs),
                show(&ours)
            )),
        }
    }

    /// One sync with a global key that holds nothing but what comes back:
    /// it takes back what each share gives (capped at the limit, as
    /// `crates/store/lua/global_lease.lua` caps it; debt as it is) and the slots given
    /// back, then leases what is wanted from that.
    fn sync(&mut self, seen: &mut Seen) {
        for ((lp, share), mine) in self.entries.iter().zip(&mut self.shares).zip(&self.mine) {
            let Some(ask) = share.ask(lp, self.now, false) else {
                continue;
            };
            if ask.buckets.iter().any(|a| a.give != 0.0) {
                count(seen, "share gave back or owed");
            }
            let mut key = LevelState::default();
            let mut granted = Vec::with_capacity(ask.buckets.len());
            for a in &ask.buckets {
                let back = a.give.min(a.spec.limit as f64);
                let got = a.want.min(back).max(0.0);
                granted.push(got);
                key.buckets.push(BucketState {
                    id: bucket_id(&a.spec),
                    level: back - got,
                    t: self.now,
                    limit: a.spec.limit as f64,
                });
            }
            let limit = lp.concurrency.map_or(0.0, |c| c as f64);
            let grant = EntryGrant {
                state: Some(key),
                granted,
                slots_mine: mine - ask.give_slots,
                slots_in_use: limit - ask.give_slots,
            };
            share.apply(&ask, &grant, self.now);
        }
    }
}

/// A share of `lp` that has just leased all of its level as `stored` holds
/// it at `now`: each bucket's level, and every slot not in use. Returns it
/// and the slots it holds.
fn leased_whole(lp: &LevelPlan, stored: Option<&StoredLevel>, now: f64) -> (Share, f64) {
    let level = |b: &BucketSpec| {
        stored.map_or(b.limit as f64, |s| {
            let hint = lp.buckets.iter().position(|x| x == b).unwrap_or(0);
            s.state.level_at(b, hint, now)
        })
    };
    // In use as the memory store counts: its stored count, recounted once
    // the earliest lease may have lapsed (as its reserve and status do).
    let in_use = stored.map_or(0.0, |s| match s.state.e > 0.0 && now >= s.state.e {
        true => s.live_leases(now).0,
        false => s.state.n,
    });
    let limit = lp.concurrency.map_or(0.0, |c| c as f64);
    let mut share = Share::default();
    let ask = share.observe(lp, now);
    let key = LevelState {
        buckets: ask
            .buckets
            .iter()
            .map(|a| BucketState {
                id: bucket_id(&a.spec),
                level: 0.0,
                t: now,
                limit: a.spec.limit as f64,
            })
            .collect(),
        ..LevelState::default()
    };
    let grant = EntryGrant {
        state: Some(key),
        granted: ask.buckets.iter().map(|a| level(&a.spec)).collect(),
        slots_mine: limit - in_use,
        slots_in_use: limit,
    };
    share.apply(&ask, &grant, now);
    (share, limit - in_use)
}

/// Which of `at` (plan positions, in the entries' order) `mask` holds, as
/// indices into `at`: a plan's mask as the share numbers its checks.
fn positions(mask: &DeniedChecks, at: &[usize]) -> Vec<usize> {
    (0..at.len()).filter(|&i| mask.contains(at[i])).collect()
}

fn show(readings: &Readings) -> String {
    let each: Vec<String> = readings
        .iter()
        .map(|r| match r {
            Reading::Bucket { milli } => format!("{milli}"),
            Reading::Concurrency { active, .. } => format!("{active} in use"),
        })
        .collect();
    each.join(", ")
}
