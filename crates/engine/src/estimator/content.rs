//! The content-aware correction: how many tokens each content group of a
//! prompt (Latin text, digits, symbols and code, Thai, CJK, other scripts,
//! emoji) really costs a model, learned from Commits, so that a reservation
//! can be tight for English and still cover Thai.
//!
//! [`mix`] splits the service's count of a prompt by group, with the fast
//! path's character classes. [`fit`] fits the upstream's counts on the mixes
//! of the last samples: weighted least squares (weights 1 ÷ actual², so every
//! prompt counts by its relative error, as reservations are judged) with a
//! constant (framing, hidden system prompts), each group's cost shrunk toward
//! the common ratio actual ÷ counted (a group seldom seen costs what the
//! others do, not an unidentified number). The upper bound is a high quantile
//! of the leave-one-out ratios actual ÷ predicted, so the margin is what the
//! fit achieves on prompts it did not see, and shrinks as the fit improves.

use super::count::Prompt;
use super::encoding::Method;
use super::heuristic::{self, GROUP_OF};
use crate::domain::mix::{EstimatorSample, GROUPS, PromptMix};

/// The fitted parameters: a cost per group and the constant.
const PARAMS: usize = GROUPS + 1;

/// How strongly each group's cost is held to the common ratio: worth a
/// hundredth of a prompt made only of that group, so that any group the
/// samples hold speaks for itself and only one they lack takes the ratio.
const SHRINK: f64 = 0.01;

/// How the content-aware correction learns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ContentSettings {
    /// Samples it fits on (the newest).
    pub window: usize,
    /// Samples needed before it replaces the scalar multiplier.
    pub min_samples: usize,
    /// The quantile of the leave-one-out ratios taken as the upper bound.
    pub quantile: f64,
}

impl Default for ContentSettings {
    fn default() -> Self {
        ContentSettings {
            window: 400,
            min_samples: 50,
            quantile: 0.985,
        }
    }
}

/// `counted`, the service's count of `prompt` with `method`, split by content
/// group in proportion to what the fast path's character classes add.
pub fn mix(method: Method, prompt: &Prompt, counted: u64) -> PromptMix {
    let mut groups = [0f64; GROUPS];
    let mut add = |text: &str| {
        for (i, t) in heuristic::contributions(method.encoding(), text)
            .into_iter()
            .enumerate()
        {
            groups[GROUP_OF[i]] += t;
        }
    };
    match prompt {
        Prompt::Text(text) => add(text),
        Prompt::Messages(messages) => {
            for m in messages {
                add(&m.content);
                if let Some(name) = &m.name {
                    add(name);
                }
            }
        }
    }
    let sum: f64 = groups.iter().sum();
    let mut out = [0f32; GROUPS];
    if sum > 0.0 {
        let scale = counted as f64 / sum;
        for (o, g) in out.iter_mut().zip(groups) {
            *o = (g * scale) as f32;
        }
    } else {
        out[0] = counted as f32;
    }
    PromptMix(out)
}

/// A fitted correction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ContentFit {
    /// Upstream tokens per counted token, by group.
    pub costs: [f64; GROUPS],
    /// Upstream tokens every prompt adds.
    pub constant: f64,
    /// The quantile of actual ÷ predicted (leave-one-out): the margin.
    pub bound: f64,
    /// Samples fitted.
    pub samples: usize,
}

impl ContentFit {
    /// The expected upstream count of a prompt of `mix`.
    pub fn predict(&self, mix: &PromptMix) -> f64 {
        let tokens: f64 = self
            .costs
            .iter()
            .zip(mix.0)
            .map(|(c, t)| c * f64::from(t))
            .sum();
        tokens + self.constant
    }

    /// The upper bound of the upstream count: the prediction times the margin.
    pub fn upper(&self, mix: &PromptMix) -> f64 {
        self.predict(mix).max(0.0) * self.bound
    }
}

/// The fit on the newest `settings.window` samples with a mix; `None` with
/// fewer than `settings.min_samples` of them, or none usable.
pub fn fit(samples: &[EstimatorSample], settings: &ContentSettings) -> Option<ContentFit> {
    let rows: Vec<(f64, [f64; PARAMS])> = samples
        .iter()
        .filter_map(|s| match s {
            EstimatorSample::Mix { actual, mix, .. } if *actual > 0 && mix.total() > 0.0 => {
                let mut x = [1f64; PARAMS];
                for (x, t) in x.iter_mut().zip(mix.0) {
                    *x = f64::from(t);
                }
                Some((f64::from(*actual), x))
            }
            _ => None,
        })
        .take(settings.window)
        .collect();
    if rows.len() < settings.min_samples.max(PARAMS) {
        return None;
    }
    let common = common_ratio(&rows);
    // The normal equations of the weighted, shrunk least squares.
    let mut a = [[0f64; PARAMS]; PARAMS];
    let mut b = [0f64; PARAMS];
    for (y, x) in &rows {
        let w = 1.0 / (y * y);
        for i in 0..PARAMS {
            b[i] += w * x[i] * y;
            for j in 0..=i {
                a[i][j] += w * x[i] * x[j];
            }
        }
    }
    for g in 0..GROUPS {
        a[g][g] += SHRINK;
        b[g] += SHRINK * common;
    }
    let chol = cholesky(a)?;
    let beta = solve(&chol, b);
    let ratios: Vec<f64> = rows
        .iter()
        .map(|(y, x)| {
            let fitted: f64 = x.iter().zip(&beta).map(|(x, b)| x * b).sum();
            let leverage = dot(x, &solve(&chol, *x)) / (y * y);
            let left_out = y - (y - fitted) / (1.0 - leverage).max(1e-9);
            if left_out > 0.0 {
                y / left_out
            } else {
                f64::MAX
            }
        })
        .collect();
    let mut costs = [0f64; GROUPS];
    costs.copy_from_slice(&beta[..GROUPS]);
    Some(ContentFit {
        costs,
        constant: beta[GROUPS],
        bound: upper_quantile(&ratios, settings.quantile),
        samples: rows.len(),
    })
}

/// The `q` quantile of `samples` as an upper prediction bound: the
/// ⌈q (n + 1)⌉-th smallest (the largest when n is too small for it), so that
/// the next sample of the same kind exceeds it in at most 1 − q of cases.
/// Non-finite samples are left out; 0 for none.
pub fn upper_quantile(samples: &[f64], q: f64) -> f64 {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = (q * (sorted.len() + 1) as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The one ratio that best predicts actual from counted, by relative error.
fn common_ratio(rows: &[(f64, [f64; PARAMS])]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (y, x) in rows {
        let r = x[..GROUPS].iter().sum::<f64>() / y;
        num += r;
        den += r * r;
    }
    num / den
}

fn dot(a: &[f64; PARAMS], b: &[f64; PARAMS]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// The lower-triangular `L` with `L Lᵀ = a` (`a`'s lower triangle read);
/// `None` if `a` is not positive definite.
fn cholesky(a: [[f64; PARAMS]; PARAMS]) -> Option<[[f64; PARAMS]; PARAMS]> {
    let mut l = [[0f64; PARAMS]; PARAMS];
    for i in 0..PARAMS {
        for j in 0..=i {
            let s: f64 = a[i][j] - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>();
            if i == j {
                if s <= 1e-12 * a[i][i].abs().max(1e-300) {
                    return None;
                }
                l[i][i] = s.sqrt();
            } else {
                l[i][j] = s / l[j][j];
            }
        }
    }
    Some(l)
}

/// `x` with `L Lᵀ x = b`.
fn solve(l: &[[f64; PARAMS]; PARAMS], b: [f64; PARAMS]) -> [f64; PARAMS] {
    let mut y = b;
    for i in 0..PARAMS {
        y[i] = (y[i] - (0..i).map(|k| l[i][k] * y[k]).sum::<f64>()) / l[i][i];
    }
    for i in (0..PARAMS).rev() {
        y[i] = (y[i] - (i + 1..PARAMS).map(|k| l[k][i] * y[k]).sum::<f64>()) / l[i][i];
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::Encoding;

    fn sample(actual: f64, mix: [f32; GROUPS]) -> EstimatorSample {
        let mix = PromptMix(mix);
        EstimatorSample::of(actual.round() as u64, mix.total().round(), Some(mix))
    }

    #[test]
    fn a_mix_splits_the_count_by_group() {
        let m = mix(
            Method::Exact(Encoding::O200kBase),
            &Prompt::Text("Hello world สวัสดีครับ 12345".into()),
            20,
        );
        assert!((m.total() - 20.0).abs() < 1e-4, "{m:?}");
        assert!(m.0[0] > 0.0 && m.0[3] > 0.0 && m.0[1] > 0.0, "{m:?}");
        assert_eq!(m.0[4], 0.0, "no CJK");
    }

    #[test]
    fn the_fit_learns_what_each_group_costs() {
        // Latin costs 1.0, Thai 3.0, plus 5 tokens; a little noise.
        let samples: Vec<_> = (0..200)
            .map(|i| {
                let latin = 20.0 + (i % 17) as f32 * 10.0;
                let thai = (i % 5) as f32 * 15.0;
                let noise = 1.0 + (i % 7) as f64 * 0.005;
                let actual = (f64::from(latin) + 3.0 * f64::from(thai) + 5.0) * noise;
                sample(actual, [latin, 0.0, 0.0, thai, 0.0, 0.0, 0.0])
            })
            .collect();
        let fit = fit(&samples, &ContentSettings::default()).expect("enough samples");
        assert!((fit.costs[0] - 1.015).abs() < 0.05, "{fit:?}");
        assert!((fit.costs[3] - 3.045).abs() < 0.1, "{fit:?}");
        assert!(fit.bound > 1.0 && fit.bound < 1.04, "{fit:?}");
        let english = PromptMix([100.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let thai = PromptMix([0.0, 0.0, 0.0, 100.0, 0.0, 0.0, 0.0]);
        assert!(fit.upper(&english) < 115.0 && fit.upper(&english) > 105.0);
        assert!(fit.upper(&thai) > 300.0 && fit.upper(&thai) < 330.0);
    }

    #[test]
    fn too_few_samples_or_none_with_a_mix_fit_nothing() {
        let s = ContentSettings::default();
        let few: Vec<_> = (0..49).map(|_| sample(10.0, [10.0; GROUPS])).collect();
        assert_eq!(fit(&few, &s), None);
        let ratios = vec![EstimatorSample::Ratio(1.1); 300];
        assert_eq!(fit(&ratios, &s), None);
    }
}
