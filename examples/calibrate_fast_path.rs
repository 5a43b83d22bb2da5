//! Fits the fast-path heuristic's coefficients to exact token counts.
//!
//! `cargo run --release --example calibrate_fast_path` reads the corpus in
//! `tests/data/corpus` (prose in several scripts, emoji, and code), counts
//! every sample exactly for each encoding, and solves a weighted least-squares
//! fit (relative error) of tokens against the character-class features. Paste the
//! printed arrays into `src/estimator/heuristic.rs`.

use ctxbudget::estimator::Encoding;
use ctxbudget::estimator::count::tiktoken_count;
use ctxbudget::estimator::heuristic::{FEATURE_NAMES, FEATURES, estimate, features};
use std::path::Path;

fn samples(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root.join("tests/data/corpus")).expect("corpus dir") {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if path_is_code(&text) {
            // Code: twenty lines at a time, as prompts quote it.
            out.extend(lines.chunks(20).map(|c| c.join("\n")));
        } else {
            out.extend(lines.iter().map(|l| l.to_string()));
            // Longer samples: three lines at a time.
            out.extend(lines.chunks(3).map(|c| c.join("\n")));
        }
    }
    out.retain(|s| !s.trim().is_empty());
    out
}

fn path_is_code(text: &str) -> bool {
    text.contains("fn ") || text.contains("local ")
}

/// Non-negative weighted least squares by elimination: fit, drop any feature
/// whose coefficient comes out negative (a token count never shrinks as text
/// grows), refit.
fn fit(xs: &[[f64; FEATURES]], ys: &[f64]) -> [f64; FEATURES] {
    let mut active = [true; FEATURES];
    loop {
        let masked: Vec<[f64; FEATURES]> = xs
            .iter()
            .map(|x| std::array::from_fn(|i| if active[i] { x[i] } else { 0.0 }))
            .collect();
        let c = solve(&masked, ys);
        let negative: Vec<usize> = (0..FEATURES).filter(|&i| active[i] && c[i] < 0.0).collect();
        if negative.is_empty() {
            return std::array::from_fn(|i| if active[i] { c[i] } else { 0.0 });
        }
        for i in negative {
            active[i] = false;
        }
    }
}

/// Solves (XᵀWX + λI) c = XᵀWy by Gaussian elimination.
fn solve(xs: &[[f64; FEATURES]], ys: &[f64]) -> [f64; FEATURES] {
    let mut a = [[0.0; FEATURES + 1]; FEATURES];
    for (x, &y) in xs.iter().zip(ys) {
        let w = 1.0 / (y * y).max(1.0);
        for i in 0..FEATURES {
            for j in 0..FEATURES {
                a[i][j] += w * x[i] * x[j];
            }
            a[i][FEATURES] += w * x[i] * y;
        }
    }
    for (i, row) in a.iter_mut().enumerate() {
        row[i] += 1e-6;
    }
    for col in 0..FEATURES {
        let pivot = (col..FEATURES)
            .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
            .unwrap();
        a.swap(col, pivot);
        let pivot_row = a[col];
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let factor = row[col] / pivot_row[col];
                for (cell, p) in row.iter_mut().zip(pivot_row.iter()).skip(col) {
                    *cell -= factor * p;
                }
            }
        }
    }
    std::array::from_fn(|i| a[i][FEATURES] / a[i][i])
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let samples = samples(root);
    println!("{} samples", samples.len());
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let xs: Vec<_> = samples.iter().map(|s| features(s)).collect();
        let ys: Vec<f64> = samples
            .iter()
            .map(|s| tiktoken_count(encoding, s) as f64)
            .collect();
        let c = fit(&xs, &ys);
        let err: f64 = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| {
                let est: f64 = x.iter().zip(&c).map(|(a, b)| a * b).sum();
                (est - y).abs() / y
            })
            .sum::<f64>()
            / ys.len() as f64;
        println!(
            "\n{}: mean relative error {:.1}%",
            encoding.as_str(),
            err * 100.0
        );
        for (name, v) in FEATURE_NAMES.iter().zip(&c) {
            println!("  {name:>13}: {v:.4}");
        }
        let list: Vec<String> = c.iter().map(|v| format!("{v:.4}")).collect();
        println!(
            "const {}: [f64; FEATURES] = [{}];",
            encoding.as_str().to_uppercase().replace("_BASE", ""),
            list.join(", ")
        );
        let _ = estimate(encoding, "");
    }
}
