//! The in-memory store: the default when no Redis is configured, so the service
//! starts anywhere. One process, one mutex, and the same keys, level states,
//! key lifetimes and arithmetic as the Lua scripts — each function names the
//! script it mirrors, step for step — so the conformance suite can hold both
//! stores to one behaviour.
//!
//! Idle state expires as Redis keys would, and a sweep once per second of store
//! time drops it, keeping memory bounded however many ids arrive.
//!
//! Size: past 400 lines because it still ports the Lua arithmetic itself;
//! issue 11 replaces that with the domain's one algorithm, leaving a map, a lock
//! and TTLs.

use super::keys::{Keys, lease_field};
use super::state::{self, BucketState, LevelState, bucket_id, ceil_ms};
use super::{
    Reclaimed, RenewReply, ReserveReply, Retention, Scope, SettleReply, Settled, Settlement, Store,
    StoreError,
};
use crate::domain::{Clock, Dimension, LevelPlan, Readings, ReservePlan, SystemClock};
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

/// A key's longest life (µs), however deep its debt: the scripts' `MAX_TTL`.
const MAX_TTL_US: f64 = 7_776_000_000_000.0;
/// Estimator samples live this long past the last one (µs): settle.lua's PEXPIRE.
const SAMPLES_TTL_US: i64 = 2_592_000_000_000;
/// Buckets of other configurations a state keeps: the scripts' `MAX_FOREIGN`.
const MAX_FOREIGN: usize = 16;

/// Budget state held in this process.
pub struct MemoryStore<C: Clock = SystemClock> {
    state: Mutex<Data>,
    clock: C,
    keys: Keys,
    retention: Retention,
}

#[derive(Default)]
struct Data {
    levels: HashMap<String, LevelEntry>,
    records: HashMap<String, Record>,
    idempotency: HashMap<String, (String, i64)>,
    /// Estimator samples by key, newest first, and when they expire (Redis: a
    /// capped list kept 30 days past its last sample).
    samples: HashMap<String, (VecDeque<f64>, i64)>,
    next_sweep_us: i64,
}

/// One level hash: its `s` field and its lease fields.
#[derive(Default)]
struct LevelEntry {
    state: LevelState,
    leases: HashMap<String, f64>,
    expires_at: i64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RecordState {
    Reserved,
    Committed,
    Refunded,
}

/// One reservation record (in Redis: `'R' | cost, expiry | mask, owner, fp | amount`).
#[derive(Clone)]
struct Record {
    state: RecordState,
    cost: f64,
    lease_expires_us: f64,
    mask: u8,
    owner: u64,
    fingerprint: u64,
    amount: f64,
    estimated: f64,
    expires_at: i64,
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
        }
    }

    /// Locks the data, first dropping everything expired if a second has passed.
    fn lock(&self, now: i64) -> MutexGuard<'_, Data> {
        let mut d = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now >= d.next_sweep_us {
            d.levels.retain(|_, l| l.expires_at > now);
            d.records.retain(|_, r| r.expires_at > now);
            d.idempotency.retain(|_, (_, exp)| *exp > now);
            d.samples.retain(|_, (_, exp)| *exp > now);
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

    /// reserve.lua.
    fn reserve_now(&self, plan: &ReservePlan) -> ReserveReply {
        let now_us = self.clock.now_us();
        let now = now_us as f64;
        let mut d = self.lock(now_us);
        let id = &plan.id;
        let idem_key = plan
            .idempotency_key
            .as_ref()
            .map(|k| self.keys.idempotency(&id.tenant, k));

        // An earlier reservation under the same idempotency key?
        let mut replay = None;
        if let Some(nonce) = idem_key.as_ref().and_then(|k| d.idempotency_get(k, now_us)) {
            let rec = id
                .with_nonce_b64(&nonce)
                .and_then(|earlier| d.record_get(&self.keys.record(&earlier), now_us));
            if let Some(rec) = rec {
                if rec.fingerprint != plan.fingerprint {
                    return ReserveReply::IdempotencyConflict;
                }
                if rec.state != RecordState::Reserved || rec.lease_expires_us <= now {
                    return ReserveReply::IdempotencySpent {
                        settled: rec.state != RecordState::Reserved,
                    };
                }
                let left = ((rec.lease_expires_us - now) / 1000.0).ceil().max(0.0) as u64;
                replay = Some((nonce, rec.cost as u64, left));
            }
        }

        // Read every level: each bucket's level now, and the leases.
        let prompt = plan.prompt_tokens as f64;
        let mut room = plan.max_output_tokens as f64;
        let mut raws = Vec::with_capacity(plan.levels.len());
        let mut states = Vec::with_capacity(plan.levels.len());
        let mut reclaimed = Reclaimed::default();
        let mut levels_now = Vec::with_capacity(plan.levels.len());
        for lp in &plan.levels {
            let key = self.keys.level(lp.level, &id.tenant, id.user.as_ref());
            let entry = d.level_get(&key, now_us);
            let mut raw = entry.as_ref().map(|e| e.state.clone());
            let mut s = raw.clone().unwrap_or_default();
            let mut found = Vec::with_capacity(lp.buckets.len());
            for (hint, b) in lp.buckets.iter().enumerate() {
                let bid = bucket_id(b);
                let (k, l) = match s.position(bid, hint) {
                    Some(k) => (k, s.level_at(b, k, now)),
                    None => {
                        s.buckets.push(BucketState {
                            id: bid,
                            level: b.limit as f64,
                            t: now,
                        });
                        (s.buckets.len() - 1, b.limit as f64)
                    }
                };
                if b.dimension == Dimension::Tokens && l - prompt < room {
                    room = l - prompt;
                }
                found.push((k, l));
            }
            if lp.concurrency.is_some()
                && s.e > 0.0
                && now >= s.e
                && let Some(entry) = entry
            {
                let (n, e, dropped) = entry.reclaim(now);
                reclaimed.add(lp.level, dropped);
                if let Some(raw) = raw.as_mut() {
                    (raw.n, raw.e) = (n, e);
                }
                (s.n, s.e) = (n, e);
            }
            raws.push(raw);
            states.push((key, s));
            levels_now.push(found);
        }

        // The output to grant: all of it, or as much as fits, never below the min.
        let grant = room.floor().max(plan.min_output_tokens as f64);

        // Check every bucket and limit in plan order.
        let (mut denied, mut bit) = (0u64, 1u64);
        let mut ttls = Vec::with_capacity(plan.levels.len());
        for ((lp, (_, s)), found) in plan.levels.iter().zip(&mut states).zip(&levels_now) {
            let mut ttl = 0.0f64;
            for (b, &(k, l)) in lp.buckets.iter().zip(found) {
                let c = match b.dimension {
                    Dimension::Tokens => prompt + grant,
                    _ => 1.0,
                };
                if l < c {
                    denied |= bit;
                }
                bit <<= 1;
                let l = l - c;
                s.buckets[k] = BucketState {
                    id: bucket_id(b),
                    level: l,
                    t: now,
                };
                ttl = ttl.max(until_full_us(b.limit, b.period_us(), l));
            }
            if let Some(limit) = lp.concurrency {
                if s.n >= limit as f64 {
                    denied |= bit;
                }
                bit <<= 1;
            }
            ttls.push(ttl);
        }

        if let Some((nonce, tokens, lease_expires_in_ms)) = replay {
            return ReserveReply::Replayed {
                nonce,
                tokens,
                lease_expires_in_ms,
                readings: state::readings(&plan.levels, &raws, &[], now),
                reclaimed,
            };
        }
        if denied != 0 {
            return ReserveReply::Denied {
                readings: state::readings(&plan.levels, &raws, &[], now),
                denied_mask: denied,
                reclaimed,
            };
        }

        // Everything fits: write it.
        let lease_ttl = plan.lease_ttl_ms as f64 * 1000.0;
        let exp = now + lease_ttl;
        let lease = lease_field(id);
        let mut written = Vec::with_capacity(states.len());
        for ((lp, (key, mut s)), mut ttl) in plan.levels.iter().zip(states).zip(ttls) {
            if lp.concurrency.is_some() {
                s.n += 1.0;
                if s.e == 0.0 || exp < s.e {
                    s.e = exp;
                }
                ttl = ttl.max(lease_ttl);
            }
            drop_foreign(&mut s, lp.buckets.len(), now);
            let entry = d.levels.entry(key).or_default();
            entry.grow(&mut s, now_us, ttl.min(MAX_TTL_US));
            if lp.concurrency.is_some() {
                entry.leases.insert(lease.clone(), exp);
            }
            entry.state = s.clone();
            written.push(Some(s));
        }
        d.records.insert(
            self.keys.record(id),
            Record {
                state: RecordState::Reserved,
                cost: prompt + grant,
                estimated: plan.estimated_prompt_tokens as f64,
                lease_expires_us: exp,
                mask: plan.lease_mask(),
                owner: id.owner_tag(),
                fingerprint: plan.fingerprint,
                amount: 0.0,
                expires_at: now_us + (plan.lease_ttl_ms + self.retention.record_ms) as i64 * 1000,
            },
        );
        if let Some(k) = idem_key {
            let exp = now_us + self.retention.idempotency_ms as i64 * 1000;
            d.idempotency.insert(k, (id.nonce_b64(), exp));
        }
        ReserveReply::Allowed {
            readings: state::readings(&plan.levels, &written, &[], now),
            granted_output: grant as u64,
            reclaimed,
        }
    }

    /// settle.lua.
    fn settle_now(
        &self,
        s: Settlement<'_>,
        refund: bool,
        actual: u64,
        actual_prompt: u64,
    ) -> SettleReply {
        let now_us = self.clock.now_us();
        let now = now_us as f64;
        let mut d = self.lock(now_us);
        let rkey = self.keys.record(s.id);
        let Some(rec) = d
            .record_get(&rkey, now_us)
            .filter(|r| r.owner == s.id.owner_tag())
        else {
            return SettleReply::NotFound;
        };
        match rec.state {
            RecordState::Committed => {
                return SettleReply::AlreadySettled(Settled::Committed(rec.amount as i64));
            }
            RecordState::Refunded => {
                return SettleReply::AlreadySettled(Settled::Refunded(rec.amount as u64));
            }
            RecordState::Reserved => {}
        }
        let (dtok, dreq) = if refund {
            (-rec.cost, -1.0)
        } else {
            (actual as f64 - rec.cost, 0.0)
        };
        let lease = lease_field(s.id);
        // Read every level and compute its new state, then write.
        let mut writes = Vec::with_capacity(s.levels.len());
        for lp in s.levels {
            let key = self.keys.level(lp.level, &s.id.tenant, s.id.user.as_ref());
            let delta = |dimension| {
                if dimension == Dimension::Tokens {
                    dtok
                } else {
                    dreq
                }
            };
            let touched = lp.buckets.iter().any(|b| delta(b.dimension) != 0.0);
            let entry = d.level_get(&key, now_us);
            // A live lease is certainly still there; a lapsed one may have been reclaimed.
            let holds = rec.mask & lp.level.bit() != 0
                && (rec.lease_expires_us > now
                    || entry
                        .as_ref()
                        .is_some_and(|e| e.leases.contains_key(&lease)));
            if !(touched || holds) {
                continue;
            }
            let mut st = entry.map(|e| e.state.clone()).unwrap_or_default();
            if holds && st.n > 0.0 {
                st.n -= 1.0;
            }
            // The last lease goes: no earliest expiry left (settle.lua).
            if holds && st.n == 0.0 {
                st.e = 0.0;
            }
            let mut ttl = 0.0f64;
            for b in &lp.buckets {
                let dlt = delta(b.dimension);
                if dlt == 0.0 {
                    continue;
                }
                let bid = bucket_id(b);
                let (k, l) = match st.buckets.iter().position(|x| x.id == bid) {
                    Some(k) => (k, st.level_at(b, k, now)),
                    None => {
                        st.buckets.push(BucketState {
                            id: bid,
                            level: 0.0,
                            t: 0.0,
                        });
                        (st.buckets.len() - 1, b.limit as f64)
                    }
                };
                let mut l = l - dlt;
                if dlt < 0.0 && l > b.limit as f64 {
                    l = b.limit as f64;
                }
                st.buckets[k] = BucketState {
                    id: bid,
                    level: l,
                    t: now,
                };
                ttl = ttl.max(until_full_us(b.limit, b.period_us(), l));
            }
            writes.push((key, holds, st, ttl.min(MAX_TTL_US)));
        }
        for (key, holds, mut st, ttl) in writes {
            let entry = d.levels.entry(key).or_default();
            if holds {
                entry.leases.remove(&lease);
            }
            entry.grow(&mut st, now_us, ttl);
            entry.state = st;
        }
        let (state, amount, settled) = if refund {
            (
                RecordState::Refunded,
                rec.cost,
                Settled::Refunded(rec.cost as u64),
            )
        } else {
            (
                RecordState::Committed,
                dtok,
                Settled::Committed(dtok as i64),
            )
        };
        if !refund && rec.estimated > 0.0 && actual_prompt > 0 {
            let window = self.retention.samples.max(1);
            let key = self.keys.estimator(&s.id.estimator);
            let (samples, expires_at) = d.samples.entry(key).or_default();
            samples.push_front(actual_prompt as f64 / rec.estimated);
            samples.truncate(window);
            *expires_at = now_us + SAMPLES_TTL_US;
        }
        d.records.insert(
            rkey,
            Record {
                state,
                amount,
                expires_at: now_us + self.retention.record_ms as i64 * 1000,
                ..rec
            },
        );
        SettleReply::Applied {
            settled,
            estimated_prompt_tokens: rec.estimated as u64,
        }
    }

    /// renew.lua.
    fn renew_now(&self, s: Settlement<'_>, ttl_ms: u64) -> RenewReply {
        let now_us = self.clock.now_us();
        let now = now_us as f64;
        let mut d = self.lock(now_us);
        let rkey = self.keys.record(s.id);
        let Some(rec) = d
            .record_get(&rkey, now_us)
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
        let ttl = ttl_ms as f64 * 1000.0;
        let exp = now + ttl;
        let lease = lease_field(s.id);
        let keep = ttl.min(MAX_TTL_US);
        for lp in s.levels {
            let key = self.keys.level(lp.level, &s.id.tenant, s.id.user.as_ref());
            if rec.mask & lp.level.bit() != 0
                && let Some(entry) = d.level_get(&key, now_us)
                && let Some(held) = entry.leases.get_mut(&lease)
            {
                *held = exp;
                // A shorter lease may now be the earliest to lapse.
                let mut st = entry.state.clone();
                if st.e == 0.0 || exp < st.e {
                    st.e = exp;
                }
                entry.grow(&mut st, now_us, keep);
                entry.state = st;
            }
        }
        d.records.insert(
            rkey,
            Record {
                lease_expires_us: exp,
                expires_at: now_us + (ttl_ms + self.retention.record_ms) as i64 * 1000,
                ..rec
            },
        );
        RenewReply::Renewed {
            expires_in_ms: ttl_ms,
        }
    }

    /// status.lua.
    fn status_now(&self, scope: Scope<'_>, levels: &[LevelPlan], exact: bool) -> Readings {
        let now_us = self.clock.now_us();
        let now = now_us as f64;
        let mut d = self.lock(now_us);
        let mut states = Vec::with_capacity(levels.len());
        let mut leases = Vec::with_capacity(levels.len());
        for lp in levels {
            let key = self.keys.level(lp.level, scope.tenant, scope.user);
            let entry = d.level_get(&key, now_us);
            let live = entry
                .as_ref()
                // status.lua: read whole when exact and small, or once the
                // earliest expiry has passed.
                .filter(|e| {
                    let s = &e.state;
                    lp.concurrency.is_some()
                        && s.n > 0.0
                        && ((exact && s.n <= super::EXACT_LEASES as f64)
                            || (s.e > 0.0 && now >= s.e))
                })
                .map(|e| e.live_leases(now));
            states.push(entry.map(|e| e.state.clone()));
            leases.push(live);
        }
        state::readings(levels, &states, &leases, now)
    }
}

impl Data {
    fn level_get(&mut self, key: &str, now: i64) -> Option<&mut LevelEntry> {
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

impl LevelEntry {
    /// reserve.lua's reclaim: drops expired leases, recounts, finds the earliest,
    /// and stores the new count in the state.
    /// Returns (live leases, earliest expiry, leases dropped).
    fn reclaim(&mut self, now: f64) -> (f64, f64, u64) {
        let before = self.leases.len();
        self.leases.retain(|_, exp| *exp > now);
        let (n, e) = self.live_leases(now);
        (self.state.n, self.state.e) = (n, e);
        (n, e, (before - self.leases.len()) as u64)
    }

    /// Live leases and the earliest expiry among them (0 with none).
    fn live_leases(&self, now: f64) -> (f64, f64) {
        self.leases
            .values()
            .filter(|&&exp| exp > now)
            .fold((0.0, 0.0), |(n, e), &exp| {
                (n + 1.0, if e == 0.0 || exp < e { exp } else { e })
            })
    }

    /// The scripts' TTL rule: when the state must live past `x`, extend the key
    /// to twice what it needs plus a second, so hot keys rarely need PEXPIRE.
    fn grow(&mut self, s: &mut LevelState, now: i64, ttl: f64) {
        let now_f = now as f64;
        if now_f + ttl > s.x {
            s.x = now_f + 2.0 * ttl + 1_000_000.0;
            self.expires_at = now + ceil_ms(s.x - now_f) as i64 * 1000;
        }
    }
}

/// reserve.lua: keep this call's buckets (time = now) and at most
/// [`MAX_FOREIGN`] others, the most recently used.
fn drop_foreign(s: &mut LevelState, known: usize, now: f64) {
    if s.buckets.len() <= known + MAX_FOREIGN {
        return;
    }
    let mut times: Vec<f64> = s
        .buckets
        .iter()
        .filter(|b| b.t != now)
        .map(|b| b.t)
        .collect();
    times.sort_by(|a, b| b.total_cmp(a));
    let cutoff = times[MAX_FOREIGN - 1];
    s.buckets.retain(|b| b.t == now || b.t >= cutoff);
}

/// Lua: `(lim - l) * per / lim`, in µs, unrounded.
fn until_full_us(limit: u64, period_us: u64, level: f64) -> f64 {
    (limit as f64 - level) * period_us as f64 / limit as f64
}

impl<C: Clock + Clone> Store for MemoryStore<C> {
    async fn reserve(&self, plan: &ReservePlan) -> Result<ReserveReply, StoreError> {
        Ok(self.reserve_now(plan))
    }

    async fn commit(
        &self,
        s: Settlement<'_>,
        actual_tokens: u64,
        actual_prompt_tokens: u64,
    ) -> Result<SettleReply, StoreError> {
        Ok(self.settle_now(s, false, actual_tokens, actual_prompt_tokens))
    }

    async fn refund(&self, s: Settlement<'_>) -> Result<SettleReply, StoreError> {
        Ok(self.settle_now(s, true, 0, 0))
    }

    async fn estimator_samples(&self, keys: &[String]) -> Result<Vec<Vec<f64>>, StoreError> {
        let d = self.lock(self.clock.now_us());
        Ok(keys
            .iter()
            .map(|k| {
                d.samples
                    .get(&self.keys.estimator(k))
                    .map_or_else(Vec::new, |(s, _)| s.iter().copied().collect())
            })
            .collect())
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

    fn shadow(&self) -> Self {
        MemoryStore::with_clock(self.keys.shadow(), self.retention, self.clock.clone())
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "in-memory store (single process; state is lost on restart)".into()
    }
}
