//! The adaptive multiplier: per estimator key, the last N ratios
//! actual ÷ estimated prompt tokens that Commits reported; the multiplier is
//! their 95th percentile, clamped, and a fixed starting value until enough
//! samples exist. The samples live in the store (so every replica learns from
//! every Commit); each replica caches the multipliers, reads a key's samples
//! before its first decision with that key (so a new replica starts from what
//! the others learned), and refreshes them from the store at least once a second.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How the multiplier behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveSettings {
    /// Ratios kept per key.
    pub window: usize,
    /// Samples needed before the P95 replaces `initial`.
    pub min_samples: usize,
    /// The multiplier until then.
    pub initial: f64,
    /// Lowest multiplier.
    pub min: f64,
    /// Highest multiplier.
    pub max: f64,
}

impl Default for AdaptiveSettings {
    fn default() -> Self {
        AdaptiveSettings {
            window: 100,
            min_samples: 20,
            initial: 1.15,
            min: 1.0,
            max: 3.0,
        }
    }
}

/// The 95th percentile of `samples` as an upper prediction bound: the
/// ⌈0.95 (n + 1)⌉-th smallest, so that the next ratio exceeds it in at most 5%
/// of cases (the plain nearest rank, ⌈0.95 n⌉, is exceeded 5.9% of the time
/// with n = 100). 0 for no samples.
pub fn p95(samples: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = (0.95 * (sorted.len() + 1) as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl AdaptiveSettings {
    /// The multiplier for a key with these samples.
    pub fn multiplier(&self, samples: &[f64]) -> f64 {
        if samples.len() < self.min_samples {
            return self.initial;
        }
        p95(samples).clamp(self.min, self.max)
    }
}

/// One key as a replica knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyState {
    /// The multiplier applied to new estimates.
    pub multiplier: f64,
    /// Samples in the window.
    pub samples: usize,
    /// P95 of the samples before clamping (0 with none).
    pub p95: f64,
    /// When the key was last refreshed from the store (`None`: never yet).
    pub refreshed: Option<Instant>,
    last_used: Instant,
}

/// The multipliers this replica knows, by estimator key.
pub struct Multipliers {
    settings: AdaptiveSettings,
    keys: RwLock<HashMap<String, KeyState>>,
}

/// Keys unused this long are no longer refreshed (and forgotten).
const FORGET_AFTER: Duration = Duration::from_secs(600);

impl Multipliers {
    /// An empty cache.
    pub fn new(settings: AdaptiveSettings) -> Self {
        Multipliers {
            settings,
            keys: RwLock::new(HashMap::new()),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &AdaptiveSettings {
        &self.settings
    }

    /// The multiplier for `key` now; a key seen for the first time starts at
    /// the initial value and is refreshed with the next round.
    pub fn get(&self, key: &str) -> f64 {
        self.lookup(key).0
    }

    /// The multiplier for `key` now, and whether this replica has read the
    /// key's samples from the store yet (if not, the multiplier is only the
    /// initial value, whatever the other replicas learned). Marks the key in use.
    pub fn lookup(&self, key: &str) -> (f64, bool) {
        let now = Instant::now();
        if let Some(state) = self.keys.read().unwrap_or_else(|p| p.into_inner()).get(key)
            && now.duration_since(state.last_used) < Duration::from_secs(1)
        {
            return (state.multiplier, state.refreshed.is_some());
        }
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let state = keys.entry(key.to_string()).or_insert_with(|| KeyState {
            multiplier: self.settings.initial,
            samples: 0,
            p95: 0.0,
            refreshed: None,
            last_used: now,
        });
        state.last_used = now;
        (state.multiplier, state.refreshed.is_some())
    }

    /// Keys worth refreshing: used in the last ten minutes. Older ones are dropped.
    pub fn active_keys(&self) -> Vec<String> {
        let now = Instant::now();
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.retain(|_, s| now.duration_since(s.last_used) < FORGET_AFTER);
        keys.keys().cloned().collect()
    }

    /// Installs freshly read samples of `key` and returns its multiplier. It
    /// does not count as a use: a key only refreshed is forgotten in time.
    pub fn update(&self, key: &str, samples: &[f64]) -> f64 {
        let multiplier = self.settings.multiplier(samples);
        let state = KeyState {
            multiplier,
            samples: samples.len(),
            p95: p95(samples),
            refreshed: Some(Instant::now()),
            last_used: Instant::now(),
        };
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        match keys.get_mut(key) {
            Some(s) => {
                *s = KeyState {
                    last_used: s.last_used,
                    ..state
                }
            }
            None => {
                keys.insert(key.to_string(), state);
            }
        }
        multiplier
    }

    /// Every key this replica knows, sorted.
    pub fn snapshot(&self) -> Vec<(String, KeyState)> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = keys.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_is_the_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(p95(&samples), 96.0, "the 96th of 100: exceeded by 5 in 101");
        assert_eq!(p95(&[2.0]), 2.0);
        assert_eq!(p95(&[]), 0.0);
    }

    #[test]
    fn the_multiplier_starts_fixed_then_follows_the_p95_clamped() {
        let s = AdaptiveSettings::default();
        assert_eq!(s.multiplier(&[1.3; 19]), 1.15, "too few samples");
        assert_eq!(s.multiplier(&[1.3; 20]), 1.3);
        assert_eq!(s.multiplier(&[0.5; 50]), 1.0, "never below the floor");
        assert_eq!(s.multiplier(&[9.0; 50]), 3.0, "never above the ceiling");
    }

    #[test]
    fn new_keys_start_at_the_initial_value_and_learn() {
        let m = Multipliers::new(AdaptiveSettings::default());
        assert_eq!(
            m.lookup("gpt-4o"),
            (1.15, false),
            "never read from the store"
        );
        assert_eq!(m.active_keys(), vec!["gpt-4o".to_string()]);
        assert_eq!(m.update("gpt-4o", &[1.25; 30]), 1.25);
        assert_eq!(m.lookup("gpt-4o"), (1.25, true));
        assert_eq!(m.snapshot()[0].1.samples, 30);
    }
}
