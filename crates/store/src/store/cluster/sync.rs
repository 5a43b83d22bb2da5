//! The shares' bookkeeping: locking them, the one sync with the global key
//! (`lua/global_lease.lua`) and what its answer changes, and the global
//! half's keys and readings.

use super::share::{self, Share};
use super::split::Split;
use super::{Inner, Shares};
use crate::domain::Clock;
use crate::domain::{LevelPlan, Readings, TenantId};
use crate::store::redis::{EntryAsk, LeaseCall};
use crate::store::{Scope, Store, StoreError};
use crate::telemetry;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

impl<C: Clock> Inner<C> {
    pub(super) fn now(&self) -> f64 {
        self.clock.now_us() as f64
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Shares> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the shares of `keys` (made if new), in order.
    pub(super) fn with_shares<R>(
        &self,
        keys: &[String],
        f: impl FnOnce(&mut [&mut Share]) -> R,
    ) -> R {
        let mut st = self.lock();
        let mut owned: Vec<Share> = keys
            .iter()
            .map(|k| st.by_key.remove(k).unwrap_or_default())
            .collect();
        let mut refs: Vec<&mut Share> = owned.iter_mut().collect();
        let out = f(&mut refs);
        for (k, s) in keys.iter().zip(owned) {
            st.by_key.insert(k.clone(), s);
        }
        out
    }

    /// One sync with the global key, when there is anything to ask, send or
    /// read; `observe` adds entries to read whatever they ask (a status
    /// read). With `unless_since`, a count of syncs finished: none is made if
    /// another finished since (its caller saw the shares before it). Returns
    /// whether a call was made.
    #[expect(
        clippy::too_many_lines,
        reason = "one sync round: ask, call, apply, and each failure path"
    )]
    pub(super) async fn sync(
        &self,
        observe: &[(String, LevelPlan)],
        unless_since: Option<u64>,
    ) -> Result<bool, StoreError> {
        let _one = self.sync.lock().await;
        if unless_since.is_some_and(|seen| self.synced.load(Ordering::Acquire) != seen) {
            return Ok(false);
        }
        let now = self.now();
        let (keys, asks, posts, deletes, read) = {
            let mut st = self.lock();
            let renew = now - st.last_sync >= 1e6;
            let mut keys = Vec::new();
            let mut asks: Vec<EntryAsk> = Vec::new();
            for (key, _) in observe {
                st.by_key.entry(key.clone()).or_default();
            }
            for (key, share) in st.by_key.iter_mut() {
                let observed = observe.iter().find(|(k, _)| k == key);
                let Some(lp) = share.plan().or(observed.map(|(_, lp)| lp)).cloned() else {
                    continue;
                };
                let ask = match share.ask(&lp, now, renew) {
                    Some(ask) => Some(ask),
                    None => observed.map(|_| share.observe(&lp, now)),
                };
                if let Some(ask) = ask {
                    keys.push(key.clone());
                    asks.push(ask);
                }
            }
            let read = st.by_key.values().any(Share::has_inflight);
            let posts = std::mem::take(&mut st.outbox);
            let deletes = std::mem::take(&mut st.matched);
            (keys, asks, posts, deletes, read)
        };
        if keys.is_empty() && posts.is_empty() && deletes.is_empty() && !read {
            return Ok(false);
        }
        let call = LeaseCall {
            keys: &keys,
            asks: &asks,
            replica: &self.replica,
            posts: &posts,
            deletes: &deletes,
            read,
        };
        telemetry::cluster_global_call();
        let result = self.tenants.lease_call(&call).await;
        // The answer is taken in at its own instant (a window may have ended).
        let now = self.now();
        let mut st = self.lock();
        st.last_sync = now;
        self.synced.fetch_add(1, Ordering::Release);
        match result {
            Ok(reply) => {
                for ((key, ask), grant) in keys.iter().zip(&asks).zip(&reply.grants) {
                    if let Some(share) = st.by_key.get_mut(key) {
                        share.apply(ask, grant, now);
                    }
                }
                for (field, exp, value) in reply.messages {
                    let mut mine = false;
                    for share in st.by_key.values_mut() {
                        mine |= share::renew(share, &field, exp);
                    }
                    if mine {
                        st.matched.push((field, value));
                    }
                }
                Ok(true)
            }
            Err(e) => {
                for (key, ask) in keys.iter().zip(&asks) {
                    if let Some(share) = st.by_key.get_mut(key) {
                        share.failed(ask, now);
                    }
                }
                st.outbox.extend(posts);
                st.matched.extend(deletes);
                Err(e)
            }
        }
    }

    /// The global keys of `split`'s entries.
    pub(super) fn keys_of(&self, split: &Split<'_>, tenant: &TenantId) -> Vec<String> {
        split
            .global
            .iter()
            .map(|lp| {
                let scope = Scope {
                    tenant,
                    user: None,
                    session: None,
                };
                self.tenants.keys().plan_level(lp, scope)
            })
            .collect()
    }

    /// The readings of the global entries as this replica sees them.
    pub(super) fn global_readings(&self, split: &Split<'_>, keys: &[String], now: f64) -> Readings {
        self.with_shares(keys, |shares| {
            let mut out = Vec::new();
            for (lp, share) in split.global.iter().zip(shares.iter()) {
                share.readings(lp, now, &mut out);
            }
            out
        })
    }

    /// The tenant half's readings, read (for a denial the global level
    /// decided, which never reached the tenant's slot).
    pub(super) async fn tenant_readings(
        &self,
        split: &Split<'_>,
        scope: Scope<'_>,
    ) -> Result<Readings, StoreError> {
        if split.tenant.is_empty() {
            return Ok(Vec::new());
        }
        self.tenants.status(scope, &split.tenant, false).await
    }
}
