//! `[estimator]`: token counting and the adaptive correction, as written and
//! as validated.

use super::input::within;
use crate::domain::LimitsError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[estimator]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EstimatorSection {
    /// Encoding for models that are not OpenAI's.
    #[serde(default = "default_encoding")]
    pub default_encoding: crate::estimator::Encoding,
    /// Model patterns (`name` or `prefix*`) counted with the fast heuristic.
    #[serde(default)]
    pub fast_path: Vec<String>,
    /// Model pattern → estimator key: models whose samples are pooled. With
    /// the fast-path patterns and the built-in table's rows, the only
    /// estimator keys there are; other models share their encoding's key.
    #[serde(default)]
    pub groups: BTreeMap<String, String>,
    /// Samples kept per key.
    #[serde(default = "default_window")]
    pub window: usize,
    /// Samples needed before the P95 replaces the initial multiplier.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
    /// The multiplier until then.
    #[serde(default = "default_initial")]
    pub initial_multiplier: f64,
    /// Lowest multiplier.
    #[serde(default = "default_min_multiplier")]
    pub min_multiplier: f64,
    /// Highest multiplier.
    #[serde(default = "default_max_multiplier")]
    pub max_multiplier: f64,
    /// Long prompts counted at once (0: one per CPU).
    #[serde(default)]
    pub workers: usize,
    /// `"content"` (a cost per content group, fitted on the prompts' mixes)
    /// or `"scalar"` (one multiplier per key).
    #[serde(default = "default_correction")]
    pub correction: crate::estimator::Correction,
    /// Samples the content-aware fit uses.
    #[serde(default = "default_content_window")]
    pub content_window: usize,
    /// Samples with a mix needed before the fit replaces the multiplier.
    #[serde(default = "default_content_min_samples")]
    pub content_min_samples: usize,
    /// The quantile of the fit's leave-one-out ratios reserved as margin.
    #[serde(default = "default_content_quantile")]
    pub content_quantile: f64,
    /// The quantile of recent completions a learned output reservation holds.
    #[serde(default = "default_output_quantile")]
    pub output_quantile: f64,
    /// Completions kept per (estimator key, tier).
    #[serde(default = "default_output_window")]
    pub output_window: usize,
    /// Completions needed before a learned output applies.
    #[serde(default = "default_output_min_samples")]
    pub output_min_samples: usize,
}

impl EstimatorSection {
    /// The adaptive multiplier's settings, each checked against its range.
    pub fn adaptive(&self) -> Result<crate::estimator::AdaptiveSettings, LimitsError> {
        within("estimator.window", self.window as u64, 1, 10_000)?;
        within(
            "estimator.min_samples",
            self.min_samples as u64,
            1,
            self.window as u64,
        )?;
        within("estimator.workers", self.workers as u64, 0, 1024)?;
        let ok = |v: f64| v.is_finite() && (0.1..=100.0).contains(&v);
        if !(ok(self.min_multiplier)
            && ok(self.max_multiplier)
            && self.min_multiplier <= self.max_multiplier)
        {
            return Err(LimitsError::new(
                "estimator.min_multiplier",
                "min_multiplier and max_multiplier must be between 0.1 and 100, min ≤ max",
            ));
        }
        if !(self.min_multiplier..=self.max_multiplier).contains(&self.initial_multiplier) {
            return Err(LimitsError::new(
                "estimator.initial_multiplier",
                "must be between min_multiplier and max_multiplier",
            ));
        }
        within(
            "estimator.content_window",
            self.content_window as u64,
            10,
            10_000,
        )?;
        within(
            "estimator.content_min_samples",
            self.content_min_samples as u64,
            10,
            self.content_window as u64,
        )?;
        if !(self.content_quantile > 0.5 && self.content_quantile < 1.0) {
            return Err(LimitsError::new(
                "estimator.content_quantile",
                "must be above 0.5 and below 1 (0.985: 1.5% of prompts may exceed their reservation)",
            ));
        }
        Ok(crate::estimator::AdaptiveSettings {
            window: self.window,
            min_samples: self.min_samples,
            initial: self.initial_multiplier,
            min: self.min_multiplier,
            max: self.max_multiplier,
            correction: self.correction,
            content: crate::estimator::content::ContentSettings {
                window: self.content_window,
                min_samples: self.content_min_samples,
                quantile: self.content_quantile,
            },
            output: self.output()?,
        })
    }

    /// The learned output's settings, each checked against its range.
    fn output(&self) -> Result<crate::estimator::output::OutputSettings, LimitsError> {
        within(
            "estimator.output_window",
            self.output_window as u64,
            10,
            10_000,
        )?;
        within(
            "estimator.output_min_samples",
            self.output_min_samples as u64,
            1,
            self.output_window as u64,
        )?;
        if !(self.output_quantile > 0.5 && self.output_quantile < 1.0) {
            return Err(LimitsError::new(
                "estimator.output_quantile",
                "must be above 0.5 and below 1 (0.95: 5% of completions may use more than is reserved)",
            ));
        }
        Ok(crate::estimator::output::OutputSettings {
            window: self.output_window,
            min_samples: self.output_min_samples,
            quantile: self.output_quantile,
        })
    }

    /// Long prompts counted at once: the configured number, or one per CPU.
    pub fn count_workers(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        }
    }

    /// The model rules, each group key and fast-path pattern checked: they
    /// become estimator keys, which reservation ids carry.
    pub fn model_rules(&self) -> Result<crate::estimator::ModelRules, LimitsError> {
        use crate::estimator::encoding::{Pattern, check_key};
        for (pattern, key) in &self.groups {
            check_key(pattern)
                .and_then(|()| check_key(key))
                .map_err(|p| LimitsError::new(format!("estimator.groups.{pattern:?}"), p))?;
        }
        for (i, pattern) in self.fast_path.iter().enumerate() {
            check_key(pattern)
                .map_err(|p| LimitsError::new(format!("estimator.fast_path[{i}]"), p))?;
        }
        Ok(crate::estimator::ModelRules {
            default_encoding: self.default_encoding,
            fast: self.fast_path.iter().map(|p| Pattern::new(p)).collect(),
            groups: self
                .groups
                .iter()
                .map(|(p, k)| (Pattern::new(p), k.clone()))
                .collect(),
        })
    }
}

fn default_encoding() -> crate::estimator::Encoding {
    crate::estimator::Encoding::O200kBase
}
fn default_window() -> usize {
    100
}
fn default_min_samples() -> usize {
    20
}
fn default_initial() -> f64 {
    1.15
}
fn default_min_multiplier() -> f64 {
    1.0
}
fn default_max_multiplier() -> f64 {
    3.0
}
fn default_correction() -> crate::estimator::Correction {
    crate::estimator::Correction::Content
}
fn default_content_window() -> usize {
    crate::estimator::content::ContentSettings::default().window
}
fn default_content_min_samples() -> usize {
    crate::estimator::content::ContentSettings::default().min_samples
}
fn default_content_quantile() -> f64 {
    crate::estimator::content::ContentSettings::default().quantile
}
fn default_output_quantile() -> f64 {
    crate::estimator::output::OutputSettings::default().quantile
}
fn default_output_window() -> usize {
    crate::estimator::output::OutputSettings::default().window
}
fn default_output_min_samples() -> usize {
    crate::estimator::output::OutputSettings::default().min_samples
}
