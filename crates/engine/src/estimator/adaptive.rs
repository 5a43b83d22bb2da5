//! The adaptive multiplier: per estimator key, the last N ratios
//! actual ÷ estimated prompt tokens that Commits reported; the multiplier is
//! their 95th percentile, clamped, and a fixed starting value until enough
//! samples exist. The samples live in the store (so every replica learns from
//! every Commit); each replica caches the multipliers, reads a key's samples
//! before its first decision with that key (so a new replica starts from what
//! the others learned), and refreshes them from the store at least once a second.
//! With the content-aware correction ([`Correction::Content`]) each key also
//! keeps its fit ([`super::content`]), and the multiplier serves until the fit
//! has enough samples.

use super::content::{self, ContentFit, ContentSettings, upper_quantile};
use super::output::{OutputSettings, Outputs};
use crate::domain::mix::{EstimatorSample, PromptMix};
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How counts are corrected: `[estimator] correction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Correction {
    /// One multiplier per estimator key: the P95 of actual ÷ counted.
    Scalar,
    /// A cost per content group, fitted on the prompts' mixes.
    Content,
}

impl Correction {
    /// The configuration's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Correction::Scalar => "scalar",
            Correction::Content => "content",
        }
    }
}

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
    /// Scalar or content-aware.
    pub correction: Correction,
    /// How the content-aware correction learns.
    pub content: ContentSettings,
    /// How the learned output learns.
    pub output: OutputSettings,
}

impl Default for AdaptiveSettings {
    fn default() -> Self {
        AdaptiveSettings {
            window: 100,
            min_samples: 20,
            initial: 1.15,
            min: 1.0,
            max: 3.0,
            correction: Correction::Content,
            content: ContentSettings::default(),
            output: OutputSettings::default(),
        }
    }
}

/// The 95th percentile of `samples` as an upper prediction bound: the
/// ⌈0.95 (n + 1)⌉-th smallest, so that the next ratio exceeds it in at most 5%
/// of cases (the plain nearest rank, ⌈0.95 n⌉, is exceeded 5.9% of the time
/// with n = 100). 0 for no samples.
pub fn p95(samples: &[f64]) -> f64 {
    upper_quantile(samples, 0.95)
}

impl AdaptiveSettings {
    /// The multiplier for a key with these ratios (newest first, at most `window`).
    pub fn multiplier(&self, samples: &[f64]) -> f64 {
        if samples.len() < self.min_samples {
            return self.initial;
        }
        p95(samples).clamp(self.min, self.max)
    }

    /// Samples a key's list keeps in the store: enough for either correction.
    pub fn samples_kept(&self) -> usize {
        match self.correction {
            Correction::Scalar => self.window,
            Correction::Content => self.window.max(self.content.window),
        }
    }
}

/// What a decision applies to a count: the key's multiplier, or its fit
/// when there is one and the count has a mix; clamped either way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Corrector {
    /// The scalar multiplier.
    pub multiplier: f64,
    /// The content-aware fit, once it has enough samples.
    pub fit: Option<ContentFit>,
    min: f64,
    max: f64,
}

impl Corrector {
    /// Prompt tokens to reserve for `counted` tokens of `mix`, and the
    /// multiplier applied: the scalar one, or the fit's bound ÷ `counted`.
    pub fn reserve(&self, counted: u64, mix: Option<&PromptMix>) -> (u64, f64) {
        let n = counted as f64;
        let multiplier = match (&self.fit, mix) {
            (Some(fit), Some(mix)) if counted > 0 => (fit.upper(mix) / n).clamp(self.min, self.max),
            _ => self.multiplier,
        };
        ((n * multiplier).ceil() as u64, multiplier)
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
    /// The content-aware fit, with that correction and enough samples.
    pub fit: Option<ContentFit>,
    last_used: Instant,
}

/// The multipliers this replica knows, by estimator key.
pub struct Multipliers {
    settings: AdaptiveSettings,
    keys: RwLock<HashMap<String, KeyState>>,
    outputs: Outputs,
}

/// Keys unused this long are no longer refreshed (and forgotten).
const FORGET_AFTER: Duration = Duration::from_secs(600);

impl Multipliers {
    /// An empty cache.
    pub fn new(settings: AdaptiveSettings) -> Self {
        Multipliers {
            settings,
            keys: RwLock::new(HashMap::new()),
            outputs: Outputs::new(settings.output),
        }
    }

    /// The learned outputs, refreshed beside the multipliers.
    pub fn outputs(&self) -> &Outputs {
        &self.outputs
    }

    /// The settings.
    pub fn settings(&self) -> &AdaptiveSettings {
        &self.settings
    }

    /// The correction for `key` now; a key seen for the first time starts at
    /// the initial multiplier and is refreshed with the next round.
    pub fn get(&self, key: &str) -> Corrector {
        self.lookup(key).0
    }

    fn corrector(&self, state: &KeyState) -> Corrector {
        Corrector {
            multiplier: state.multiplier,
            fit: state.fit,
            min: self.settings.min,
            max: self.settings.max,
        }
    }

    /// The correction for `key` now, and whether this replica has read the
    /// key's samples from the store yet (if not, it is only the initial
    /// multiplier, whatever the other replicas learned). Marks the key in use.
    pub fn lookup(&self, key: &str) -> (Corrector, bool) {
        let now = Instant::now();
        if let Some(state) = self.keys.read().unwrap_or_else(|p| p.into_inner()).get(key)
            && now.duration_since(state.last_used) < Duration::from_secs(1)
        {
            return (self.corrector(state), state.refreshed.is_some());
        }
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        let state = keys.entry(key.to_string()).or_insert_with(|| KeyState {
            multiplier: self.settings.initial,
            samples: 0,
            p95: 0.0,
            refreshed: None,
            fit: None,
            last_used: now,
        });
        state.last_used = now;
        (self.corrector(state), state.refreshed.is_some())
    }

    /// Keys worth refreshing: used in the last ten minutes. Older ones are dropped.
    pub fn active_keys(&self) -> Vec<String> {
        let now = Instant::now();
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.retain(|_, s| now.duration_since(s.last_used) < FORGET_AFTER);
        keys.keys().cloned().collect()
    }

    /// Installs freshly read samples of `key` (newest first) and returns its
    /// correction. It does not count as a use: a key only refreshed is
    /// forgotten in time.
    pub fn update(&self, key: &str, samples: &[EstimatorSample]) -> Corrector {
        let ratios: Vec<f64> = samples
            .iter()
            .take(self.settings.window)
            .map(EstimatorSample::ratio)
            .collect();
        let multiplier = self.settings.multiplier(&ratios);
        let state = KeyState {
            multiplier,
            samples: ratios.len(),
            p95: p95(&ratios),
            refreshed: Some(Instant::now()),
            fit: match self.settings.correction {
                Correction::Content => content::fit(samples, &self.settings.content),
                Correction::Scalar => None,
            },
            last_used: Instant::now(),
        };
        let corrector = self.corrector(&state);
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
        corrector
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
        let (first, read) = m.lookup("gpt-4o");
        assert_eq!(
            (first.multiplier, read),
            (1.15, false),
            "never read from the store"
        );
        assert_eq!(m.active_keys(), vec!["gpt-4o".to_string()]);
        let samples = [EstimatorSample::Ratio(1.25); 30];
        assert_eq!(m.update("gpt-4o", &samples).multiplier, 1.25);
        let (learned, read) = m.lookup("gpt-4o");
        assert_eq!((learned.multiplier, read), (1.25, true));
        assert_eq!(learned.reserve(100, None), (125, 1.25));
        assert_eq!(m.snapshot()[0].1.samples, 30);
    }
}

#[cfg(test)]
mod content_tests {
    use super::*;

    #[test]
    fn a_fitted_key_corrects_by_the_mix_and_clamps() {
        let m = Multipliers::new(AdaptiveSettings::default());
        // English costs 1.0, Thai 3.0: the ratio's P95 must cover Thai.
        let samples: Vec<EstimatorSample> = (0..200)
            .map(|i| {
                let (latin, thai) = if i % 4 == 0 {
                    (10.0, 90.0)
                } else {
                    (100.0, 0.0)
                };
                let mix = PromptMix([latin, 0.0, 0.0, thai, 0.0, 0.0, 0.0]);
                EstimatorSample::of((latin + 3.0 * thai) as u64, 100.0, Some(mix))
            })
            .collect();
        let c = m.update("claude", &samples);
        assert!(c.fit.is_some());
        assert!(
            c.multiplier > 2.5,
            "the scalar covers the Thai prompts: {c:?}"
        );
        let english = PromptMix([100.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let (reserve, multiplier) = c.reserve(100, Some(&english));
        assert!(
            (100..=105).contains(&reserve),
            "tight for English: {reserve}"
        );
        assert_eq!(reserve, (100.0 * multiplier).ceil() as u64);
        assert_eq!(c.reserve(100, None).0, (100.0 * c.multiplier).ceil() as u64);
        let odd = PromptMix([0.0, 0.0, 0.0, 0.0, 0.0, 100.0, 0.0]);
        assert!(
            c.reserve(100, Some(&odd)).0 <= 300,
            "never above max_multiplier"
        );
        let scalar = Multipliers::new(AdaptiveSettings {
            correction: Correction::Scalar,
            ..AdaptiveSettings::default()
        });
        assert_eq!(scalar.update("claude", &samples).fit, None);
    }
}
