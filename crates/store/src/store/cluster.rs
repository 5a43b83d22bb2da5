//! The Redis Cluster store: a [`RedisStore`] in the cluster layout for the
//! tenants' levels, and the global level as this replica's leased share
//! ([`share`]) — so no script touches two slots and no
//! reservation touches the global key.
//!
//! Every operation splits its plan: the global entries are decided here, in
//! memory, against the chunks held; the rest goes to the tenant's slot in one
//! script call as on a single Redis. A reservation takes its global cost
//! first and puts it back if the tenant level denies or the call fails
//! before reaching Redis; one that finds the share short syncs once (one
//! call to the global key, `lua/global_lease.lua`) and tries again before it
//! is denied. A background task syncs every [`SYNC_US`] when there is
//! budget to give back, debt to pay, slot messages to send or read, or a
//! share running low.
//!
//! - [`share`]: the share's arithmetic (take, put back, settle, what a sync
//!   asks and what its answer changes), pure: no I/O.
//! - `split`: which entries of a plan are global, and how the two halves'
//!   readings and denied checks go back into plan order.
//! - `sync`: the shares' lock and the sync with the global key.
//! - `take`: reserve and charge; `settle`: commit, refund, renew, status.

mod settle;
pub mod share;
mod split;
mod sync;
mod take;

use super::line::{Joined, Joining, Leave, LineStore, LineView, Standing, Ticket};
use super::redis::RedisStore;
use super::{
    AlertBacklog, AlertDone, AlertStore, ChargePlan, ChargeReply, LedgerStore, QueuedAlert,
    RenewReply, ReserveReply, SampleStore, Scope, SettleReply, Settlement, Store, StoreError,
    Usage,
};
use crate::domain::budget::Settle;
use crate::domain::budget::ledger::{LedgerRow, Period};
use crate::domain::mix::EstimatorSample;
use crate::domain::{Clock, LevelPlan, Readings, ReservePlan, SystemClock, TenantId};
use share::{SYNC_US, Share};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Budget state on a Redis Cluster.
pub struct ClusterStore<C: Clock + Clone = SystemClock> {
    inner: Arc<Inner<C>>,
    ticker: Option<tokio::task::AbortHandle>,
}

struct Inner<C> {
    tenants: RedisStore,
    state: Mutex<Shares>,
    /// One sync at a time.
    sync: tokio::sync::Mutex<()>,
    /// Syncs finished: a reservation that found its share short syncs only
    /// if none finished since it looked.
    synced: AtomicU64,
    clock: C,
    /// This replica's slots field in the global key.
    replica: String,
}

/// The shares by global key, and the slot messages on their way.
#[derive(Default)]
struct Shares {
    by_key: HashMap<String, Share>,
    /// Messages to post: lease field, new expiry (0: settled).
    outbox: Vec<(String, f64)>,
    /// Messages matched here, to delete: field, value read.
    matched: Vec<(String, Vec<u8>)>,
    /// When the last sync ran (µs).
    last_sync: f64,
}

impl ClusterStore<SystemClock> {
    /// The store over `tenants` (a [`RedisStore`] connected to a cluster).
    pub fn new(tenants: RedisStore) -> Self {
        Self::with_clock(tenants, SystemClock)
    }
}

impl<C: Clock + Clone> ClusterStore<C> {
    /// The store over `tenants`, its shares on `clock` (the test's, beside a
    /// clock key). Must be called within a tokio runtime: it starts the
    /// background sync, stopped when the store is dropped.
    pub fn with_clock(tenants: RedisStore, clock: C) -> Self {
        let inner = Arc::new(Inner {
            tenants,
            state: Mutex::new(Shares::default()),
            sync: tokio::sync::Mutex::new(()),
            synced: AtomicU64::new(0),
            clock,
            replica: format!("c{:016x}", rand::random::<u64>()),
        });
        let weak = Arc::downgrade(&inner);
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_micros(SYNC_US as u64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                if let Err(e) = inner.sync(&[], None).await {
                    tracing::debug!(error = %e, "global level sync failed; retrying");
                }
            }
        });
        ClusterStore {
            inner,
            ticker: Some(ticker.abort_handle()),
        }
    }

    /// The tenants' store.
    pub fn tenants(&self) -> &RedisStore {
        &self.inner.tenants
    }

    /// Whether the cluster answered the start-up checks.
    pub fn reachable(&self) -> bool {
        self.inner.tenants.reachable()
    }

    /// Syncs with the global level now (tests: what the background task does).
    pub async fn sync_now(&self) -> Result<(), StoreError> {
        self.inner.sync(&[], None).await.map(|_| ())
    }
}

impl<C> Drop for ClusterStore<C>
where
    C: Clock + Clone,
{
    fn drop(&mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
        }
    }
}

impl<C: Clock + Clone> Store for ClusterStore<C> {
    fn now_us(&self) -> i64 {
        self.inner.clock.now_us()
    }

    async fn reserve(&self, plan: &ReservePlan) -> Result<ReserveReply, StoreError> {
        self.inner.reserve(plan).await
    }

    async fn commit(&self, s: Settlement<'_>, usage: Usage) -> Result<SettleReply, StoreError> {
        self.inner.settle(s, Settle::Commit(usage)).await
    }

    async fn refund(&self, s: Settlement<'_>) -> Result<SettleReply, StoreError> {
        self.inner.settle(s, Settle::Refund).await
    }

    async fn renew(&self, s: Settlement<'_>, ttl_ms: u64) -> Result<RenewReply, StoreError> {
        self.inner.renew(s, ttl_ms).await
    }

    async fn status(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> Result<Readings, StoreError> {
        self.inner.status(scope, levels, exact).await
    }

    async fn charge(&self, plan: &ChargePlan) -> Result<ChargeReply, StoreError> {
        self.inner.charge(plan).await
    }

    fn shadow(&self) -> Self {
        ClusterStore::with_clock(self.inner.tenants.shadow(), self.inner.clock.clone())
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.inner.tenants.probe().await
    }

    fn describe(&self) -> String {
        format!(
            "{}; the global level leased in chunks (replica {})",
            self.inner.tenants.describe(),
            self.inner.replica
        )
    }
}

impl<C: Clock + Clone> SampleStore for ClusterStore<C> {
    async fn estimator_samples(
        &self,
        keys: &[String],
    ) -> Result<Vec<Vec<EstimatorSample>>, StoreError> {
        self.inner.tenants.estimator_samples(keys).await
    }

    async fn output_samples(
        &self,
        pairs: &[(String, String)],
    ) -> Result<Vec<Vec<u64>>, StoreError> {
        self.inner.tenants.output_samples(pairs).await
    }
}

impl<C: Clock + Clone> LedgerStore for ClusterStore<C> {
    async fn ledger(
        &self,
        tenant: &TenantId,
        periods: &[Period],
    ) -> Result<Vec<Vec<LedgerRow>>, StoreError> {
        self.inner.tenants.ledger(tenant, periods).await
    }

    async fn ledger_keys(&self, hourly: bool) -> Result<Vec<(TenantId, Period)>, StoreError> {
        self.inner.tenants.ledger_keys(hourly).await
    }
}

impl<C: Clock + Clone> AlertStore for ClusterStore<C> {
    async fn claim_alerts(
        &self,
        max: usize,
        claim_ms: u64,
    ) -> Result<Vec<QueuedAlert>, StoreError> {
        self.inner.tenants.claim_alerts(max, claim_ms).await
    }

    async fn finish_alert(&self, alert: &QueuedAlert, done: AlertDone) -> Result<(), StoreError> {
        self.inner.tenants.finish_alert(alert, done).await
    }

    async fn alert_backlog(&self) -> Result<AlertBacklog, StoreError> {
        self.inner.tenants.alert_backlog().await
    }

    async fn reindex_alerts(&self) -> Result<usize, StoreError> {
        self.inner.tenants.reindex_alerts().await
    }

    async fn note_alert(&self, line: String, keep: usize) -> Result<(), StoreError> {
        self.inner.tenants.note_alert(line, keep).await
    }

    async fn recent_alerts(&self, n: usize) -> Result<Vec<String>, StoreError> {
        self.inner.tenants.recent_alerts(n).await
    }
}

/// The lines live in slots of their own (`{q:<G>}`), one script call each;
/// there is no subscription on a cluster (owners find their turn by their
/// own timers and the once-a-second heartbeat).
impl<C: Clock + Clone> LineStore for ClusterStore<C> {
    async fn join(&self, j: &Joining<'_>) -> Result<Joined, StoreError> {
        self.inner.tenants.join(j).await
    }

    async fn standing(&self, t: &Ticket, owner: &str) -> Result<Standing, StoreError> {
        self.inner.tenants.standing(t, owner).await
    }

    async fn leave(&self, t: &Ticket, owner: &str, how: Leave) -> Result<LineView, StoreError> {
        self.inner.tenants.leave(t, owner, how).await
    }

    async fn wake(&self, line: &str, owner: &str) -> Result<LineView, StoreError> {
        self.inner.tenants.wake(line, owner).await
    }
}
