//! The README's "Try it": `cargo run --example quickstart` against a server
//! with the built-in configuration (what `ctxbudget serve` runs), twice in a
//! row — each run is a tenant of its own, so the second is not denied what
//! the first spent — and each prints what the README shows, in its order.

use crate::support;

use ctxbudget::config::{FileConfig, Flags};
use std::path::Path;
use std::process::Command;
use support::Harness;

/// The sample output under the README's "Try it".
fn readme_sample() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let (_, after) = readme
        .split_once("## Try it")
        .expect("the README has a \"Try it\" section");
    let (_, block) = after.split_once("```text\n").expect("a text block");
    let (block, _) = block.split_once("```").expect("the block ends");
    block.lines().map(str::to_owned).collect()
}

/// A line with what changes from run to run made alike: numbers, ids (the
/// README shortens them with `…`) and the run's tenant suffix.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if let Some(tail) = rest.strip_prefix("rsv_") {
            out.push_str("rsv_");
            rest =
                tail.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || "-_…".contains(c));
        } else if let Some(tail) = rest.strip_prefix("acme-") {
            out.push_str("acme-");
            rest = tail.trim_start_matches(|c: char| c.is_ascii_hexdigit());
        } else if c.is_ascii_digit() {
            out.push('0');
            rest = rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Runs the example against `url` through cargo, as the README does.
fn run_quickstart(url: &str) -> String {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let mut command = Command::new(cargo);
    // Without the variables cargo set for this test (a build script that
    // watches one would make the inner cargo rebuild what the outer built).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_tests = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
            || ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"].contains(&name.as_ref());
        if set_for_tests {
            command.env_remove(name.as_ref());
        }
    }
    let out = command
        .args(["run", "--quiet", "--example", "quickstart", "--", url])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the quickstart failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_runs_twice_in_a_row_and_prints_what_the_readme_shows() {
    let settings = FileConfig::built_in().settings(Flags::default()).unwrap();
    let h = Harness::start_with(settings, None).await;
    let url = format!("http://{}", h.addr);
    let sample: Vec<String> = readme_sample()
        .iter()
        .filter(|l| l.trim() != "…")
        .map(|l| shape(l))
        .collect();
    assert!(sample.len() > 10, "{sample:#?}");
    for run in 1..=2 {
        let printed = run_quickstart(&url);
        // Every line of the README's sample, in its order ("…" stands for
        // lines left out).
        let mut lines = printed.lines().map(shape);
        for want in &sample {
            assert!(
                lines.any(|l| &l == want),
                "run {run}: the README's line {want:?} is not printed (in that order):\n{printed}"
            );
        }
    }
    h.stop().await;
}
