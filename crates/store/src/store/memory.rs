//! The in-memory store: the default when no Redis is configured, so the service
//! starts anywhere. A map of keys, one lock, and key lifetimes around the
//! budget algorithm of [`crate::domain::budget`]: every operation takes the
//! lock, hands the algorithm what the keys hold, and keeps what it returns.
//! The keys and values are the ones the Lua scripts keep in Redis, so a
//! [`MemoryStore::snapshot`] compares with a Redis database key for key.
//!
//! Idle state expires as Redis keys would, and a sweep once per second of store
//! time drops it, keeping memory bounded however many ids arrive.
//!
//! Size: the `Store` implementation is one impl block, each operation a line
//! or two handing its keys to the algorithm; the rest lives in the submodules.

mod alerts;
mod ledger;
mod line;
mod samples;
mod sharded;
mod snapshot;

pub use snapshot::{NEVER, Stored};

use self::sharded::Sharded;
use super::keys::{Keys, TenantKeys};
use super::{
    AlertBacklog, AlertDone, AlertStore, LedgerStore, QueuedAlert, RenewReply, ReserveReply,
    Retention, SampleStore, Scope, SettleReply, Settlement, Store, StoreError, Usage,
};
use crate::domain::alert::Crossing;
use crate::domain::budget::alerts::AlertQueue;
use crate::domain::budget::ledger::{LedgerRow, Period, Row};
use crate::domain::budget::{
    ChargePlan, ChargeReply, Earlier, FastMap, Lease, Record, Settle, StoredLevel, charge::charge,
    renew::renew, reserve::reserve, settle::settle, status::status,
};
use crate::domain::mix::EstimatorSample;
use crate::domain::{Clock, LevelPlan, Readings, ReservePlan, SystemClock, TenantId};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

/// Budget state held in this process.
pub struct MemoryStore<C: Clock = SystemClock> {
    state: Mutex<Data>,
    clock: C,
    keys: Keys,
    retention: Retention,
    /// The lines of calls waiting for a shared level (`line`).
    lines: line::Lines,
}

/// Every key, as Redis would hold it, with its expiry (µs of the store's clock).
#[derive(Default)]
struct Data {
    levels: FastMap<String, StoredLevel>,
    /// Boxed: a record is 192 bytes, and a table of boxes moves and touches
    /// a fifth of the memory when it grows (docs/benchmarks.md).
    records: Sharded<(Box<Record>, i64)>,
    idempotency: Sharded<(String, i64)>,
    /// Estimator samples by key, newest first (Redis: a capped list).
    samples: HashMap<String, (VecDeque<EstimatorSample>, i64)>,
    /// Completions' output tokens by key, newest first (Redis: a capped list).
    outputs: HashMap<String, (VecDeque<u64>, i64)>,
    /// Usage-ledger hashes: rows by field.
    ledger: HashMap<String, (BTreeMap<String, Row>, i64)>,
    /// Threshold alerts to send, by tenant queue key (kept until sent).
    alerts: BTreeMap<String, AlertQueue>,
    /// The last alerts sent or dropped (JSON), newest first.
    alert_recent: VecDeque<String>,
    /// Alerts dropped: a full queue, or given up.
    alert_dropped: u64,
    next_sweep_us: i64,
}

impl MemoryStore<SystemClock> {
    /// A store on the wall clock.
    pub fn new(keys: Keys, retention: Retention) -> Self {
        Self::with_clock(keys, retention, SystemClock)
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store on `clock` (tests move a [`crate::domain::ManualClock`] by hand).
    pub fn with_clock(keys: Keys, retention: Retention, clock: C) -> Self {
        MemoryStore {
            state: Mutex::new(Data::default()),
            clock,
            keys,
            retention,
            lines: line::Lines::default(),
        }
    }

    /// Locks the data, first dropping everything expired if a second has passed.
    fn lock(&self, now: i64) -> MutexGuard<'_, Data> {
        let mut d = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now >= d.next_sweep_us {
            d.levels.retain(|_, l| l.expires_at_us > now);
            d.records.retain(|_, (_, exp)| *exp > now);
            d.idempotency.retain(|_, (_, exp)| *exp > now);
            d.samples.retain(|_, (_, exp)| *exp > now);
            d.outputs.retain(|_, (_, exp)| *exp > now);
            d.ledger.retain(|_, (_, exp)| *exp > now);
            d.next_sweep_us = now + 1_000_000;
        }
        d
    }

    /// Keys held (levels, records, idempotency entries): tests check that idle
    /// state disappears.
    pub fn key_count(&self) -> usize {
        let d = self.lock(self.clock.now_us());
        d.levels.len() + d.records.len() + d.idempotency.len()
    }

    /// reserve.lua, by [`crate::domain::budget::reserve`]. Keys are built
    /// before the lock is taken: the lock guards only the algorithm.
    fn reserve_now(&self, plan: &ReservePlan) -> ReserveReply {
        let id = &plan.id;
        let tenant = self.keys.of_tenant(&id.tenant);
        let idem_key = plan.idempotency_key.as_ref().map(|k| tenant.idempotency(k));
        let level_keys = self.level_keys(&tenant, Scope::of(id), &plan.levels);
        let (record_key, lease) = (tenant.record(id), Lease::of(id));
        let now = self.clock.now_us();
        let mut d = self.lock(now);
        let nonce = idem_key.as_ref().and_then(|k| d.idempotency_get(k, now));
        let earlier = nonce.as_ref().and_then(|nonce| {
            let earlier = id.with_nonce_b64(nonce)?;
            Some((nonce.as_str(), d.record_get(&tenant.record(&earlier), now)?))
        });
        let earlier = earlier
            .as_ref()
            .map(|(nonce, record)| Earlier { nonce, record });
        let mut taken = d.take(level_keys, now);
        let out = reserve(now, plan, earlier, taken.levels(), lease, &self.retention);
        self.fire(&mut d, &mut taken, &id.tenant, &out.crossings, now);
        d.put(taken);
        if let Some((record, ttl_ms)) = out.record {
            d.records
                .insert(record_key, (Box::new(record), expiry(now, ttl_ms)));
        }
        if let (Some(k), Some(ttl_ms)) = (idem_key, out.idempotency_ms) {
            d.idempotency
                .insert(k, (id.nonce_b64(), expiry(now, ttl_ms)));
        }
        if let Some(entry) = out.ledger {
            self.enter(&mut d, &tenant, id, entry, now);
        }
        out.reply
    }

    /// settle.lua, by [`crate::domain::budget::settle`].
    fn settle_now(&self, s: Settlement<'_>, how: Settle) -> SettleReply {
        let (out, mut d, now) = self.on_reservation(s, |now, record, levels, lease| {
            let (owner, retention) = (s.id.owner_tag(), &self.retention);
            let mut out = settle(now, how, owner, record, s.levels, levels, lease, retention);
            let kept = out.record.take();
            let crossings = std::mem::take(&mut out.crossings);
            (out, kept, crossings)
        });
        if let Some(sample) = out.sample {
            let key = self.keys.estimator(&s.id.estimator);
            samples::push_trimmed(&mut d.samples, key, sample, self.retention.samples, now);
        }
        if let (Some(sample), Settle::Commit(usage)) = (out.output_sample, how) {
            let key = self.keys.output_samples(&s.id.estimator, &s.id.tier);
            samples::push_trimmed(&mut d.outputs, key, sample, usage.output_kept, now);
        }
        if let Some(entry) = out.ledger {
            self.enter(&mut d, &self.keys.of_tenant(&s.id.tenant), s.id, entry, now);
        }
        out.reply
    }

    /// renew.lua, by [`crate::domain::budget::renew`].
    fn renew_now(&self, s: Settlement<'_>, ttl_ms: u64) -> RenewReply {
        let (reply, _held, _) = self.on_reservation(s, |now, record, levels, lease| {
            let (owner, retention) = (s.id.owner_tag(), &self.retention);
            let (reply, kept) = renew(
                now, owner, record, s.levels, levels, lease, ttl_ms, retention,
            );
            (reply, kept, Vec::new())
        });
        reply
    }

    /// Under the lock, hands `op` the time, the reservation's record and its
    /// levels (keys built before the lock), then keeps the levels and the
    /// record `op` returns (with its life in ms), firing the alert thresholds
    /// it crossed. Returns `op`'s answer, the still-held lock and the time.
    fn on_reservation<T>(
        &self,
        s: Settlement<'_>,
        op: impl FnOnce(
            i64,
            Option<&Record>,
            &mut [Option<StoredLevel>],
            Lease,
        ) -> (T, Option<(Record, u64)>, Vec<Crossing>),
    ) -> (T, MutexGuard<'_, Data>, i64) {
        let tenant = self.keys.of_tenant(&s.id.tenant);
        let (rkey, lease) = (tenant.record(s.id), Lease::of(s.id));
        let level_keys = self.level_keys(&tenant, Scope::of(s.id), s.levels);
        let now = self.clock.now_us();
        let mut d = self.lock(now);
        let record = d.record_get(&rkey, now);
        let mut taken = d.take(level_keys, now);
        let (answer, kept, crossings) = op(now, record.as_ref(), taken.levels(), lease);
        self.fire(&mut d, &mut taken, &s.id.tenant, &crossings, now);
        d.put(taken);
        if let Some((record, ttl_ms)) = kept {
            d.records
                .insert(rkey, (Box::new(record), expiry(now, ttl_ms)));
        }
        (answer, d, now)
    }

    /// status.lua, by [`crate::domain::budget::status`].
    fn status_now(&self, scope: Scope<'_>, levels: &[LevelPlan], exact: bool) -> Readings {
        let (keys, n) = self.level_keys(&self.keys.of_tenant(scope.tenant), scope, levels);
        let now = self.clock.now_us();
        let d = self.lock(now);
        let stored: Vec<Option<&StoredLevel>> = keys[..n]
            .iter()
            .map(|k| d.levels.get(k).filter(|l| l.expires_at_us > now))
            .collect();
        status(now, levels, &stored, exact)
    }

    /// charge.lua, by [`crate::domain::budget::charge`].
    fn charge_now(&self, plan: &ChargePlan) -> ChargeReply {
        let scope = Scope {
            tenant: &plan.tenant,
            user: plan.user.as_ref(),
            session: plan.session.as_ref(),
        };
        let level_keys = self.level_keys(&self.keys.of_tenant(scope.tenant), scope, &plan.levels);
        let now = self.clock.now_us();
        let mut d = self.lock(now);
        let mut taken = d.take(level_keys, now);
        let (out, crossings) = charge(now, plan, taken.levels());
        self.fire(&mut d, &mut taken, &plan.tenant, &crossings, now);
        d.put(taken);
        out
    }

    /// The keys of `levels` (at most [`MAX_LEVELS`]), and how many.
    fn level_keys(
        &self,
        tenant: &TenantKeys<'_>,
        scope: Scope<'_>,
        levels: &[LevelPlan],
    ) -> ([String; MAX_LEVELS], usize) {
        assert!(
            levels.len() <= MAX_LEVELS,
            "a plan has at most {MAX_LEVELS} levels"
        );
        let keys = std::array::from_fn(|i| {
            levels
                .get(i)
                .map_or_else(String::new, |lp| tenant.plan_level(lp, scope))
        });
        (keys, levels.len())
    }
}

/// The most entries a plan has: global, tenant, user and session, each with
/// a model group's slots.
const MAX_LEVELS: usize = 8;

/// A call's levels, taken out of the map for the algorithm, on the stack.
struct Taken {
    keys: [String; MAX_LEVELS],
    levels: [Option<StoredLevel>; MAX_LEVELS],
    n: usize,
}

impl Taken {
    /// The levels of the call, in plan order.
    fn levels(&mut self) -> &mut [Option<StoredLevel>] {
        &mut self.levels[..self.n]
    }
}

/// `now` (µs) plus `ttl_ms`.
fn expiry(now: i64, ttl_ms: u64) -> i64 {
    now + ttl_ms as i64 * 1000
}

impl Data {
    /// Takes the live level under each key out of the map for the algorithm,
    /// leaving an empty one in its place (cheaper than removing the entry).
    fn take(&mut self, (keys, n): ([String; MAX_LEVELS], usize), now: i64) -> Taken {
        let levels = std::array::from_fn(|i| {
            let key = keys[..n].get(i)?;
            let level = self.levels.get_mut(key)?;
            (level.expires_at_us > now).then(|| std::mem::take(level))
        });
        Taken { keys, levels, n }
    }

    /// Puts back what the algorithm left; an expired level it was not given
    /// and did not write goes.
    fn put(&mut self, taken: Taken) {
        let pairs = taken.keys.into_iter().zip(taken.levels).take(taken.n);
        for (k, level) in pairs {
            match (self.levels.get_mut(&k), level) {
                (Some(slot), Some(level)) => *slot = level,
                (None, Some(level)) => {
                    self.levels.insert(k, level);
                }
                (Some(_), None) => {
                    self.levels.remove(&k);
                }
                (None, None) => {}
            }
        }
    }

    fn record_get(&self, key: &str, now: i64) -> Option<Record> {
        self.records
            .get(key)
            .filter(|(_, exp)| *exp > now)
            .map(|(r, _)| Record::clone(r))
    }

    fn idempotency_get(&self, key: &str, now: i64) -> Option<String> {
        self.idempotency
            .get(key)
            .filter(|(_, exp)| *exp > now)
            .map(|(nonce, _)| nonce.clone())
    }
}

impl<C: Clock + Clone> Store for MemoryStore<C> {
    async fn reserve(&self, plan: &ReservePlan) -> Result<ReserveReply, StoreError> {
        Ok(self.reserve_now(plan))
    }

    fn now_us(&self) -> i64 {
        self.clock.now_us()
    }

    async fn commit(&self, s: Settlement<'_>, usage: Usage) -> Result<SettleReply, StoreError> {
        Ok(self.settle_now(s, Settle::Commit(usage)))
    }

    async fn refund(&self, s: Settlement<'_>) -> Result<SettleReply, StoreError> {
        Ok(self.settle_now(s, Settle::Refund))
    }

    async fn renew(&self, s: Settlement<'_>, ttl_ms: u64) -> Result<RenewReply, StoreError> {
        Ok(self.renew_now(s, ttl_ms))
    }

    async fn status(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> Result<Readings, StoreError> {
        Ok(self.status_now(scope, levels, exact))
    }

    async fn charge(&self, plan: &ChargePlan) -> Result<ChargeReply, StoreError> {
        Ok(self.charge_now(plan))
    }

    fn shadow(&self) -> Self {
        // Quotas in shadow keep no ledger: the enforced store's is the record.
        let retention = Retention {
            ledger: None,
            alert_queue: 0,
            ..self.retention
        };
        MemoryStore::with_clock(self.keys.shadow(), retention, self.clock.clone())
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "in-memory store (single process; state is lost on restart)".into()
    }
}

impl<C: Clock + Clone> SampleStore for MemoryStore<C> {
    async fn estimator_samples(
        &self,
        keys: &[String],
    ) -> Result<Vec<Vec<EstimatorSample>>, StoreError> {
        let now = self.clock.now_us();
        let d = self.lock(now);
        Ok(keys
            .iter()
            .map(|k| samples::read(&d.samples, &self.keys.estimator(k), now))
            .collect())
    }

    async fn output_samples(
        &self,
        pairs: &[(String, String)],
    ) -> Result<Vec<Vec<u64>>, StoreError> {
        let now = self.clock.now_us();
        let d = self.lock(now);
        Ok(pairs
            .iter()
            .map(|(k, tier)| samples::read(&d.outputs, &self.keys.output_samples(k, tier), now))
            .collect())
    }
}

impl<C: Clock + Clone> LedgerStore for MemoryStore<C> {
    async fn ledger(
        &self,
        tenant: &TenantId,
        periods: &[Period],
    ) -> Result<Vec<Vec<LedgerRow>>, StoreError> {
        Ok(self.ledger_rows(tenant, periods))
    }

    async fn ledger_keys(&self, hourly: bool) -> Result<Vec<(TenantId, Period)>, StoreError> {
        Ok(self.ledger_periods(hourly))
    }
}

impl<C: Clock + Clone> AlertStore for MemoryStore<C> {
    async fn claim_alerts(
        &self,
        max: usize,
        claim_ms: u64,
    ) -> Result<Vec<QueuedAlert>, StoreError> {
        Ok(self.claim_now(max, claim_ms))
    }

    async fn finish_alert(&self, alert: &QueuedAlert, done: AlertDone) -> Result<(), StoreError> {
        self.finish_now(alert, done);
        Ok(())
    }

    async fn alert_backlog(&self) -> Result<AlertBacklog, StoreError> {
        Ok(self.backlog_now())
    }

    async fn note_alert(&self, line: String, keep: usize) -> Result<(), StoreError> {
        self.lock(self.clock.now_us()).note_alert(line, keep);
        Ok(())
    }

    async fn recent_alerts(&self, n: usize) -> Result<Vec<String>, StoreError> {
        let d = self.lock(self.clock.now_us());
        Ok(d.alert_recent.iter().take(n).cloned().collect())
    }
}
