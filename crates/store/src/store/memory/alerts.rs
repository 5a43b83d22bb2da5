//! The memory store's threshold alerts: `lua/alerts.lua`'s step (markers and
//! the bounded queue, under the operation's lock) and the sender's calls on
//! the queue, as the Redis store makes them (`lua/alert_claim.lua`,
//! `lua/alert_done.lua`).

use super::{Data, MemoryStore, Taken};
use crate::domain::alert::Crossing;
use crate::domain::budget::alerts::{AlertQueue, fires};
use crate::domain::{Clock, TenantId};
use crate::store::{AlertBacklog, AlertDone, QueuedAlert};
use std::collections::BTreeMap;

impl<C: Clock> MemoryStore<C> {
    /// alerts.lua: each crossing of `taken`'s levels that fires is queued in
    /// `tenant`'s queue, unless full (then counted dropped).
    pub(super) fn fire(
        &self,
        d: &mut Data,
        taken: &mut Taken,
        tenant: &TenantId,
        crossings: &[Crossing],
        now: i64,
    ) {
        let max = self.retention.alert_queue;
        if crossings.is_empty() || max == 0 {
            return;
        }
        let now = now as f64;
        let (queue, _) = self.keys.alert_queue(tenant);
        for c in crossings {
            let key = &taken.keys[c.level];
            let Some(level) = taken.levels[c.level].as_mut() else {
                continue;
            };
            if !fires(level, c, now) {
                continue;
            }
            let q = d.alerts.entry(queue.clone()).or_default();
            if !q.push(c.record(now, key), now, max) {
                d.alert_dropped += 1;
            }
        }
    }

    /// alert_claim.lua on each queue in turn, the earliest due first, up to
    /// `max` in all, stopping at a queue with none due.
    pub(super) fn claim_now(&self, max: usize, claim_ms: u64) -> Vec<QueuedAlert> {
        let now = self.clock.now_us() as f64;
        let mut d = self.lock(now as i64);
        let mut out = Vec::new();
        let order: Vec<String> = index(&d.alerts).into_iter().map(|(k, _)| k).collect();
        for key in order.into_iter().take(max) {
            let left = max - out.len();
            if left == 0 {
                break;
            }
            let Some(q) = d.alerts.get_mut(&key) else {
                continue;
            };
            let due: Vec<String> = q
                .by_due()
                .into_iter()
                .filter(|(_, at)| *at <= now)
                .take(left)
                .map(|(id, _)| id)
                .collect();
            if due.is_empty() {
                break;
            }
            for id in due {
                q.due.insert(id.clone(), now + claim_ms as f64 * 1000.0);
                let attempts = q.attempts.entry(id.clone()).or_default();
                *attempts += 1;
                out.push(QueuedAlert {
                    queue: key.clone(),
                    record: q.records.get(&id).cloned().unwrap_or_default(),
                    attempts: *attempts,
                    id,
                });
            }
        }
        out
    }

    /// alert_done.lua.
    pub(super) fn finish_now(&self, alert: &QueuedAlert, done: AlertDone) {
        let now = self.clock.now_us() as f64;
        let mut d = self.lock(now as i64);
        let Some(q) = d.alerts.get_mut(&alert.queue) else {
            return;
        };
        if !q.due.contains_key(&alert.id) {
            return;
        }
        match done {
            AlertDone::Retry { after_ms } => {
                q.due
                    .insert(alert.id.clone(), now + after_ms as f64 * 1000.0);
            }
            AlertDone::Sent | AlertDone::Dropped => {
                q.due.remove(&alert.id);
                q.records.remove(&alert.id);
                q.attempts.remove(&alert.id);
                let empty = q.due.is_empty();
                if done == AlertDone::Dropped {
                    d.alert_dropped += 1;
                }
                if empty {
                    d.alerts.remove(&alert.queue);
                }
            }
        }
    }

    /// Every queued alert and the counts dropped.
    pub(super) fn backlog_now(&self) -> AlertBacklog {
        let d = self.lock(self.clock.now_us());
        let mut out = AlertBacklog::default();
        for (key, _) in index(&d.alerts) {
            let q = &d.alerts[&key];
            for (id, _) in q.by_due() {
                out.queued.push(QueuedAlert {
                    queue: key.clone(),
                    record: q.records.get(&id).cloned().unwrap_or_default(),
                    attempts: q.attempts.get(&id).copied().unwrap_or(0),
                    id,
                });
            }
        }
        out.dropped = d.alert_dropped;
        out
    }
}

/// The queues holding alerts by their earliest due, then by key (Redis's
/// index: a sorted set).
pub(super) fn index(alerts: &BTreeMap<String, AlertQueue>) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = alerts
        .iter()
        .filter_map(|(k, q)| Some((k.clone(), q.by_due().first()?.1)))
        .collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    v
}

impl Data {
    /// Keeps `line` first among the last `keep` alerts sent or dropped.
    pub(super) fn note_alert(&mut self, line: String, keep: usize) {
        self.alert_recent.push_front(line);
        self.alert_recent.truncate(keep.max(1));
    }
}
