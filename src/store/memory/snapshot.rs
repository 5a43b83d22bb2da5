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
}

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
                .map(|(f, exp)| (f.clone(), exp.to_le_bytes().to_vec()))
                .collect();
            fields.insert("s".into(), l.state.encode());
            if let Some((credit, t)) = l.credit {
                let bytes = [credit.to_le_bytes(), t.to_le_bytes()].concat();
                fields.insert("o".into(), bytes);
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
        out
    }
}
