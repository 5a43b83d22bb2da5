//! Reservations in the differential run: plans reserved one by one, and
//! fallback candidates reserved in one call ([`Store::reserve_first`]: one
//! `crates/store/lua/reserve_first.lua` call on Redis, one `reserve` per plan in memory).
//! Redis's replies are held to the memory store's, and the cluster share's
//! global column to the memory store's global level.

use super::ops::Gen;
use super::share::Episode;
use super::{Seen, count, on_share, same};
use ctxbudget::domain::{Clock, Level, LevelPlan, ManualClock, ReservePlan};
use ctxbudget::store::memory::MemoryStore;
use ctxbudget::store::redis::RedisStore;
use ctxbudget::store::{ReserveReply, Store};

/// Reserves each of `plans` on both stores and compares the replies.
pub(super) async fn one_by_one(
    g: &mut Gen,
    plans: &[ReservePlan],
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
    clock: &ManualClock,
    seen: &mut Seen,
) -> Result<(), String> {
    for (j, plan) in plans.iter().enumerate() {
        let what = format!("reserve {j} of {}", plans.len());
        let global = Episode::before(memory, &plan.levels, &plan.id.tenant, clock.now_us());
        let m = memory.reserve(plan).await.unwrap();
        let r = redis.reserve(plan).await.unwrap();
        count_reply(seen, plan, &m, clock.now_us());
        same(&what, &m, &r)?;
        if let Some(mut ep) = global {
            ep.reserve(plan, &m, seen).map_err(|e| on_share(&what, e))?;
            ep.compare(memory, true, seen)
                .await
                .map_err(|e| on_share(&what, e))?;
        }
        track(g, plan, &m, clock);
    }
    Ok(())
}

/// Reserves the first of the candidates `plans` with room on both stores
/// and compares the replies, as many as were tried and each as a single
/// reservation's. The cluster store reserves candidates one by one, so its
/// share does what a reservation of each candidate tried does; a denied
/// candidate takes nothing, so every candidate's episode starts from the
/// levels before the call, and only the last one tried is compared with
/// the memory store's levels after it.
pub(super) async fn first(
    g: &mut Gen,
    plans: &[ReservePlan],
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
    clock: &ManualClock,
    seen: &mut Seen,
) -> Result<(), String> {
    let now = clock.now_us();
    let mut global: Vec<Option<Episode>> = plans
        .iter()
        .map(|p| Episode::before(memory, &p.levels, &p.id.tenant, now))
        .collect();
    let m = memory.reserve_first(plans).await.unwrap();
    let r = redis.reserve_first(plans).await.unwrap();
    let n = plans.len();
    tried(&m, n).map_err(|e| format!("memory: {e}"))?;
    if m.len() != r.len() {
        return Err(format!(
            "reserve_first of {n} candidates: memory tried {}, redis {}:\n    memory {m:?}\n    \
             redis  {r:?}",
            m.len(),
            r.len()
        ));
    }
    count(
        seen,
        match (m.len(), m.last()) {
            (1, Some(ReserveReply::Allowed { .. })) => "reserve_first allowed the first candidate",
            (2, Some(ReserveReply::Allowed { .. })) => "reserve_first allowed the second candidate",
            (_, Some(ReserveReply::Allowed { .. })) => "reserve_first allowed a later candidate",
            _ => "reserve_first denied every candidate",
        },
    );
    if m.len() > 1 && matches!(m.last(), Some(ReserveReply::Allowed { .. })) {
        let group = |p: &ReservePlan| p.levels.iter().any(|l| l.group.is_some());
        if group(&plans[0]) && !group(&plans[m.len() - 1]) {
            count(
                seen,
                "reserve_first allowed all-model limits past a group's",
            );
        }
    }
    let last = m.len() - 1;
    for (j, (plan, (m, r))) in plans.iter().zip(m.iter().zip(&r)).enumerate() {
        let what = format!("reserve_first candidate {j} of {n}");
        count_reply(seen, plan, m, now);
        same(&what, m, r)?;
        if let Some(mut ep) = global[j].take() {
            ep.reserve(plan, m, seen).map_err(|e| on_share(&what, e))?;
            if j == last {
                ep.compare(memory, true, seen)
                    .await
                    .map_err(|e| on_share(&what, e))?;
            }
        }
        track(g, plan, m, clock);
    }
    Ok(())
}

/// Checks that `replies` are those of candidates tried in order: every one
/// denied but the last, which is allowed, or all `n` denied.
fn tried(replies: &[ReserveReply], n: usize) -> Result<(), String> {
    let denied = |r: &ReserveReply| matches!(r, ReserveReply::Denied { .. });
    let ok = match replies.split_last() {
        Some((last, before)) => {
            before.iter().all(denied)
                && match last {
                    ReserveReply::Allowed { .. } => true,
                    last => denied(last) && replies.len() == n,
                }
        }
        None => false,
    };
    match ok {
        true => Ok(()),
        false => Err(format!(
            "reserve_first of {n} candidates answered {replies:?}"
        )),
    }
}

/// Records a reservation sent: issued, and taken when allowed.
fn track(g: &mut Gen, plan: &ReservePlan, reply: &ReserveReply, clock: &ManualClock) {
    g.issued.push(plan.clone());
    if matches!(reply, ReserveReply::Allowed { .. }) {
        let expiry = clock.now_us() + plan.lease_ttl_ms as i64 * 1000;
        g.taken.push((plan.id.clone(), expiry));
    }
}

/// Counts the paths a reservation `plan` the memory store answered with
/// `reply` at `now` took.
fn count_reply(seen: &mut Seen, plan: &ReservePlan, reply: &ReserveReply, now: i64) {
    if let ReserveReply::Allowed {
        granted_output,
        reserved_output,
        ..
    } = reply
        && plan.learned_output.is_some_and(|l| l < *granted_output)
        && plan.levels.iter().any(|l| l.overrun.is_some())
    {
        count(
            seen,
            match reserved_output < granted_output {
                true => "reserve holding the learned output at every level",
                false => "reserve with a learned output, the grant held at some level",
            },
        );
    }
    count(
        seen,
        match reply {
            ReserveReply::Allowed { .. } => "reserve allowed",
            ReserveReply::Denied { .. } => "reserve denied",
            ReserveReply::Replayed { .. } => "reserve replayed",
            ReserveReply::IdempotencyConflict => "reserve idempotency conflict",
            ReserveReply::IdempotencySpent { .. } => "reserve idempotency spent",
        },
    );
    let windows = plan
        .levels
        .iter()
        .flat_map(|l| &l.buckets)
        .filter_map(|b| b.window);
    for w in windows {
        count(
            seen,
            match now >= w.span.end_us {
                true => "reserve in the window after its plan's",
                false => "reserve in a calendar window",
            },
        );
        if (w.span.start_us..w.span.start_us + 600_000_000).contains(&now) {
            count(seen, "reserve within 10 minutes of a window's start");
        }
    }
    if reply.reclaimed() != Default::default() {
        count(seen, "reserve reclaimed leases");
    }
    count_session(seen, plan, reply);
}

/// Counts the session paths a reservation `plan` answered with `reply` took.
fn count_session(seen: &mut Seen, plan: &ReservePlan, reply: &ReserveReply) {
    if reply.reclaimed().at(Level::Session) > 0 {
        count(seen, "reserve reclaimed leases at the session level");
    }
    if plan.id.session.is_none() || !matches!(reply, ReserveReply::Allowed { .. }) {
        return;
    }
    count(
        seen,
        match plan.id.user {
            Some(_) => "reserve allowed in a session",
            None => "reserve allowed in a session of no user",
        },
    );
    let lease_us = plan.lease_ttl_ms * 1000;
    let outlives = |l: &LevelPlan| {
        l.concurrency.is_some() && l.idle_secs.is_some_and(|s| s * 1_000_000 < lease_us)
    };
    if plan.levels.iter().any(outlives) {
        count(seen, "a session's lease outliving its session_ttl");
    }
}
