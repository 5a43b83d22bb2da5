//! `ctxbudget bench`: a load generator for the gRPC API, with a Redis ceiling to
//! compare against and an overspend check in every run.
//!
//! This file owns the flags and the order of a run: ceiling, main phase,
//! calibration, report.
//!
//! - [`workload`]: who calls, how big the prompts are, how long upstream takes.
//! - [`target`]: the service over gRPC, or an engine over a store in-process;
//!   `ext_proc`: the service's external processor driven as Envoy drives it.
//! - `engines`: the in-process engines and the embedded service a phase drives.
//! - `phases`: the ceiling and main phases, each measured and checked.
//! - [`run`]: closed- and open-loop drivers, latency histograms, progress.
//! - [`ledger`]: what was granted per bucket, checked against the limits.
//! - `calibrate`, `redis_info`: Redis CPU per script, `INFO` readings.
//! - [`report`], [`plot`]: the table, JSON and the SVG chart.

mod calibrate;
mod engines;
mod ext_proc;
mod http;
pub mod ledger;
mod phases;
pub mod plot;
mod redis_info;
pub mod report;
pub mod run;
pub mod target;
pub mod workload;

use crate::config::{self, Flags, Settings};
use phases::Bench;
use report::{BenchReport, PhaseReport};
use run::Drive;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use workload::{Workload, WorkloadArgs};

/// `ctxbudget bench` flags.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Drive a running service, e.g. http://127.0.0.1:50051.
    #[arg(long, conflicts_with_all = ["embedded", "direct"])]
    pub target: Option<String>,
    /// Start a service in this process: `memory` or a Redis URL (the default is
    /// `--embedded memory`).
    #[arg(long, conflicts_with = "direct")]
    pub embedded: Option<String>,
    /// Call the engine in this process, without gRPC: `memory` or a Redis URL.
    #[arg(long)]
    pub direct: Option<String>,
    /// First run the same workload straight against this Redis (one EVALSHA per
    /// call, no gRPC, same concurrency and keys), then the service, and report
    /// the ratio.
    #[arg(long)]
    pub ceiling: Option<String>,
    /// The API the load goes through: `budget` (CheckAndReserve, Commit,
    /// Refund), `envoy` (ShouldRateLimit: the request path for each
    /// reservation, the response path charging each Commit's tokens) or
    /// `ext_proc` (one Process stream per call: the body read and reserved,
    /// the streamed answer read for its usage and committed) or `http` (the
    /// HTTP/JSON API: --target names the service's `[http] listen`, e.g.
    /// http://127.0.0.1:8080). The last three need a service: --embedded or
    /// --target.
    #[arg(long, value_enum, default_value = "budget")]
    pub api: target::Api,
    /// Closed loop: reservations in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Open loop: CheckAndReserve calls per second, latency measured from each
    /// call's intended send time.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured time, e.g. 10s, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured time first.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Configuration with the tiers to use (default: the built-in tiers).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// gRPC connections from the bench, and Redis connections of an in-process store.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Also write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also draw the latency-percentile chart as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No live progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Parses `10s`, `2m`, `500ms`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{text:?} is not a duration like 500ms, 10s, 2m"));
    }
    config::period_seconds(text)
        .map(Duration::from_secs)
        .map_err(|e| e.to_string())
}

/// The bench could not run.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BenchError(pub String);

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError(e.to_string())
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Runs the bench and returns its report (the command prints it: `render`).
pub async fn run(args: BenchArgs, command: String) -> Result<BenchReport, BenchError> {
    let settings = config::load(args.config.as_deref(), Flags::default()).map_err(err)?;
    if args.api != target::Api::Budget && (args.direct.is_some() || args.ceiling.is_some()) {
        return Err(BenchError(
            "--api envoy, ext_proc and http drive the service's other faces: use --embedded or \
             --target, without --direct or --ceiling"
                .into(),
        ));
    }
    let bench = Bench {
        settings: &settings,
        workload: Arc::new(workload(&args, &settings)?),
        drive: Drive {
            concurrency: args.concurrency,
            rate: args.rate,
            duration: args.duration,
            warmup: args.warmup,
            progress: !args.no_progress,
        },
        stamp: unix_ms(),
        connections: args.connections,
        api: args.api,
    };
    let mut phases = Vec::new();
    if let Some(url) = &args.ceiling {
        phases.push(bench.ceiling(url).await?);
    }
    let main = bench.main_phase(&args).await?;
    let (phase, url) = bench.run_main(main).await?;
    phases.push(phase);
    let redis_seen = args.ceiling.clone().or(url);
    let report = report(&bench, phases, redis_seen.as_deref(), command).await?;
    write_outputs(&report, &args)?;
    Ok(report)
}

/// The workload of the flags, once every tier it names is configured.
fn workload(args: &BenchArgs, settings: &Settings) -> Result<Workload, BenchError> {
    let workload = Workload::new(args.workload.clone()).map_err(err)?;
    for t in &workload.tiers {
        if settings.limits.tier(t).is_none() {
            return Err(BenchError(format!(
                "--tier-mix names tier {t:?}, which the configuration lacks (it has: {})",
                settings.limits.tier_names()
            )));
        }
    }
    Ok(workload)
}

/// The whole report: the phases, their ratio, and the calibration when a
/// phase ran on Redis.
async fn report(
    bench: &Bench<'_>,
    phases: Vec<PhaseReport>,
    redis: Option<&str>,
    command: String,
) -> Result<BenchReport, BenchError> {
    // The calibration times each script on one Redis: not on a cluster.
    let calibration = match redis {
        Some(url) if redis_info::cluster_nodes(url).is_none() => {
            Some(calibrate::calibrate(bench.settings, url, bench.stamp).await?)
        }
        _ => None,
    };
    let ceiling_ratio = (phases.len() == 2 && phases[0].reserve_per_sec > 0.0)
        .then(|| phases[1].reserve_per_sec / phases[0].reserve_per_sec);
    Ok(BenchReport {
        command,
        machine: redis_info::machine(redis).await,
        phases,
        ceiling_ratio,
        calibration,
    })
}

/// The JSON report and the chart, where the flags ask for them.
fn write_outputs(report: &BenchReport, args: &BenchArgs) -> Result<(), BenchError> {
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(report).map_err(err)?;
        write_file(path, json)?;
    }
    if let Some(path) = &args.plot {
        write_file(path, plot::svg(report))?;
    }
    Ok(())
}

fn write_file(path: &Path, contents: String) -> Result<(), BenchError> {
    std::fs::write(path, contents).map_err(|e| BenchError(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    }
}
