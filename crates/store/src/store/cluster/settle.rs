//! Settle, renew and status on a cluster: the tenant's slot first, then the
//! global half — a settlement's deltas moved in the shares, the global slot
//! freed (or renewed) here or by a message to the replica that leased it, and
//! the global readings refreshed for a status read.

use super::Inner;
use super::share;
use super::split::Split;
use crate::domain::Clock;
use crate::domain::budget::{Deltas, Settle};
use crate::domain::{Level, LevelPlan, Readings, ReservationId};
use crate::store::keys::lease_field;
use crate::store::{RenewReply, Scope, SettleReply, Settlement, Store, StoreError};

impl<C: Clock> Inner<C> {
    pub(super) async fn settle(
        &self,
        s: Settlement<'_>,
        how: Settle,
    ) -> Result<SettleReply, StoreError> {
        if s.levels.iter().all(|lp| lp.level != Level::Global) {
            return match how {
                Settle::Commit(usage) => self.tenants.commit(s, usage).await,
                Settle::Refund => self.tenants.refund(s).await,
            };
        }
        let split = Split::of(s.levels);
        let inner = Settlement {
            id: s.id,
            levels: &split.tenant,
        };
        let reply = match how {
            Settle::Commit(usage) => self.tenants.commit(inner, usage).await?,
            Settle::Refund => self.tenants.refund(inner).await?,
        };
        if let Some(deltas) = share::deltas(how, &reply) {
            self.settled(&split, s.id, deltas, 0.0);
        }
        Ok(reply)
    }

    /// Moves the shares by a settlement and frees (or renews to `exp`, µs) the
    /// reservation's global slots: here if this replica leased them, else by
    /// a message to the one that did.
    fn settled(&self, split: &Split<'_>, id: &ReservationId, deltas: Deltas, exp: f64) {
        let keys = self.keys_of(split, &id.tenant);
        let lease = lease_field(id);
        let now = self.now();
        let elsewhere = self.with_shares(&keys, |shares| {
            share::settle(&split.global, shares, deltas, now);
            let mut elsewhere = false;
            for (lp, share) in split.global.iter().zip(shares.iter_mut()) {
                if lp.concurrency.is_some() {
                    elsewhere |= !share::renew(share, &lease, exp);
                }
            }
            elsewhere
        });
        if elsewhere {
            self.lock().outbox.push((lease, exp));
        }
    }

    pub(super) async fn renew(
        &self,
        s: Settlement<'_>,
        ttl_ms: u64,
    ) -> Result<RenewReply, StoreError> {
        if s.levels.iter().all(|lp| lp.level != Level::Global) {
            return self.tenants.renew(s, ttl_ms).await;
        }
        let split = Split::of(s.levels);
        let inner = Settlement {
            id: s.id,
            levels: &split.tenant,
        };
        let reply = self.tenants.renew(inner, ttl_ms).await?;
        if let RenewReply::Renewed { expires_in_ms } = reply
            && !split.global.is_empty()
        {
            let exp = self.now() + expires_in_ms as f64 * 1000.0;
            self.settled(&split, s.id, Deltas::default(), exp);
        }
        Ok(reply)
    }

    pub(super) async fn status(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> Result<Readings, StoreError> {
        let split = Split::of(levels);
        if split.global.is_empty() {
            return self.tenants.status(scope, levels, exact).await;
        }
        let tenant = match split.tenant.is_empty() {
            true => Vec::new(),
            false => self.tenants.status(scope, &split.tenant, exact).await?,
        };
        let keys = self.keys_of(&split, scope.tenant);
        let observe: Vec<(String, LevelPlan)> = keys
            .iter()
            .cloned()
            .zip(split.global.iter().map(|lp| (*lp).clone()))
            .collect();
        self.sync(&observe, None).await?;
        let global = self.global_readings(&split, &keys, self.now());
        Ok(split.readings(global, tenant))
    }
}
