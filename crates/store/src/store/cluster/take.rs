//! Reserve and charge on a cluster: the global cost taken from the shares
//! first (one sync and a second try when they fall short), then the tenant's
//! slot; the global cost put back when the tenant level denies or the call
//! surely failed.

use super::Inner;
use super::share::{self, Need};
use super::split::Split;
use crate::domain::Clock;
use crate::domain::{Level, ReservePlan};
use crate::store::keys::lease_field;
use crate::store::{ChargePlan, ChargeReply, Reclaimed, ReserveReply, Scope, Store, StoreError};
use crate::telemetry;
use std::sync::atomic::Ordering;

/// Tries at taking from the shares, each after a sync (its own or another's).
const MAX_TRIES: usize = 4;

impl<C: Clock> Inner<C> {
    #[expect(
        clippy::too_many_lines,
        reason = "the tenant slot's call with the global share's take and put-back around it"
    )]
    pub(super) async fn reserve(&self, plan: &ReservePlan) -> Result<ReserveReply, StoreError> {
        let mut split = Split::of(&plan.levels);
        if split.global.is_empty() {
            return self.tenants.reserve(plan).await;
        }
        telemetry::cluster_global_decision();
        let keys = self.keys_of(&split, &plan.id.tenant);
        let need = Need::of(plan);
        let lease = lease_field(&plan.id);
        let mut reclaimed = 0;
        let (mut synced, mut tries) = (false, 0);
        let taken = loop {
            let seen = self.synced.load(Ordering::Acquire);
            let now = self.now();
            let exp = now + plan.lease_ttl_ms as f64 * 1000.0;
            let (result, lapsed) = self.with_shares(&keys, |shares| {
                share::take(&split.global, shares, &need, &lease, exp, now)
            });
            reclaimed += lapsed;
            match result {
                Ok(taken) => break taken,
                // Short: sync (or wait for the sync under way) and try again;
                // denied once a sync of its own found the global key short too.
                Err(_) if !synced && tries < MAX_TRIES => {
                    tries += 1;
                    synced = self.sync(&[], Some(seen)).await?;
                }
                Err(short) => {
                    let tenant = self.tenant_readings(&split, Scope::of(&plan.id)).await?;
                    let global = self.global_readings(&split, &keys, self.now());
                    let mut r = Reclaimed::default();
                    r.add(Level::Global, reclaimed);
                    return Ok(ReserveReply::Denied {
                        readings: split.readings(global, tenant),
                        denied_mask: split.global_checks(&short),
                        reclaimed: r,
                    });
                }
            }
        };
        let mut inner = split.tenant_plan(plan);
        inner.max_output_tokens = taken.grant as u64;
        inner.min_output_tokens = plan.min_output_tokens.min(inner.max_output_tokens);
        let result = self.tenants.reserve(&inner).await;
        let now = self.now();
        let put_back = |granted: Option<f64>| {
            self.with_shares(&keys, |shares| {
                share::put_back(&split.global, shares, &taken, &need, granted, now)
            })
        };
        let reply = match result {
            // It may have been taken: keep the global cost (never overspent).
            Err(e @ (StoreError::Unanswered(_) | StoreError::Protocol(_))) => return Err(e),
            Err(e) => {
                put_back(None);
                return Err(e);
            }
            Ok(reply) => reply,
        };
        match &reply {
            ReserveReply::Allowed { granted_output, .. } => put_back(Some(*granted_output as f64)),
            _ => put_back(None),
        }
        let global = self.global_readings(&split, &keys, now);
        Ok(split.reserve_reply(reply, global, reclaimed))
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the tenant slot's charge with the global share's charge and undo around it"
    )]
    pub(super) async fn charge(&self, plan: &ChargePlan) -> Result<ChargeReply, StoreError> {
        let mut split = Split::of(&plan.levels);
        if split.global.is_empty() {
            return self.tenants.charge(plan).await;
        }
        telemetry::cluster_global_decision();
        let keys = self.keys_of(&split, &plan.tenant);
        let cost = |b: &crate::domain::BucketSpec| plan.cost(b.dimension) as f64;
        let (mut synced, mut tries) = (false, 0);
        let took = loop {
            let seen = self.synced.load(Ordering::Acquire);
            let now = self.now();
            let result = self.with_shares(&keys, |shares| {
                share::charge(&split.global, shares, cost, plan.enforce, now)
            });
            match result {
                Ok(took) => break took,
                // Short: sync (or wait for the sync under way) and try again;
                // denied once a sync of its own found the global key short too.
                Err(_) if !synced && tries < MAX_TRIES => {
                    tries += 1;
                    synced = self.sync(&[], Some(seen)).await?;
                }
                Err(short) => {
                    let tenant = self
                        .tenant_readings(
                            &split,
                            Scope {
                                tenant: &plan.tenant,
                                user: plan.user.as_ref(),
                                session: plan.session.as_ref(),
                            },
                        )
                        .await?;
                    let global = self.global_readings(&split, &keys, self.now());
                    return Ok(ChargeReply::Denied {
                        readings: split.readings(global, tenant),
                        denied_mask: split.global_buckets(&short),
                    });
                }
            }
        };
        let inner = ChargePlan {
            tenant: plan.tenant.clone(),
            user: plan.user.clone(),
            session: plan.session.clone(),
            levels: std::mem::take(&mut split.tenant),
            requests: plan.requests,
            tokens: plan.tokens,
            enforce: plan.enforce,
        };
        let result = self.tenants.charge(&inner).await;
        let now = self.now();
        let uncharge = || {
            self.with_shares(&keys, |shares| {
                share::uncharge(&split.global, shares, &took, now)
            })
        };
        let reply = match result {
            Err(e @ (StoreError::Unanswered(_) | StoreError::Protocol(_))) => return Err(e),
            Err(e) => {
                uncharge();
                return Err(e);
            }
            Ok(reply) => reply,
        };
        if matches!(reply, ChargeReply::Denied { .. }) {
            uncharge();
        }
        let global = self.global_readings(&split, &keys, now);
        Ok(split.charge_reply(reply, global))
    }
}
