//! Charge: take requests or tokens at every level with no reservation behind
//! them — no record, no lease, nothing to settle (`crates/store/lua/charge.lua` is its
//! Redis port). What a protocol without a settle call can ask: Envoy's rate
//! limit service checks a request, counts it, or charges the tokens a
//! response used.
//!
//! Enforced, a charge is all or nothing: every bucket must hold its cost and
//! at least one unit (a check takes nothing but needs room), else nothing is
//! written. Forced, it always takes its cost, into debt if need be (usage
//! that already happened). Concurrency limits do not apply: without a
//! release call a slot could never be freed.

use super::alerts;
use super::level::StoredLevel;
use super::reserve::drop_foreign;
use super::state::{self, BucketState, bucket_id};
use crate::alert::Crossing;
use crate::bucket::Cost;
use crate::checks::DeniedChecks;
use crate::{Dimension, LevelPlan, Readings, SessionId, TenantId, UserId};

/// What to charge, and where.
#[derive(Clone, Debug, PartialEq)]
pub struct ChargePlan {
    /// The tenant whose levels these are.
    pub tenant: TenantId,
    /// The user, when the levels include theirs.
    pub user: Option<UserId>,
    /// The session, when the levels include its.
    pub session: Option<SessionId>,
    /// The levels, outermost first; their concurrency limits are ignored.
    pub levels: Vec<LevelPlan>,
    /// Requests to take from every request bucket.
    pub requests: u64,
    /// Tokens to take from every (all-)token bucket.
    pub tokens: u64,
    /// True: deny unless every bucket has room (request path); false: take
    /// the cost whatever is left (usage already spent).
    pub enforce: bool,
}

impl ChargePlan {
    /// What this charge takes from `bucket`: requests from request buckets,
    /// tokens from token buckets, nothing from the others (input, output and
    /// spend buckets: one number of tokens says nothing of its split or
    /// price).
    pub fn cost(&self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Requests | Dimension::Concurrency => self.requests,
            Dimension::Tokens => self.tokens,
            _ => 0,
        }
    }

    /// What this charge takes in each rate dimension.
    pub fn costs(&self) -> Cost {
        Cost::from_fn(|d| self.cost(d))
    }

    /// True when the charge writes nothing even when allowed.
    pub fn takes_nothing(&self) -> bool {
        self.requests == 0 && self.tokens == 0
    }
}

/// What a charge did.
#[derive(Clone, Debug, PartialEq)]
pub enum ChargeReply {
    /// Taken (or, taking nothing, checked); the readings after.
    Charged {
        /// One per bucket, in plan order.
        readings: Readings,
    },
    /// A bucket had no room; nothing changed.
    Denied {
        /// The readings as they were.
        readings: Readings,
        /// The buckets that denied, in plan order.
        denied_mask: DeniedChecks,
    },
}

impl ChargeReply {
    /// The readings, whatever the outcome.
    pub fn readings(&self) -> &Readings {
        match self {
            ChargeReply::Charged { readings } | ChargeReply::Denied { readings, .. } => readings,
        }
    }
}

/// Charges `plan` at `now_us` on `levels` (one per plan level, `None` where
/// the store holds nothing); with the alert thresholds a charge crossed.
pub fn charge(
    now_us: i64,
    plan: &ChargePlan,
    levels: &mut [Option<StoredLevel>],
) -> (ChargeReply, Vec<Crossing>) {
    let now = now_us as f64;
    let mut denied = DeniedChecks::default();
    let mut after = Vec::with_capacity(plan.levels.len());
    let mut crossings = Vec::new();
    let mut i = 0;
    for (at, (lp, stored)) in plan.levels.iter().zip(levels.iter()).enumerate() {
        let mut s = stored.as_ref().map(|s| s.state.clone()).unwrap_or_default();
        let mut ttl = 0.0f64;
        for (hint, b) in lp.buckets.iter().enumerate() {
            let id = bucket_id(b);
            let (k, l) = s.read_bucket(b, hint, now);
            let c = plan.cost(b.dimension) as f64;
            if plan.enforce && b.denies(l, c.max(1.0), 0.0) {
                denied.insert(i);
            }
            i += 1;
            let level = l - c;
            alerts::crossed(at, b, (l, level), now, &mut crossings);
            s.buckets[k] = BucketState {
                id,
                level,
                t: now,
                limit: b.limit as f64,
            };
            ttl = ttl.max(b.keep_us(level, now));
        }
        after.push((s, ttl));
    }
    if !denied.is_empty() || plan.takes_nothing() {
        let readings =
            state::readings_of(&plan.levels, |i| Some(&levels[i].as_ref()?.state), &[], now);
        let reply = match denied.is_empty() {
            true => ChargeReply::Charged { readings },
            false => ChargeReply::Denied {
                readings,
                denied_mask: denied,
            },
        };
        return (reply, Vec::new());
    }
    for ((lp, (mut s, ttl)), stored) in plan.levels.iter().zip(after).zip(levels.iter_mut()) {
        let stored = stored.get_or_insert_with(StoredLevel::default);
        drop_foreign(&mut s, lp.buckets.len(), now);
        stored.store(s, now_us, ttl.min(lp.max_life_us()));
    }
    let readings = state::readings_of(&plan.levels, |i| Some(&levels[i].as_ref()?.state), &[], now);
    (ChargeReply::Charged { readings }, crossings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BucketSpec, Level};

    const NOW: i64 = 1_800_000_000_000_000;

    fn plan(requests: u64, tokens: u64, enforce: bool) -> ChargePlan {
        let bucket = |dimension, limit| BucketSpec {
            level: Level::Tenant,
            dimension,
            limit,
            period_secs: 60,
            group: 0,
            window: None,
            alert_at: Default::default(),
        };
        ChargePlan {
            tenant: TenantId::parse("t").unwrap(),
            user: None,
            session: None,
            levels: vec![LevelPlan {
                level: Level::Tenant,
                group: None,
                slots: false,
                buckets: vec![
                    bucket(Dimension::Requests, 2),
                    bucket(Dimension::Tokens, 100),
                ],
                concurrency: None,
                overrun: None,
                idle_secs: None,
            }],
            requests,
            tokens,
            enforce,
        }
    }

    fn milli(reply: &ChargeReply) -> Vec<i64> {
        reply
            .readings()
            .iter()
            .map(|r| match r {
                crate::Reading::Bucket { milli } => *milli,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_check_takes_nothing_and_writes_nothing() {
        let mut levels = vec![None];
        let (out, _) = charge(NOW, &plan(0, 0, true), &mut levels);
        assert_eq!(milli(&out), [2000, 100_000]);
        assert!(levels[0].is_none(), "a check writes no key");
    }

    #[test]
    fn requests_are_taken_until_none_is_left() {
        let mut levels = vec![None];
        for _ in 0..2 {
            let (out, _) = charge(NOW, &plan(1, 0, true), &mut levels);
            assert!(matches!(out, ChargeReply::Charged { .. }), "{out:?}");
        }
        let before = levels[0].clone();
        let (out, _) = charge(NOW, &plan(1, 0, true), &mut levels);
        let ChargeReply::Denied { denied_mask, .. } = out else {
            panic!("{out:?}")
        };
        assert_eq!(denied_mask, DeniedChecks::from(1));
        assert_eq!(levels[0], before, "a denial writes nothing");
        let (out, _) = charge(NOW, &plan(0, 0, true), &mut levels);
        assert!(
            matches!(out, ChargeReply::Denied { .. }),
            "a check needs room"
        );
    }

    #[test]
    fn forced_tokens_go_into_debt_and_then_deny_checks() {
        let mut levels = vec![None];
        let (out, _) = charge(NOW, &plan(0, 250, false), &mut levels);
        assert_eq!(milli(&out), [2000, -150_000]);
        let (out, _) = charge(NOW, &plan(0, 0, true), &mut levels);
        let ChargeReply::Denied { denied_mask, .. } = out else {
            panic!("{out:?}")
        };
        assert_eq!(
            denied_mask,
            DeniedChecks::from(2),
            "the token bucket denies"
        );
        // 151 tokens refill at 100 a minute: room again after 90.6 s.
        let later = NOW + 91_000_000;
        let (out, _) = charge(later, &plan(0, 0, true), &mut levels);
        assert!(matches!(out, ChargeReply::Charged { .. }), "{out:?}");
    }
}
