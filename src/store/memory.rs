//! The in-memory store: the default when no Redis is configured, so the service
//! starts anywhere. One process, one mutex, the same keys, fields, TTLs and
//! arithmetic as the Lua scripts (each function names the script it mirrors), so
//! the conformance suite can hold both to one behaviour.
//!
//! Idle state expires exactly as Redis keys would; a sweep once per second of
//! store time drops it, keeping memory bounded however many ids arrive.

use super::keys::{Keys, bucket_field, lease_field};
use super::{
    RenewReply, ReserveReply, Retention, Scope, SettleReply, Settled, Settlement, Store, StoreError,
};
use crate::domain::bucket::to_milli;
use crate::domain::{
    BucketSpec, Clock, Dimension, LevelPlan, Reading, Readings, ReservePlan, SystemClock,
};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Budget state held in this process.
pub struct MemoryStore<C: Clock = SystemClock> {
    state: Mutex<State>,
    clock: C,
    keys: Keys,
    retention: Retention,
}

#[derive(Default)]
struct State {
    levels: HashMap<String, LevelState>,
    records: HashMap<String, Record>,
    idempotency: HashMap<String, (String, i64)>,
    next_sweep_us: i64,
}

/// One level hash (see `store::keys` for its fields).
#[derive(Default)]
struct LevelState {
    t: Option<i64>,
    buckets: HashMap<String, f64>,
    leases: HashMap<String, i64>,
    n: i64,
    e: Option<i64>,
    expires_at: i64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RecordState {
    Reserved,
    Committed,
    Refunded,
}

/// One reservation record, as the `R <cost> <exp> <mask> <owner> <fp> <amount>` string in Redis.
#[derive(Clone)]
struct Record {
    state: RecordState,
    cost: u64,
    lease_expires_us: i64,
    mask: u8,
    owner: u64,
    fingerprint: u64,
    amount: i64,
    expires_at: i64,
}

/// What the read phase of a reservation learned about one level.
struct LevelRead {
    key: String,
    fresh: bool,
    levels: Vec<f64>,
    n: i64,
    e: Option<i64>,
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
            state: Mutex::new(State::default()),
            clock,
            keys,
            retention,
        }
    }

    /// Locks the state, first dropping everything expired if a second has passed.
    fn lock(&self, now: i64) -> MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now >= st.next_sweep_us {
            st.levels.retain(|_, l| l.expires_at > now);
            st.records.retain(|_, r| r.expires_at > now);
            st.idempotency.retain(|_, (_, exp)| *exp > now);
            st.next_sweep_us = now + 1_000_000;
        }
        st
    }

    /// Number of keys held (levels, records, idempotency entries), for tests
    /// that check idle state disappears.
    pub fn key_count(&self) -> usize {
        let st = self.lock(self.clock.now_us());
        st.levels.len() + st.records.len() + st.idempotency.len()
    }

    fn reserve_now(&self, plan: &ReservePlan) -> ReserveReply {
        let now = self.clock.now_us();
        let mut st = self.lock(now);
        let id = &plan.id;
        let idem_key = plan
            .idempotency_key
            .as_ref()
            .map(|k| self.keys.idempotency(&id.tenant, k));

        // reserve.lua: an earlier reservation under the same idempotency key?
        let mut replay = None;
        if let Some(nonce) = idem_key.as_ref().and_then(|k| st.idempotency_get(k, now)) {
            let earlier = id.with_nonce_b64(&nonce);
            let rec = earlier.and_then(|e| st.record_get(&self.keys.record(&e), now));
            if let Some(rec) = rec {
                if rec.fingerprint != plan.fingerprint {
                    return ReserveReply::IdempotencyConflict;
                }
                let left = ceil_ms(rec.lease_expires_us - now).max(0) as u64;
                replay = Some((nonce, rec.cost, left));
            }
        }

        // Read and check every level.
        let mut reads = Vec::with_capacity(plan.levels.len());
        let (mut denied, mut bit) = (0u64, 1u64);
        for lp in &plan.levels {
            let key = self.keys.level(lp.level, &id.tenant, id.user.as_ref());
            let level = st.level_get(&key, now);
            let fresh = level.as_ref().is_none_or(|l| l.t.is_none());
            let mut levels = Vec::with_capacity(lp.buckets.len());
            for b in &lp.buckets {
                let l = current_level(level.as_deref(), b, now);
                if l < b.cost(plan.tokens) as f64 {
                    denied |= bit;
                }
                bit <<= 1;
                levels.push(l);
            }
            let (mut n, mut e) = (0, None);
            if let Some(limit) = lp.concurrency {
                if let Some(level) = level {
                    (n, e) = (level.n, level.e);
                    if e.is_some_and(|e| now >= e) {
                        (n, e) = level.reclaim(now);
                    }
                }
                if n >= limit as i64 {
                    denied |= bit;
                }
                bit <<= 1;
            }
            reads.push(LevelRead {
                key,
                fresh,
                levels,
                n,
                e,
            });
        }

        if let Some((nonce, tokens, lease_expires_in_ms)) = replay {
            return ReserveReply::Replayed {
                nonce,
                tokens,
                lease_expires_in_ms,
                readings: readings(&plan.levels, &reads, now),
            };
        }
        if denied != 0 {
            return ReserveReply::Denied {
                readings: readings(&plan.levels, &reads, now),
                denied_mask: denied,
            };
        }

        // Everything fits: take it.
        let lease_ttl = plan.lease_ttl_ms as i64 * 1000;
        let exp = now + lease_ttl;
        let lease = lease_field(id);
        for (lp, read) in plan.levels.iter().zip(&mut reads) {
            let level = st.levels.entry(read.key.clone()).or_default();
            level.t = Some(now);
            let mut ttl = 0.0f64;
            for (b, l) in lp.buckets.iter().zip(&mut read.levels) {
                *l -= b.cost(plan.tokens) as f64;
                level.buckets.insert(bucket_field(b), *l);
                ttl = ttl.max(until_full_us(b, *l));
            }
            if lp.concurrency.is_some() {
                read.n += 1;
                read.e = Some(read.e.map_or(exp, |e| e.min(exp)));
                level.n = read.n;
                level.e = read.e;
                level.leases.insert(lease.clone(), exp);
                ttl = ttl.max(lease_ttl as f64);
            }
            level.expire(now, ttl_ms(ttl), !read.fresh);
        }
        st.records.insert(
            self.keys.record(id),
            Record {
                state: RecordState::Reserved,
                cost: plan.tokens,
                lease_expires_us: exp,
                mask: plan.lease_mask(),
                owner: id.owner_tag(),
                fingerprint: plan.fingerprint,
                amount: 0,
                expires_at: now + (plan.lease_ttl_ms + self.retention.record_ms) as i64 * 1000,
            },
        );
        if let Some(k) = idem_key {
            let exp = now + self.retention.idempotency_ms as i64 * 1000;
            st.idempotency.insert(k, (id.nonce_b64(), exp));
        }
        ReserveReply::Allowed {
            readings: readings(&plan.levels, &reads, now),
        }
    }

    /// settle.lua.
    fn settle_now(&self, s: Settlement<'_>, refund: bool, actual: u64) -> SettleReply {
        let now = self.clock.now_us();
        let mut st = self.lock(now);
        let rkey = self.keys.record(s.id);
        let Some(rec) = st
            .record_get(&rkey, now)
            .filter(|r| r.owner == s.id.owner_tag())
        else {
            return SettleReply::NotFound;
        };
        match rec.state {
            RecordState::Committed => {
                return SettleReply::AlreadySettled(Settled::Committed(rec.amount));
            }
            RecordState::Refunded => {
                return SettleReply::AlreadySettled(Settled::Refunded(rec.amount as u64));
            }
            RecordState::Reserved => {}
        }
        let (dtok, dreq) = if refund {
            (-(rec.cost as i64), -1)
        } else {
            (actual as i64 - rec.cost as i64, 0)
        };
        let lease = lease_field(s.id);
        for lp in s.levels {
            let key = self.keys.level(lp.level, &s.id.tenant, s.id.user.as_ref());
            let touched: Vec<(&BucketSpec, i64)> = lp
                .buckets
                .iter()
                .map(|b| {
                    (
                        b,
                        if b.dimension == Dimension::Tokens {
                            dtok
                        } else {
                            dreq
                        },
                    )
                })
                .filter(|(_, d)| *d != 0)
                .collect();
            if !touched.is_empty() {
                let existed = st.level_get(&key, now).is_some_and(|l| l.t.is_some());
                let level = st.levels.entry(key.clone()).or_default();
                let mut ttl = 0.0f64;
                let mut settled = Vec::with_capacity(touched.len());
                for (b, d) in &touched {
                    let l = b.settle(current_level(Some(level), b, now), *d);
                    settled.push((bucket_field(b), l));
                    ttl = ttl.max(until_full_us(b, l));
                }
                level.t = Some(now);
                level.buckets.extend(settled);
                level.expire(now, ttl_ms(ttl), existed);
            }
            if rec.mask & lp.level.bit() != 0
                && let Some(level) = st.level_get(&key, now)
                && level.leases.remove(&lease).is_some()
            {
                level.n -= 1;
            }
        }
        let (state, amount, settled) = if refund {
            (
                RecordState::Refunded,
                rec.cost as i64,
                Settled::Refunded(rec.cost),
            )
        } else {
            (RecordState::Committed, dtok, Settled::Committed(dtok))
        };
        st.records.insert(
            rkey,
            Record {
                state,
                amount,
                expires_at: now + self.retention.record_ms as i64 * 1000,
                ..rec
            },
        );
        SettleReply::Applied(settled)
    }

    /// renew.lua.
    fn renew_now(&self, s: Settlement<'_>, ttl_ms: u64) -> RenewReply {
        let now = self.clock.now_us();
        let mut st = self.lock(now);
        let rkey = self.keys.record(s.id);
        let Some(rec) = st
            .record_get(&rkey, now)
            .filter(|r| r.owner == s.id.owner_tag())
        else {
            return RenewReply::NotFound;
        };
        if rec.state != RecordState::Reserved {
            return RenewReply::AlreadySettled;
        }
        if rec.lease_expires_us <= now {
            return RenewReply::Expired;
        }
        let exp = now + ttl_ms as i64 * 1000;
        let lease = lease_field(s.id);
        for lp in s.levels {
            let key = self.keys.level(lp.level, &s.id.tenant, s.id.user.as_ref());
            if rec.mask & lp.level.bit() != 0
                && let Some(level) = st.level_get(&key, now)
                && let Some(held) = level.leases.get_mut(&lease)
            {
                *held = exp;
                level.expire(now, ttl_ms as i64 + 1000, true);
            }
        }
        st.records.insert(
            rkey,
            Record {
                lease_expires_us: exp,
                expires_at: now + (ttl_ms + self.retention.record_ms) as i64 * 1000,
                ..rec
            },
        );
        RenewReply::Renewed {
            expires_in_ms: ttl_ms,
        }
    }

    /// status.lua.
    fn status_now(&self, scope: Scope<'_>, levels: &[LevelPlan]) -> Readings {
        let now = self.clock.now_us();
        let mut st = self.lock(now);
        let mut reads = Vec::with_capacity(levels.len());
        for lp in levels {
            let key = self.keys.level(lp.level, scope.tenant, scope.user);
            let level = st.level_get(&key, now);
            let level = level.as_deref();
            let values = lp
                .buckets
                .iter()
                .map(|b| current_level(level, b, now))
                .collect();
            let (mut n, mut e) = level.map_or((0, None), |l| (l.n, l.e));
            if lp.concurrency.is_some()
                && let Some(l) = level
                && e.is_some_and(|e| now >= e)
            {
                (n, e) = l.live_leases(now);
            }
            reads.push(LevelRead {
                key,
                fresh: false,
                levels: values,
                n,
                e,
            });
        }
        readings(levels, &reads, now)
    }
}

impl State {
    fn level_get(&mut self, key: &str, now: i64) -> Option<&mut LevelState> {
        if self.levels.get(key).is_some_and(|l| l.expires_at <= now) {
            self.levels.remove(key);
        }
        self.levels.get_mut(key)
    }

    fn record_get(&mut self, key: &str, now: i64) -> Option<Record> {
        self.records
            .get(key)
            .filter(|r| r.expires_at > now)
            .cloned()
    }

    fn idempotency_get(&self, key: &str, now: i64) -> Option<String> {
        self.idempotency
            .get(key)
            .filter(|(_, exp)| *exp > now)
            .map(|(nonce, _)| nonce.clone())
    }
}

impl LevelState {
    /// reserve.lua `reclaim`: drops expired leases, recounts, finds the earliest.
    fn reclaim(&mut self, now: i64) -> (i64, Option<i64>) {
        self.leases.retain(|_, exp| *exp > now);
        (self.n, self.e) = self.live_leases(now);
        (self.n, self.e)
    }

    /// Live leases and the earliest expiry among them.
    fn live_leases(&self, now: i64) -> (i64, Option<i64>) {
        let live = self.leases.values().filter(|&&exp| exp > now);
        live.fold((0, None), |(n, e), &exp| {
            (n + 1, Some(e.map_or(exp, |e: i64| e.min(exp))))
        })
    }

    /// `PEXPIRE key ms [GT]`: only ever lengthens the life of an existing key.
    fn expire(&mut self, now: i64, ms: i64, only_longer: bool) {
        let at = now + ms * 1000;
        self.expires_at = if only_longer {
            self.expires_at.max(at)
        } else {
            at
        };
    }
}

/// A bucket's level now: a missing bucket is full; otherwise refilled since `@t`.
fn current_level(level: Option<&LevelState>, b: &BucketSpec, now: i64) -> f64 {
    let Some(level) = level else {
        return b.limit as f64;
    };
    match level.buckets.get(&bucket_field(b)) {
        Some(&l) => b.refill(l, now - level.t.unwrap_or(now)),
        None => b.limit as f64,
    }
}

/// Lua: `(lim - l) * per / lim`, in µs, unrounded.
fn until_full_us(b: &BucketSpec, l: f64) -> f64 {
    (b.limit as f64 - l) * b.period_us() as f64 / b.limit as f64
}

/// Lua: `math.ceil(ttl / 1000) + 1000`.
fn ttl_ms(ttl_us: f64) -> i64 {
    (ttl_us / 1000.0).ceil() as i64 + 1000
}

/// Lua: `math.ceil(us / 1000)`.
fn ceil_ms(us: i64) -> i64 {
    (us as f64 / 1000.0).ceil() as i64
}

fn readings(levels: &[LevelPlan], reads: &[LevelRead], now: i64) -> Readings {
    let mut out = Vec::with_capacity(levels.iter().map(LevelPlan::reading_count).sum());
    for (lp, read) in levels.iter().zip(reads) {
        out.extend(
            read.levels
                .iter()
                .map(|&l| Reading::Bucket { milli: to_milli(l) }),
        );
        if lp.concurrency.is_some() {
            out.push(Reading::Concurrency {
                active: read.n.max(0) as u64,
                earliest_expiry_ms: read.e.map_or(0, |e| ceil_ms(e - now).max(0) as u64),
            });
        }
    }
    out
}

impl<C: Clock> Store for MemoryStore<C> {
    async fn reserve(&self, plan: &ReservePlan) -> Result<ReserveReply, StoreError> {
        Ok(self.reserve_now(plan))
    }

    async fn commit(
        &self,
        s: Settlement<'_>,
        actual_tokens: u64,
    ) -> Result<SettleReply, StoreError> {
        Ok(self.settle_now(s, false, actual_tokens))
    }

    async fn refund(&self, s: Settlement<'_>) -> Result<SettleReply, StoreError> {
        Ok(self.settle_now(s, true, 0))
    }

    async fn renew(&self, s: Settlement<'_>, ttl_ms: u64) -> Result<RenewReply, StoreError> {
        Ok(self.renew_now(s, ttl_ms))
    }

    async fn status(&self, scope: Scope<'_>, levels: &[LevelPlan]) -> Result<Readings, StoreError> {
        Ok(self.status_now(scope, levels))
    }

    fn describe(&self) -> String {
        "in-memory store (single process; state is lost on restart)".into()
    }
}
