//! The learned output: a high quantile of the completions recently committed
//! under one (estimator key, tier), which levels with `output_reservation =
//! "learned"` hold instead of the whole `max_output_tokens`. Cached per
//! replica and refreshed from the store with the estimator's samples.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How the learned output learns (`[estimator] output_*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputSettings {
    /// Completions kept per (estimator key, tier).
    pub window: usize,
    /// Completions needed before the learned output applies (until then a
    /// reservation holds the whole grant).
    pub min_samples: usize,
    /// The quantile of the completions held.
    pub quantile: f64,
}

impl Default for OutputSettings {
    fn default() -> Self {
        OutputSettings {
            window: 200,
            min_samples: 20,
            quantile: 0.95,
        }
    }
}

impl OutputSettings {
    /// The learned output of `samples` (newest first): the quantile of the
    /// newest `window`, at least 1; `None` below `min_samples`.
    pub fn learned(&self, samples: &[u64]) -> Option<u64> {
        let mut kept: Vec<u64> = samples.iter().take(self.window).copied().collect();
        if kept.len() < self.min_samples.max(1) {
            return None;
        }
        kept.sort_unstable();
        // The nearest rank: at most (1 − quantile) of the completions exceed it.
        let rank = (self.quantile * kept.len() as f64).ceil() as usize;
        Some(kept[rank.clamp(1, kept.len()) - 1].max(1))
    }
}

/// One (estimator key, tier) as this replica knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedOutput {
    /// The output tokens held; `None` until enough completions.
    pub tokens: Option<u64>,
    /// Completions in the window.
    pub samples: usize,
    /// When it was last read from the store (`None`: not yet).
    pub refreshed: Option<Instant>,
    last_used: Instant,
}

/// Pairs unused this long are no longer refreshed (and forgotten).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Learned outputs by estimator key, then tier: looked up by `&str` with no
/// allocation on a reservation's path.
type Pairs = HashMap<String, HashMap<String, LearnedOutput>>;

/// The learned outputs of the pairs this replica reserves for.
pub struct Outputs {
    settings: OutputSettings,
    pairs: RwLock<Pairs>,
}

impl Outputs {
    /// An empty cache.
    pub fn new(settings: OutputSettings) -> Self {
        Outputs {
            settings,
            pairs: RwLock::new(HashMap::new()),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &OutputSettings {
        &self.settings
    }

    /// The learned output of (`key`, `tier`) now, and whether this replica
    /// has read its completions from the store yet. Marks the pair in use.
    pub fn lookup(&self, key: &str, tier: &str) -> (Option<u64>, bool) {
        let now = Instant::now();
        if let Some(s) = self.read().get(key).and_then(|t| t.get(tier))
            && now.duration_since(s.last_used) < Duration::from_secs(1)
        {
            return (s.tokens, s.refreshed.is_some());
        }
        let mut pairs = self.pairs.write().unwrap_or_else(|p| p.into_inner());
        let s = entry(&mut pairs, key, tier, now);
        s.last_used = now;
        (s.tokens, s.refreshed.is_some())
    }

    /// Installs freshly read completions of (`key`, `tier`), newest first;
    /// returns the learned output.
    pub fn update(&self, key: &str, tier: &str, samples: &[u64]) -> Option<u64> {
        let tokens = self.settings.learned(samples);
        let now = Instant::now();
        let mut pairs = self.pairs.write().unwrap_or_else(|p| p.into_inner());
        let s = entry(&mut pairs, key, tier, now);
        s.tokens = tokens;
        s.samples = samples.len().min(self.settings.window);
        s.refreshed = Some(now);
        tokens
    }

    /// Pairs worth refreshing: used in the last ten minutes. Older ones are
    /// dropped.
    pub fn active_pairs(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        let mut pairs = self.pairs.write().unwrap_or_else(|p| p.into_inner());
        for tiers in pairs.values_mut() {
            tiers.retain(|_, s| now.duration_since(s.last_used) < FORGET_AFTER);
        }
        pairs.retain(|_, tiers| !tiers.is_empty());
        pairs
            .iter()
            .flat_map(|(k, tiers)| tiers.keys().map(move |t| (k.clone(), t.clone())))
            .collect()
    }

    /// Every pair this replica knows, sorted.
    pub fn snapshot(&self) -> Vec<((String, String), LearnedOutput)> {
        let mut out: Vec<_> = self
            .read()
            .iter()
            .flat_map(|(k, tiers)| {
                tiers
                    .iter()
                    .map(move |(t, v)| ((k.clone(), t.clone()), v.clone()))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Pairs> {
        self.pairs.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// The pair's entry, made (nothing learned, never read) if new.
fn entry<'a>(pairs: &'a mut Pairs, key: &str, tier: &str, now: Instant) -> &'a mut LearnedOutput {
    pairs
        .entry(key.to_owned())
        .or_default()
        .entry(tier.to_owned())
        .or_insert_with(|| LearnedOutput {
            tokens: None,
            samples: 0,
            refreshed: None,
            last_used: now,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_learned_output_is_the_quantile_of_the_newest_window_once_there_are_enough() {
        let s = OutputSettings {
            window: 100,
            min_samples: 20,
            quantile: 0.95,
        };
        let samples: Vec<u64> = (1..=100).collect();
        assert_eq!(s.learned(&samples), Some(95));
        assert_eq!(s.learned(&samples[..19]), None, "too few");
        // Only the newest window counts.
        let mut older = samples.clone();
        older.extend([10_000; 50]);
        assert_eq!(s.learned(&older), Some(95));
        assert_eq!(s.learned(&[0; 30]), Some(1), "never 0");
        let outputs = Outputs::new(s);
        assert_eq!(outputs.lookup("k", "free"), (None, false));
        assert_eq!(outputs.update("k", "free", &samples), Some(95));
        assert_eq!(outputs.lookup("k", "free"), (Some(95), true));
        assert_eq!(outputs.active_pairs(), vec![("k".into(), "free".into())]);
    }
}
