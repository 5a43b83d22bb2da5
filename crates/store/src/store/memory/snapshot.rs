//! The memory store's keys as Redis holds them: what the differential test
//! compares with a Redis database key for key; and one level as the store
//! holds it, where the test's cluster-share column starts from.

use super::MemoryStore;
use crate::domain::Clock;
use crate::domain::budget::StoredLevel;
use crate::domain::mix::EstimatorSample;
use std::collections::BTreeMap;

/// One key's value in Redis's terms: what [`MemoryStore::snapshot`] reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Stored {
    /// A string (a record, an idempotency entry).
    String(Vec<u8>),
    /// A hash (a level: `s`, its overrun credit `o` and its lease fields).
    Hash(BTreeMap<String, Vec<u8>>),
    /// A list (estimator samples, newest first).
    List(Vec<Vec<u8>>),
    /// A sorted set (an alert queue, the queues' index): members by score,
    /// then by name.
    ZSet(Vec<(String, f64)>),
}

/// The expiry of a key that has none.
pub const NEVER: i64 = i64::MAX;

impl<C: Clock> MemoryStore<C> {
    /// The level hash `key` holds now (`None`: none, or expired), exactly:
    /// the differential test seeds the cluster's share with it.
    pub fn stored_level(&self, key: &str) -> Option<StoredLevel> {
        let now = self.clock.now_us();
        let d = self.lock(now);
        d.levels.get(key).filter(|l| l.expires_at_us > now).cloned()
    }

    /// Every live key with its value in Redis's encoding and its expiry (µs of
    /// this store's clock): the differential test compares it with Redis.
    pub fn snapshot(&self) -> BTreeMap<String, (Stored, i64)> {
        let now = self.clock.now_us();
        let d = self.lock(now);
        let mut out = BTreeMap::new();
        for (k, l) in d.levels.iter().filter(|(_, l)| l.expires_at_us > now) {
            let mut fields: BTreeMap<String, Vec<u8>> = l
                .leases
                .iter()
                .map(|(lease, exp)| (lease.field(), exp.to_le_bytes().to_vec()))
                .collect();
            fields.insert("s".into(), l.state.encode());
            if let Some((credit, t)) = l.credit {
                let bytes = [credit.to_le_bytes(), t.to_le_bytes()].concat();
                fields.insert("o".into(), bytes);
            }
            for (f, marker) in &l.alert_markers {
                fields.insert(f.clone(), marker.to_le_bytes().to_vec());
            }
            out.insert(k.clone(), (Stored::Hash(fields), l.expires_at_us));
        }
        for (k, (r, exp)) in d.records.iter().filter(|(_, (_, e))| *e > now) {
            out.insert(k.clone(), (Stored::String(r.encode()), *exp));
        }
        for (k, (nonce, exp)) in d.idempotency.iter().filter(|(_, (_, e))| *e > now) {
            out.insert(
                k.clone(),
                (Stored::String(nonce.clone().into_bytes()), *exp),
            );
        }
        for (k, (list, exp)) in d.samples.iter().filter(|(_, (_, e))| *e > now) {
            let items = list.iter().map(EstimatorSample::encode).collect();
            out.insert(k.clone(), (Stored::List(items), *exp));
        }
        for (k, (list, exp)) in d.outputs.iter().filter(|(_, (_, e))| *e > now) {
            let items = list
                .iter()
                .map(|&n| (n as f64).to_le_bytes().to_vec())
                .collect();
            out.insert(k.clone(), (Stored::List(items), *exp));
        }
        for (k, (rows, exp)) in d.ledger.iter().filter(|(_, (_, e))| *e > now) {
            let fields = rows.iter().map(|(f, r)| (f.clone(), r.encode())).collect();
            out.insert(k.clone(), (Stored::Hash(fields), *exp));
        }
        self.alerts_snapshot(&d, &mut out);
        out
    }

    /// The alert queues, their records' hashes, the queues' index and the
    /// recent alerts, as Redis holds them (no expiry).
    fn alerts_snapshot(&self, d: &super::Data, out: &mut BTreeMap<String, (Stored, i64)>) {
        for (key, q) in &d.alerts {
            if !q.due.is_empty() {
                out.insert(key.clone(), (Stored::ZSet(q.by_due()), NEVER));
            }
            let mut fields: BTreeMap<String, Vec<u8>> = q
                .records
                .iter()
                .map(|(id, r)| (id.clone(), r.clone()))
                .collect();
            for (id, n) in q.attempts.iter().filter(|(_, n)| **n > 0) {
                fields.insert(format!("n:{id}"), n.to_string().into_bytes());
            }
            if !fields.is_empty() {
                out.insert(format!("{key}:e"), (Stored::Hash(fields), NEVER));
            }
        }
        let index = super::alerts::index(&d.alerts);
        if !index.is_empty() {
            out.insert(self.keys.alert_index(), (Stored::ZSet(index), NEVER));
        }
        if d.alert_dropped > 0 {
            let n = d.alert_dropped.to_string().into_bytes();
            out.insert(self.keys.alert_dropped(), (Stored::String(n), NEVER));
        }
        if !d.alert_recent.is_empty() {
            let lines = d
                .alert_recent
                .iter()
                .map(|l| l.clone().into_bytes())
                .collect();
            out.insert(self.keys.alert_recent(), (Stored::List(lines), NEVER));
        }
    }
}
