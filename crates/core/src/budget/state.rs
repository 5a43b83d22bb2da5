//! The state of one level, exactly as the Lua scripts pack it into the `s` field
//! of a level hash: little-endian doubles
//! `n, e, x, format, then per bucket: id, level, time, limit`. The budget
//! algorithm works on
//! this structure, and both stores turn state into readings with one function
//! here.
//!
//! - `n`: live concurrency leases; `e`: lower bound of the earliest lease expiry
//!   (µs, 0 = none); `x`: the expiry the key was last given (µs); `format`:
//!   [`STATE_FORMAT`] (a state without it is read by the shim in
//!   [`LevelState::decode`]).
//! - bucket `id` = group tag × 10⁸ + dimension × 10⁷ + period in seconds
//!   (dimension 1 = requests, 2 = tokens, 3 = input tokens, 4 = output
//!   tokens, 5 = spend in µ$; tag 0 = all models), so a script knows a bucket's period and
//!   dimension from its id alone, and a model group's buckets share the
//!   level's state without colliding with the all-model ones.
//! - `level` may be negative (debt) and is a float: refill is continuous.
//! - `limit`: the limit the level was stored under, so a change of limit
//!   (a tier change, an override, a live `tiers set`) keeps what was used
//!   ([`BucketSpec::rebase`]); 0 when unknown.
//! - Buckets the current configuration does not name stay in the state untouched
//!   (another replica may still use them during a configuration rollout).

use crate::bucket::to_milli;
use crate::layout::{
    BUCKET_WIDTH, BUCKET_WIDTH_V1, DIMENSION_SCALE, GROUP_SCALE, STATE_FORMAT, STATE_HEAD,
    STATE_HEAD_V1, WINDOW_PERIODS,
};
use crate::{BucketSpec, LevelPlan, Reading, Readings};

/// One bucket of a level state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketState {
    /// See [`bucket_id`].
    pub id: f64,
    /// The level at `t`.
    pub level: f64,
    /// When `level` was computed (µs).
    pub t: f64,
    /// The limit `level` was stored under; 0 when unknown.
    pub limit: f64,
}

/// One level hash's `s` field.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LevelState {
    /// Live leases.
    pub n: f64,
    /// Lower bound of the earliest lease expiry (µs); 0 = none.
    pub e: f64,
    /// The key's expiry (µs) as last set; a script extends it only past this.
    pub x: f64,
    /// Buckets in stored order.
    pub buckets: Vec<BucketState>,
}

/// The id of a bucket in state and scripts: group tag × 10⁸ + dimension ×
/// 10⁷ + period seconds.
pub fn bucket_id(b: &BucketSpec) -> f64 {
    let dim = b.dimension.code() as f64;
    let period = match b.window {
        Some(w) => WINDOW_PERIODS + f64::from(w.window.tag()),
        None => b.period_secs as f64,
    };
    f64::from(b.group) * GROUP_SCALE + dim * DIMENSION_SCALE + period
}

impl LevelState {
    /// Unpacks a stored state; `None` for an empty value (never written).
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, String> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let garbage = || {
            format!(
                "level state of {} bytes is not n, e, x, format and buckets",
                bytes.len()
            )
        };
        if !bytes.len().is_multiple_of(8) || bytes.len() < 8 * STATE_HEAD_V1 {
            return Err(garbage());
        }
        let d: Vec<f64> = bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect();
        // Before the format double, the fourth was the first bucket's id.
        let (head, width) = match d.get(STATE_HEAD - 1) {
            Some(&f) if f == STATE_FORMAT => (STATE_HEAD, BUCKET_WIDTH),
            _ => (STATE_HEAD_V1, BUCKET_WIDTH_V1),
        };
        if !(d.len() - head).is_multiple_of(width) {
            return Err(garbage());
        }
        Ok(Some(LevelState {
            n: d[0],
            e: d[1],
            x: d[2],
            buckets: d[head..]
                .chunks_exact(width)
                .map(|b| BucketState {
                    id: b[0],
                    level: b[1],
                    t: b[2],
                    limit: b.get(3).copied().unwrap_or(0.0),
                })
                .collect(),
        }))
    }

    /// Packs the state as the scripts store it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * (STATE_HEAD + BUCKET_WIDTH * self.buckets.len()));
        for v in [self.n, self.e, self.x, STATE_FORMAT] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for b in &self.buckets {
            for v in [b.id, b.level, b.t, b.limit] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// The index of bucket `id`, trying `hint` (its position in the plan) first.
    pub fn position(&self, id: f64, hint: usize) -> Option<usize> {
        match self.buckets.get(hint) {
            Some(b) if b.id == id => Some(hint),
            _ => self.buckets.iter().position(|b| b.id == id),
        }
    }

    /// Where `bucket` is in this state and its level at `now`, appending it
    /// full (stored at `now`) when the state lacks it: how reserve and charge
    /// read each bucket (the Lua scripts splice it inline:
    /// `crates/store/lua/splice/bucket_level.lua`).
    pub fn read_bucket(&mut self, bucket: &BucketSpec, hint: usize, now: f64) -> (usize, f64) {
        let id = bucket_id(bucket);
        match self.position(id, hint) {
            Some(k) => (k, self.level_at(bucket, k, now)),
            None => {
                let level = bucket.limit as f64;
                self.buckets.push(BucketState {
                    id,
                    level,
                    t: now,
                    limit: level,
                });
                (self.buckets.len() - 1, level)
            }
        }
    }

    /// The level of `bucket` at `now`: refilled since it was stored, or full if
    /// the state does not have it. Lua: `l + el * lim / per`, capped.
    pub fn level_at(&self, bucket: &BucketSpec, hint: usize, now: f64) -> f64 {
        match self.position(bucket_id(bucket), hint) {
            Some(i) => {
                let b = &self.buckets[i];
                bucket.level_now(b.level, b.limit, b.t, now)
            }
            None => bucket.limit as f64,
        }
    }
}

/// Readings of `levels` from their states at `now` (µs): one per bucket, plus
/// one per concurrency limit. `leases` overrides a level's (n, e) when given.
pub fn readings(
    levels: &[LevelPlan],
    states: &[Option<LevelState>],
    leases: &[Option<(f64, f64)>],
    now: f64,
) -> Readings {
    readings_of(levels, |i| states.get(i)?.as_ref(), leases, now)
}

/// [`readings`] with level `i`'s state from `state(i)`: for callers holding
/// states inside something else (a store's levels).
pub fn readings_of<'a>(
    levels: &[LevelPlan],
    state: impl Fn(usize) -> Option<&'a LevelState>,
    leases: &[Option<(f64, f64)>],
    now: f64,
) -> Readings {
    let mut out = Vec::with_capacity(levels.iter().map(LevelPlan::reading_count).sum());
    for (i, lp) in levels.iter().enumerate() {
        let state = state(i);
        for (hint, b) in lp.buckets.iter().enumerate() {
            let level = state.map_or(b.limit as f64, |s| s.level_at(b, hint, now));
            out.push(Reading::Bucket {
                milli: to_milli(level),
            });
        }
        if lp.concurrency.is_some() {
            let (n, e) = leases
                .get(i)
                .copied()
                .flatten()
                .or(state.map(|s| (s.n, s.e)))
                .unwrap_or((0.0, 0.0));
            out.push(Reading::Concurrency {
                active: n.max(0.0) as u64,
                // No live lease: nothing to wait for, whatever bound is left.
                earliest_expiry_ms: if n > 0.0 && e > 0.0 {
                    ceil_ms(e - now)
                } else {
                    0
                },
            });
        }
    }
    out
}

/// Microseconds to whole milliseconds, rounded up, never negative.
pub fn ceil_ms(us: f64) -> u64 {
    (us / 1000.0).ceil().max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dimension;
    use crate::Level;

    #[test]
    fn state_round_trips_and_rejects_garbage() {
        let s = LevelState {
            n: 2.0,
            e: 1.5e15,
            x: 1.6e15,
            buckets: vec![BucketState {
                id: 2e7 + 60.0,
                level: -0.1,
                t: 1.4e15,
                limit: 600.0,
            }],
        };
        assert_eq!(LevelState::decode(&s.encode()).unwrap(), Some(s.clone()));
        assert_eq!(LevelState::decode(b"").unwrap(), None);
        assert!(LevelState::decode(&[0u8; 30]).is_err());
        assert!(LevelState::decode(&[0u8; 32]).is_err());
        // A state of the format before buckets kept their limit: read with
        // the limit unknown, written back in the current format.
        let v1: Vec<u8> = [2.0, 1.5e15, 1.6e15, 2e7 + 60.0, -0.1, 1.4e15]
            .iter()
            .flat_map(|v: &f64| v.to_le_bytes())
            .collect();
        let old = LevelState::decode(&v1).unwrap().unwrap();
        assert_eq!(old.buckets[0].limit, 0.0);
        assert_eq!((old.n, old.buckets[0].level), (2.0, -0.1));
        let empty_v1: Vec<u8> = [0.0f64, 0.0, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(
            LevelState::decode(&empty_v1)
                .unwrap()
                .unwrap()
                .buckets
                .is_empty()
        );
    }

    #[test]
    fn missing_buckets_read_full_and_stored_ones_refill() {
        let tpm = BucketSpec {
            level: Level::User,
            dimension: Dimension::Tokens,
            limit: 600,
            period_secs: 60,
            group: 0,
            window: None,
            alert_at: Default::default(),
        };
        let s = LevelState {
            buckets: vec![BucketState {
                id: bucket_id(&tpm),
                level: 0.0,
                t: 0.0,
                limit: 600.0,
            }],
            ..LevelState::default()
        };
        assert_eq!(s.level_at(&tpm, 5, 1e6), 10.0);
        let rpm = BucketSpec {
            dimension: Dimension::Requests,
            ..tpm
        };
        assert_eq!(s.level_at(&rpm, 0, 1e6), 600.0);
        assert_eq!(bucket_id(&rpm), 1e7 + 60.0);
    }
}
