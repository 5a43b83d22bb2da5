//! A map of many keys split into [`SHARDS`] maps by the key's hash, so that
//! growing never rehashes everything at once: one shard doubles at a time,
//! a 64th of the entries. Unsplit, the records of a busy memory store (one
//! per reservation, kept for the record retention) rehashed 360,000 entries
//! in one go and held the store's lock for 0.3 s (docs/benchmarks.md).

use crate::domain::budget::FastMap;
use std::hash::BuildHasher;

/// How many maps the keys are split into.
pub(super) const SHARDS: usize = 64;

/// String keys → `V`, split by hash.
pub(super) struct Sharded<V> {
    shards: Vec<FastMap<String, V>>,
    pick: foldhash::fast::RandomState,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| FastMap::default()).collect(),
            pick: foldhash::fast::RandomState::default(),
        }
    }
}

impl<V> Sharded<V> {
    fn shard(&self, key: &str) -> usize {
        self.pick.hash_one(key) as usize % SHARDS
    }

    /// The value of `key`, if any.
    pub(super) fn get(&self, key: &str) -> Option<&V> {
        self.shards[self.shard(key)].get(key)
    }

    /// Sets `key` to `value`.
    pub(super) fn insert(&mut self, key: String, value: V) {
        let i = self.shard(&key);
        self.shards[i].insert(key, value);
    }

    /// Keeps only the entries `keep` says to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&String, &mut V) -> bool) {
        for shard in &mut self.shards {
            shard.retain(&mut keep);
        }
    }

    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(FastMap::len).sum()
    }

    /// Every entry, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_the_shards_and_read_back() {
        let mut m = Sharded::default();
        for i in 0..1000 {
            m.insert(format!("k{i}"), i);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get("k417"), Some(&417));
        assert_eq!(m.get("nope"), None);
        assert!(
            m.shards.iter().all(|s| !s.is_empty()),
            "every shard holds some"
        );
        m.retain(|_, v| *v % 2 == 0);
        assert_eq!((m.len(), m.iter().count()), (500, 500));
        assert_eq!(m.get("k417"), None);
    }
}
