//! The alert step of reserve and settle (`crates/store/lua/alerts.lua` is its Redis
//! port): which thresholds a bucket's move crossed, whether each fires (its
//! marker in the level), and the tenant's bounded queue it goes to — all in
//! the operation's own atomic step.

use super::level::StoredLevel;
use crate::BucketSpec;
use crate::alert::{self, Crossing, event_id};
use std::collections::BTreeMap;

/// Adds to `out` the thresholds bucket `b` of plan entry `at` crossed moving
/// from level `before` to `after` at `now`.
pub fn crossed(
    at: usize,
    b: &BucketSpec,
    (before, after): (f64, f64),
    now: f64,
    out: &mut Vec<Crossing>,
) {
    if b.alert_at.is_empty() {
        return;
    }
    let limit = b.limit as f64;
    let window_start_us = b.window.map_or(0.0, |w| w.span.at(now).0);
    for threshold in alert::crossed(&b.alert_at, limit, before, after) {
        out.push(Crossing {
            level: at,
            bucket_id: super::state::bucket_id(b),
            limit,
            used: limit - after,
            threshold,
            window_start_us,
        });
    }
}

/// Whether crossing `c` of `level` fires at `now`, leaving its marker.
pub fn fires(level: &mut StoredLevel, c: &Crossing, now: f64) -> bool {
    let field = c.marker_field();
    let fires = c.fires(level.alert_markers.get(&field).copied(), now);
    level.alert_markers.insert(field, c.marker(now));
    fires
}

/// A tenant's queue of alerts to send: record by event id, and when each is
/// due (µs) — bounded: a crossing that finds it full is dropped and counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlertQueue {
    /// Event id → its record.
    pub records: BTreeMap<String, Vec<u8>>,
    /// Event id → when it is next due to be sent (µs).
    pub due: BTreeMap<String, f64>,
    /// Event id → delivery attempts made.
    pub attempts: BTreeMap<String, u64>,
}

impl AlertQueue {
    /// Queues `record`, due `now`, unless `max` are queued already: then
    /// `false` (dropped).
    pub fn push(&mut self, record: Vec<u8>, now: f64, max: usize) -> bool {
        if self.due.len() >= max {
            return false;
        }
        let id = event_id(&record);
        self.due.insert(id.clone(), now);
        self.records.insert(id, record);
        true
    }
}

impl AlertQueue {
    /// Its alerts by when they are due, then by id (as a Redis sorted set
    /// orders them).
    pub fn by_due(&self) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = self.due.iter().map(|(k, v)| (k.clone(), *v)).collect();
        v.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        v
    }
}
