//! Threshold alerts on Redis: what reserve.lua and settle.lua are given to
//! check thresholds and queue crossings (`lua/alerts.lua`), and the sender's
//! calls on the queues (`lua/alert_claim.lua`, `lua/alert_done.lua`).
//!
//! Only on a single Redis: a cluster's scripts see one slot, and the set of
//! queues holding alerts is in another (see docs/operations.md).

use super::RedisStore;
use super::wire::{Spec, int_at};
use crate::domain::LevelPlan;
use crate::store::{AlertBacklog, AlertDone, QueuedAlert, StoreError};
use redis::Value;
use std::sync::atomic::{AtomicBool, Ordering};

/// Says once, when a plan first has thresholds, that a cluster checks none.
fn warn_once_on_cluster(levels: &[LevelPlan]) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if WARNED.load(Ordering::Relaxed) {
        return;
    }
    let thresholds = levels
        .iter()
        .flat_map(|lp| &lp.buckets)
        .any(|b| !b.alert_at.is_empty());
    if thresholds && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "limits have alert_at thresholds, but a Redis Cluster checks none: no threshold \
             alerts are sent (docs/cluster.md)"
        );
    }
}

impl RedisStore {
    /// The spec a budget script checks `levels`' thresholds with
    /// (`lua/alerts.lua`): the most queued, then per bucket that has
    /// thresholds its place in the plan (1: the first), their count and their
    /// basis points. `None` without any threshold, with alerts off, or on a
    /// cluster. The queue's keys are not passed: the script names them from
    /// the record's key, at a crossing only.
    pub(super) fn alert_args(&self, levels: &[LevelPlan]) -> Option<Spec> {
        if self.keys.is_clustered() {
            warn_once_on_cluster(levels);
            return None;
        }
        if self.retention.alert_queue == 0 {
            return None;
        }
        let mut spec = Spec::default();
        spec.push(self.retention.alert_queue as f64);
        let buckets = levels.iter().flat_map(|lp| &lp.buckets);
        for (place, b) in buckets.enumerate().filter(|(_, b)| !b.alert_at.is_empty()) {
            spec.push((place + 1) as f64);
            spec.push(b.alert_at.iter().count() as f64);
            for t in b.alert_at.iter() {
                spec.push((t * 10_000.0).round());
            }
        }
        (spec.count() > 1).then_some(spec)
    }

    /// Claims up to `max` due alerts in all, queue by queue, the earliest due
    /// first, stopping at a queue with none due (none on a cluster).
    pub(super) async fn claim_alerts_call(
        &self,
        max: usize,
        claim_ms: u64,
    ) -> Result<Vec<QueuedAlert>, StoreError> {
        if self.keys.is_clustered() {
            return Ok(Vec::new());
        }
        let index = self.keys.alert_index();
        let queues: Vec<String> = self
            .query(
                redis::pipe()
                    .cmd("ZRANGE")
                    .arg(&index)
                    .arg(0)
                    .arg(max as i64 - 1),
            )
            .await
            .map(|(q,): (Vec<String>,)| q)?;
        let mut out = Vec::new();
        for queue in queues {
            let left = max - out.len();
            if left == 0 {
                break;
            }
            let mut inv = self.alert_claim.prepare_invoke();
            inv.key(&queue)
                .key(format!("{queue}:e"))
                .key(self.keys.alert_index())
                .arg(left)
                .arg(claim_ms * 1000);
            let reply = self.run(&inv).await?;
            if reply.is_empty() {
                // The later queues are due later still.
                break;
            }
            for chunk in reply.chunks(3) {
                let [Value::BulkString(id), record, _] = chunk else {
                    return Err(StoreError::Protocol(
                        format!("alert_claim.lua replied {chunk:?} for an alert").into(),
                    ));
                };
                let record = match record {
                    Value::BulkString(r) => r.clone(),
                    _ => Vec::new(),
                };
                out.push(QueuedAlert {
                    queue: queue.clone(),
                    id: String::from_utf8_lossy(id).into_owned(),
                    record,
                    attempts: int_at(chunk, 2)?.max(0) as u64,
                });
            }
        }
        Ok(out)
    }

    /// What became of a claimed alert.
    pub(super) async fn finish_alert_call(
        &self,
        alert: &QueuedAlert,
        done: AlertDone,
    ) -> Result<(), StoreError> {
        let (mode, after_us) = match done {
            AlertDone::Sent => (1, 0),
            AlertDone::Retry { after_ms } => (2, after_ms * 1000),
            AlertDone::Dropped => (3, 0),
        };
        let mut inv = self.alert_done.prepare_invoke();
        inv.key(&alert.queue)
            .key(format!("{}:e", alert.queue))
            .key(self.keys.alert_index())
            .key(self.keys.alert_dropped())
            .arg(&alert.id)
            .arg(mode)
            .arg(after_us);
        self.run(&inv).await?;
        Ok(())
    }

    /// Every queued alert and the count dropped.
    pub(super) async fn alert_backlog_call(&self) -> Result<AlertBacklog, StoreError> {
        let (queues, dropped): (Vec<String>, Option<u64>) = self
            .query(
                redis::pipe()
                    .cmd("ZRANGE")
                    .arg(self.keys.alert_index())
                    .arg(0)
                    .arg(-1)
                    .cmd("GET")
                    .arg(self.keys.alert_dropped()),
            )
            .await?;
        let mut out = AlertBacklog {
            queued: Vec::new(),
            dropped: dropped.unwrap_or(0),
        };
        for queue in queues {
            let (ids, fields): (Vec<String>, std::collections::HashMap<String, Vec<u8>>) = self
                .query(
                    redis::pipe()
                        .cmd("ZRANGE")
                        .arg(&queue)
                        .arg(0)
                        .arg(-1)
                        .cmd("HGETALL")
                        .arg(format!("{queue}:e")),
                )
                .await?;
            for id in ids {
                let attempts = fields
                    .get(&format!("n:{id}"))
                    .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
                    .unwrap_or(0);
                out.queued.push(QueuedAlert {
                    queue: queue.clone(),
                    record: fields.get(&id).cloned().unwrap_or_default(),
                    attempts,
                    id,
                });
            }
        }
        Ok(out)
    }

    /// Keeps `line` first among the last `keep` alerts sent or dropped.
    pub(super) async fn note_alert_call(
        &self,
        line: String,
        keep: usize,
    ) -> Result<(), StoreError> {
        let key = self.keys.alert_recent();
        self.query::<()>(
            redis::pipe()
                .cmd("LPUSH")
                .arg(&key)
                .arg(line)
                .ignore()
                .cmd("LTRIM")
                .arg(&key)
                .arg(0)
                .arg(keep as i64 - 1)
                .ignore(),
        )
        .await
    }

    /// The last `n` alerts sent or dropped.
    pub(super) async fn recent_alerts_call(&self, n: usize) -> Result<Vec<String>, StoreError> {
        let (lines,): (Vec<String>,) = self
            .query(
                redis::pipe()
                    .cmd("LRANGE")
                    .arg(self.keys.alert_recent())
                    .arg(0)
                    .arg(n as i64 - 1),
            )
            .await?;
        Ok(lines)
    }
}
