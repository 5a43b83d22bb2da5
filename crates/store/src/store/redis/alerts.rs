//! Threshold alerts on Redis: what reserve.lua and settle.lua are given to
//! check thresholds and queue crossings (`lua/alerts.lua`), and the sender's
//! calls on the queues (`lua/alert_claim.lua`, `lua/alert_done.lua`).
//!
//! On a Redis Cluster a tenant's queue and the index of queues are in
//! different slots: the tenant's scripts say what they saw (a reply ending
//! `A<now>` after a crossing queued one; a claim's or a finish's earliest due
//! and time) and this side tells the index (`lua/alert_index.lua`).

use super::RedisStore;
use super::wire::{Args, Spec, int_at};
use crate::domain::{LevelPlan, TenantId};
use crate::store::{AlertBacklog, AlertDone, QueuedAlert, StoreError};
use redis::Value;

impl RedisStore {
    /// The spec a budget script checks `levels`' thresholds with
    /// (`lua/alerts.lua`): the most queued, then per bucket that has
    /// thresholds its place in the plan (1: the first), their count and their
    /// basis points (the most queued negative on a cluster). `None` without
    /// any threshold, or with alerts off. The queue's keys are not passed: the
    /// script names them from the record's key, at a crossing only.
    pub(super) fn alert_args(&self, levels: &[LevelPlan]) -> Option<Spec> {
        let buckets = || levels.iter().flat_map(|lp| &lp.buckets);
        // Most calls have no thresholds: nothing allocated for them.
        if self.retention.alert_queue == 0 || buckets().all(|b| b.alert_at.is_empty()) {
            return None;
        }
        let mut spec = Spec::default();
        // Negative on a cluster: the script leaves the index to this side.
        let max = self.retention.alert_queue as f64;
        spec.push(match self.keys.is_clustered() {
            true => -max,
            false => max,
        });
        for (place, b) in buckets()
            .enumerate()
            .filter(|(_, b)| !b.alert_at.is_empty())
        {
            spec.push((place + 1) as f64);
            spec.push(b.alert_at.iter().count() as f64);
            for t in b.alert_at.iter() {
                spec.push((t * 10_000.0).round());
            }
        }
        Some(spec)
    }

    /// Claims up to `max` due alerts in all, queue by queue, the earliest due
    /// first, stopping at a queue with none due.
    pub(super) async fn claim_alerts_call(
        &self,
        max: usize,
        claim_ms: u64,
    ) -> Result<Vec<QueuedAlert>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let cluster = self.keys.is_clustered();
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
            use super::spec::{alert_claim_argv as a, alert_claim_keys as k};
            let mut inv = self.alert_claim.prepare_invoke();
            let mut args = Args::new(&mut inv);
            args.key(k::QUEUE, queue.clone())
                .key(k::RECORDS, format!("{queue}:e"));
            if !cluster {
                args.key(k::INDEX, index.clone());
            }
            args.at(a::MOST, left).at(a::CLAIM_US, claim_ms * 1000);
            let mut reply = self.run(&inv).await?;
            if cluster {
                let (due, seen) = seen_at_end(&mut reply, "alert_claim")?;
                self.index_queue(&queue, &seen, &due).await?;
            }
            if reply.is_empty() {
                // The later queues are due later still.
                break;
            }
            out.extend(claimed(&queue, &reply)?);
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
        let cluster = self.keys.is_clustered();
        use super::spec::{alert_done_argv as a, alert_done_keys as k, alert_seen_tail};
        let mut inv = self.alert_done.prepare_invoke();
        let mut args = Args::new(&mut inv);
        args.key(k::QUEUE, alert.queue.clone())
            .key(k::RECORDS, format!("{}:e", alert.queue));
        if !cluster {
            args.key(k::INDEX, self.keys.alert_index())
                .key(k::DROPPED, self.keys.alert_dropped());
        }
        args.at(a::ID, &alert.id)
            .at(a::MODE, mode)
            .at(a::RETRY_US, after_us);
        let mut reply = self.run(&inv).await?;
        // Applied on a cluster: the tag, then the queue as seen.
        if cluster && reply.len() == 1 + alert_seen_tail::WIDTH {
            let (due, seen) = seen_at_end(&mut reply, "alert_done")?;
            self.index_queue(&alert.queue, &seen, &due).await?;
        }
        Ok(())
    }

    /// On a cluster: tells the index that `queue` was seen at `seen` (µs,
    /// decimal) with its earliest due `due` ('-': empty).
    pub(super) async fn index_queue(
        &self,
        queue: &str,
        seen: &str,
        due: &str,
    ) -> Result<(), StoreError> {
        use super::spec::{alert_index_argv as a, alert_index_keys as k};
        let mut inv = self.alert_index.prepare_invoke();
        Args::new(&mut inv)
            .key(k::INDEX, self.keys.alert_index())
            .key(k::SEEN, self.keys.alert_seen())
            .at(a::QUEUE, queue)
            .at(a::SEEN, seen)
            .at(a::DUE, due);
        self.run(&inv).await?;
        Ok(())
    }

    /// On a cluster: a budget script's reply that ends `A<now>` queued an
    /// alert in `tenant`'s queue; the mark leaves the reply and the queue is
    /// indexed, due then. A reply without it is left as it is.
    pub(super) async fn index_crossing(
        &self,
        tenant: &TenantId,
        reply: &mut Vec<Value>,
    ) -> Result<(), StoreError> {
        let Some(Value::BulkString(mark)) = reply.last() else {
            return Ok(());
        };
        let Some(at) = mark.strip_prefix(b"A") else {
            return Ok(());
        };
        let at = String::from_utf8_lossy(at).into_owned();
        reply.pop();
        let (queue, _) = self.keys.alert_queue(tenant);
        if let Err(e) = self.index_queue(&queue, &at, &at).await {
            // Queued all the same; the tenant's next crossing indexes it.
            tracing::warn!(error = %e, queue, "an alert was queued but not indexed");
        }
        Ok(())
    }

    /// On a cluster: indexes every tenant queue holding alerts, as a claim of
    /// none sees it (its earliest due, at the tenant node's time); how many
    /// queues. One SCAN of every master: run once, at a replica's start.
    pub(super) async fn reindex_alerts_call(&self) -> Result<usize, StoreError> {
        if !self.keys.is_clustered() {
            return Ok(0);
        }
        let queues = self.scan_keys(&self.keys.alert_queue_pattern()).await?;
        let mut indexed = 0;
        for queue in queues {
            // Claims nothing: its reply is the queue as seen.
            use super::spec::{alert_claim_argv as a, alert_claim_keys as k};
            let mut inv = self.alert_claim.prepare_invoke();
            Args::new(&mut inv)
                .key(k::QUEUE, queue.clone())
                .key(k::RECORDS, format!("{queue}:e"))
                .at(a::MOST, 0)
                .at(a::CLAIM_US, 0);
            let mut reply = self.run(&inv).await?;
            let (due, seen) = seen_at_end(&mut reply, "alert_claim")?;
            if due != "-" {
                self.index_queue(&queue, &seen, &due).await?;
                indexed += 1;
            }
        }
        Ok(indexed)
    }

    /// Every queued alert and the count dropped (on a cluster, with the drops
    /// of the queues that hold alerts).
    pub(super) async fn alert_backlog_call(&self) -> Result<AlertBacklog, StoreError> {
        // Two keys, in two slots on a cluster: two calls.
        let (queues,): (Vec<String>,) = self
            .query(
                redis::pipe()
                    .cmd("ZRANGE")
                    .arg(self.keys.alert_index())
                    .arg(0)
                    .arg(-1),
            )
            .await?;
        let (dropped,): (Option<u64>,) = self
            .query(redis::pipe().cmd("GET").arg(self.keys.alert_dropped()))
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
            // On a cluster a full queue counts its drops itself.
            out.dropped += fields
                .get("dropped")
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u64>().ok())
                .unwrap_or(0);
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
        let (key, keep) = (self.keys.alert_recent(), keep.max(1));
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
        if n == 0 {
            // LRANGE 0 -1 would be every line.
            return Ok(Vec::new());
        }
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

/// alert_claim.lua's alerts claimed from `queue`, a group each.
fn claimed(queue: &str, reply: &[Value]) -> Result<Vec<QueuedAlert>, StoreError> {
    use super::spec::alert_claimed as c;
    let mut out = Vec::with_capacity(reply.len() / c::WIDTH);
    for chunk in reply.chunks(c::WIDTH) {
        let (Some(Value::BulkString(id)), Some(record)) = (chunk.get(c::ID), chunk.get(c::RECORD))
        else {
            return Err(StoreError::Protocol(
                format!("alert_claim.lua replied {chunk:?} for an alert").into(),
            ));
        };
        let record = match record {
            Value::BulkString(r) => r.clone(),
            _ => Vec::new(),
        };
        out.push(QueuedAlert {
            queue: queue.to_owned(),
            id: String::from_utf8_lossy(id).into_owned(),
            record,
            attempts: int_at(chunk, c::ATTEMPTS)?.max(0) as u64,
        });
    }
    Ok(out)
}

/// The last two values of a cluster's claim or finish reply (its earliest due,
/// '-' when empty, and the time of the call), taken off it.
fn seen_at_end(reply: &mut Vec<Value>, script: &str) -> Result<(String, String), StoreError> {
    let text = |v: Option<Value>| match v {
        Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
        Some(Value::Int(n)) => Some(n.to_string()),
        _ => None,
    };
    use super::spec::alert_seen_tail as t;
    let at = reply.len().saturating_sub(t::WIDTH);
    let tail: Vec<Value> = reply.drain(at..).collect();
    let (due, seen) = (
        text(tail.get(t::DUE).cloned()),
        text(tail.get(t::SEEN).cloned()),
    );
    match (due, seen) {
        (Some(due), Some(seen)) => Ok((due, seen)),
        _ => Err(StoreError::Protocol(
            format!("{script}.lua replied without the queue's earliest due and time").into(),
        )),
    }
}
