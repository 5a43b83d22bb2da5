//! One level as a store holds it: its state, its live leases and when the
//! whole of it expires — with the rules for the leases (reclaiming lapsed
//! ones, counting live ones) and for the key's life.

use super::layout::TTL_SLACK_US;
use super::state::{LevelState, ceil_ms};
/// A hash map keyed by lease fields, record keys and level keys: foldhash,
/// seeded per process, costs a fraction of std's SipHash per lookup.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// One level hash: its `s` field, its lease fields, and its key's expiry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredLevel {
    /// The `s` field.
    pub state: LevelState,
    /// Lease field (`#<nonce>`) → expiry (µs).
    pub leases: FastMap<String, f64>,
    /// When the key expires (µs), as the last write set it.
    pub expires_at_us: i64,
    /// The `o` field: a learned level's overrun credit and when it was
    /// written (µs); `None`: never written (full).
    pub credit: Option<(f64, f64)>,
    /// The `a…` fields: each alert threshold's marker
    /// (`domain::alert::Crossing::marker_field` → its value).
    pub alert_markers: FastMap<String, f64>,
}

impl StoredLevel {
    /// Drops lapsed leases and stores the live count and the earliest live
    /// expiry in the state. Returns the leases dropped.
    pub fn reclaim(&mut self, now: f64) -> u64 {
        let before = self.leases.len();
        self.leases.retain(|_, exp| *exp > now);
        (self.state.n, self.state.e) = self.live_leases(now);
        (before - self.leases.len()) as u64
    }

    /// Live leases and the earliest expiry among them (0 with none).
    pub fn live_leases(&self, now: f64) -> (f64, f64) {
        self.leases
            .values()
            .filter(|&&exp| exp > now)
            .fold((0.0, 0.0), |(n, e), &exp| {
                (n + 1.0, if e == 0.0 || exp < e { exp } else { e })
            })
    }

    /// Stores `state`, then extends the key's life as [`Self::outlive`] does.
    pub fn store(&mut self, state: LevelState, now: i64, ttl: f64) {
        self.state = state;
        self.outlive(now, ttl);
    }

    /// Extends the key's life if it must outlive `ttl` µs from `now`: then to
    /// twice what it needs plus a second, so hot keys rarely need another
    /// PEXPIRE. The state's `x` records it.
    pub fn outlive(&mut self, now: i64, ttl: f64) {
        let now_f = now as f64;
        if now_f + ttl > self.state.x {
            self.state.x = now_f + 2.0 * ttl + TTL_SLACK_US;
            self.expires_at_us = now + ceil_ms(self.state.x - now_f) as i64 * 1000;
        }
    }
}
