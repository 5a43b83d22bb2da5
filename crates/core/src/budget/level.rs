//! One level as a store holds it: its state, its live leases and when the
//! whole of it expires — with the rules for the leases (reclaiming lapsed
//! ones, counting live ones) and for the key's life.

use super::state::{LevelState, ceil_ms};
use crate::ReservationId;
use crate::layout::TTL_SLACK_US;
/// A hash map keyed by lease fields, record keys and level keys: foldhash,
/// seeded per process, costs a fraction of std's SipHash per lookup.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A reservation's lease in a level: its nonce, held as a number so that a
/// lease costs a level 24 bytes and no allocation of its own. Redis names it
/// by the hash field [`Lease::field`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease(pub u128);

impl Lease {
    /// The lease of reservation `id`.
    pub fn of(id: &ReservationId) -> Self {
        Lease(u128::from_le_bytes(id.nonce))
    }

    /// Its hash field in Redis: `#` and the nonce in base64url.
    pub fn field(self) -> String {
        use base64::Engine;
        let nonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0.to_le_bytes());
        format!("#{nonce}")
    }
}

/// One level hash: its `s` field, its lease fields, and its key's expiry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredLevel {
    /// The `s` field.
    pub state: LevelState,
    /// Lease (the field `#<nonce>`) → expiry (µs).
    pub leases: FastMap<Lease, f64>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TenantId;

    #[test]
    fn a_lease_is_named_in_redis_by_its_nonce_in_base64url() {
        let id = ReservationId::generate(
            TenantId::parse("acme").unwrap(),
            None,
            "t".into(),
            String::new(),
        );
        let lease = Lease::of(&id);
        assert_eq!(lease.field(), format!("#{}", id.nonce_b64()));
        let other = ReservationId::generate(
            TenantId::parse("acme").unwrap(),
            None,
            "t".into(),
            String::new(),
        );
        assert_ne!(Lease::of(&other), lease);
    }
}
