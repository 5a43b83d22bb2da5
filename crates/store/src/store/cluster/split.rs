//! A plan split in two: its global entries (decided by the replica's share)
//! and the rest (the tenant's slot), and the two halves' readings and denied
//! checks put back into plan order.

use crate::domain::budget::{DeniedChecks, Reclaimed};
use crate::domain::{Level, LevelPlan, Readings, ReservePlan};
use crate::store::{ChargeReply, ReserveReply};

/// A plan's entries, split.
pub(super) struct Split<'a> {
    /// The global entries, in plan order.
    pub global: Vec<&'a LevelPlan>,
    /// The others, in plan order.
    pub tenant: Vec<LevelPlan>,
    /// Per entry: global or not, and its checks (buckets, concurrency).
    entries: Vec<(bool, usize, usize)>,
}

impl<'a> Split<'a> {
    pub(super) fn of(levels: &'a [LevelPlan]) -> Self {
        let mut split = Split {
            global: Vec::new(),
            tenant: Vec::new(),
            entries: Vec::with_capacity(levels.len()),
        };
        for lp in levels {
            let global = lp.level == Level::Global;
            match global {
                true => split.global.push(lp),
                false => split.tenant.push(lp.clone()),
            }
            split
                .entries
                .push((global, lp.buckets.len(), lp.reading_count()));
        }
        split
    }

    /// The plan with only the tenant's entries (moved out of the split).
    pub(super) fn tenant_plan(&mut self, plan: &ReservePlan) -> ReservePlan {
        ReservePlan {
            id: plan.id.clone(),
            levels: std::mem::take(&mut self.tenant),
            model_group: plan.model_group.clone(),
            headroom: plan.headroom,
            price: plan.price,
            prompt_tokens: plan.prompt_tokens,
            max_output_tokens: plan.max_output_tokens,
            min_output_tokens: plan.min_output_tokens,
            estimated_prompt_tokens: plan.estimated_prompt_tokens,
            prompt_mix: plan.prompt_mix,
            learned_output: plan.learned_output,
            lease_ttl_ms: plan.lease_ttl_ms,
            idempotency_key: plan.idempotency_key.clone(),
            fingerprint: plan.fingerprint,
            declared: plan.declared,
        }
    }

    /// Plan-order positions of the global half's checks and the tenant
    /// half's (`buckets_only`: a charge counts buckets, not concurrency).
    fn maps(&self, buckets_only: bool) -> (Vec<usize>, Vec<usize>) {
        let (mut global, mut tenant) = (Vec::new(), Vec::new());
        let mut at = 0;
        for &(is_global, buckets, checks) in &self.entries {
            let n = if buckets_only { buckets } else { checks };
            let side = if is_global { &mut global } else { &mut tenant };
            side.extend(at..at + n);
            at += n;
        }
        (global, tenant)
    }

    /// Both halves' readings in plan order.
    pub(super) fn readings(&self, global: Readings, tenant: Readings) -> Readings {
        let (mut g, mut t) = (global.into_iter(), tenant.into_iter());
        let mut out = Vec::with_capacity(self.entries.iter().map(|e| e.2).sum());
        for &(is_global, _, checks) in &self.entries {
            let side = if is_global { &mut g } else { &mut t };
            out.extend(side.by_ref().take(checks));
        }
        out
    }

    /// The global half's short checks (indices among its checks) as plan checks.
    pub(super) fn global_checks(&self, short: &[usize]) -> DeniedChecks {
        remap(short.iter().copied(), &self.maps(false).0)
    }

    /// The global half's short buckets as a charge's plan buckets.
    pub(super) fn global_buckets(&self, short: &[usize]) -> DeniedChecks {
        remap(short.iter().copied(), &self.maps(true).0)
    }

    /// The tenant half's reply to a reservation in plan order, with the
    /// global half's readings and lapsed slots.
    pub(super) fn reserve_reply(
        &self,
        reply: ReserveReply,
        global: Readings,
        lapsed: u64,
    ) -> ReserveReply {
        let add = |mut r: Reclaimed| {
            r.add(Level::Global, lapsed);
            r
        };
        match reply {
            ReserveReply::Allowed {
                readings,
                granted_output,
                reserved_output,
                reclaimed,
            } => ReserveReply::Allowed {
                readings: self.readings(global, readings),
                granted_output,
                // The global share holds the whole grant (docs/cluster.md),
                // where it holds output at all.
                reserved_output: match self.global.iter().any(|g| g.holds_output()) {
                    true => granted_output,
                    false => reserved_output,
                },
                reclaimed: add(reclaimed),
            },
            ReserveReply::Denied {
                readings,
                denied_mask,
                reclaimed,
            } => {
                let map = self.maps(false).1;
                ReserveReply::Denied {
                    readings: self.readings(global, readings),
                    denied_mask: remap(set(&denied_mask, map.len()), &map),
                    reclaimed: add(reclaimed),
                }
            }
            ReserveReply::Replayed {
                nonce,
                tokens,
                lease_expires_in_ms,
                readings,
                reclaimed,
            } => ReserveReply::Replayed {
                nonce,
                tokens,
                lease_expires_in_ms,
                readings: self.readings(global, readings),
                reclaimed: add(reclaimed),
            },
            other => other,
        }
    }

    /// The tenant half's reply to a charge in plan order.
    pub(super) fn charge_reply(&self, reply: ChargeReply, global: Readings) -> ChargeReply {
        match reply {
            ChargeReply::Charged { readings } => ChargeReply::Charged {
                readings: self.readings(global, readings),
            },
            ChargeReply::Denied {
                readings,
                denied_mask,
            } => {
                let map = self.maps(true).1;
                ChargeReply::Denied {
                    readings: self.readings(global, readings),
                    denied_mask: remap(set(&denied_mask, map.len()), &map),
                }
            }
        }
    }
}

/// The checks of `mask` below `n`.
fn set(mask: &DeniedChecks, n: usize) -> impl Iterator<Item = usize> + '_ {
    (0..n).filter(|&i| mask.contains(i))
}

/// Checks `from` (a half's indices) at their plan positions `map`.
fn remap(from: impl Iterator<Item = usize>, map: &[usize]) -> DeniedChecks {
    let mut out = DeniedChecks::default();
    for i in from {
        if let Some(&at) = map.get(i) {
            out.insert(at);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BucketSpec, Dimension, Reading};

    fn entry(level: Level, buckets: usize, concurrency: Option<u64>) -> LevelPlan {
        let b = BucketSpec {
            level,
            dimension: Dimension::Requests,
            limit: 10,
            period_secs: 60,
            group: 0,
            window: None,
            alert_at: Default::default(),
        };
        LevelPlan {
            level,
            group: None,
            slots: false,
            buckets: vec![b; buckets],
            concurrency,
            overrun: None,
            idle_secs: None,
        }
    }

    #[test]
    fn halves_go_back_into_plan_order() {
        let levels = vec![
            entry(Level::Global, 1, Some(5)),
            entry(Level::Tenant, 2, None),
            entry(Level::User, 1, Some(2)),
        ];
        let split = Split::of(&levels);
        assert_eq!((split.global.len(), split.tenant.len()), (1, 2));
        let r = |m| Reading::Bucket { milli: m };
        let readings = split.readings(vec![r(0), r(1)], vec![r(2), r(3), r(4), r(5)]);
        assert_eq!(readings, vec![r(0), r(1), r(2), r(3), r(4), r(5)]);
        let short = split.global_checks(&[1]);
        assert!(short.contains(1) && !short.contains(0));
        let tenant_mask = DeniedChecks::from(0b1000);
        let reply = split.reserve_reply(
            ReserveReply::Denied {
                readings: vec![r(2), r(3), r(4), r(5)],
                denied_mask: tenant_mask,
                reclaimed: Reclaimed::default(),
            },
            vec![r(0), r(1)],
            2,
        );
        let ReserveReply::Denied {
            denied_mask,
            reclaimed,
            ..
        } = reply
        else {
            panic!("denied")
        };
        assert!(denied_mask.contains(5), "the user's concurrency check");
        assert_eq!(reclaimed.at(Level::Global), 2);
        // A charge counts buckets only: the user's bucket is plan bucket 3.
        assert!(split.global_buckets(&[0]).contains(0));
    }
}
