//! The bench report: a table for people, JSON for machines.

use super::ledger::Offender;
use super::run::PhaseRun;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Latency and rate of one RPC in one phase.
#[derive(Clone, Debug, Serialize)]
pub struct RpcReport {
    /// Proto name.
    pub rpc: &'static str,
    /// Calls measured.
    pub count: u64,
    /// Calls per second over the measured time.
    pub per_sec: f64,
    /// Latency percentiles, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
    /// (percentile, ms) points for the chart.
    pub curve: Vec<(f64, f64)>,
}

/// Redis CPU spent per script call, from `INFO commandstats`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RedisCost {
    /// EVALSHA calls in the phase.
    pub calls: u64,
    /// Mean µs of Redis CPU per EVALSHA (reserve and settle scripts mixed).
    pub usec_per_call: f64,
    /// On a Redis Cluster: each master's part.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub masters: Vec<MasterCost>,
    /// On a Redis Cluster: calls to the global key per reservation (or
    /// charge) that had a global limit, in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_calls_per_reservation: Option<f64>,
}

/// One master's script CPU in a phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MasterCost {
    /// `host:port`.
    pub node: String,
    /// EVALSHA calls.
    pub calls: u64,
    /// µs of script CPU.
    pub usec: u64,
    /// Its share of every master's script CPU.
    pub share: f64,
}

/// One phase of a bench run.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    /// `ceiling`, `service`, ...
    pub name: String,
    /// What was driven.
    pub target: String,
    /// Measured seconds.
    pub seconds: f64,
    /// CheckAndReserve per second.
    pub reserve_per_sec: f64,
    /// Per-RPC latency.
    pub rpcs: Vec<RpcReport>,
    /// Decisions by reason.
    pub decisions: BTreeMap<String, u64>,
    /// Errors by RPC and code.
    pub errors: BTreeMap<String, u64>,
    /// Open-loop requests not sent (too many outstanding).
    pub dropped: u64,
    /// Buckets and concurrency scopes the overspend check covered.
    pub buckets_checked: usize,
    /// Buckets that granted more than they allow; empty means "overspend: 0".
    pub overspend: Vec<Offender>,
    /// Token-bucket checks during the run (every half second, each bucket
    /// used), and those in debt beyond one request's worth.
    pub debt_windows: (u64, u64),
    /// Redis CPU, when the phase ran on Redis.
    pub redis: Option<RedisCost>,
}

impl PhaseReport {
    /// Builds the report of a finished phase.
    pub fn new(
        name: &str,
        target: String,
        measured_secs: f64,
        run: &PhaseRun,
        checked: (usize, Vec<Offender>),
        debt_windows: (u64, u64),
        redis: Option<RedisCost>,
    ) -> Self {
        let rpcs = run
            .stats
            .histograms()
            .iter()
            .map(|(rpc, h)| {
                let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                let curve = [
                    0.0, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999,
                ]
                .iter()
                .map(|&q| (q * 100.0, ms(q)))
                .collect();
                RpcReport {
                    rpc: rpc.name(),
                    count: h.len(),
                    per_sec: h.len() as f64 / measured_secs,
                    p50_ms: ms(0.5),
                    p90_ms: ms(0.9),
                    p99_ms: ms(0.99),
                    p999_ms: ms(0.999),
                    max_ms: h.max() as f64 / 1000.0,
                    curve,
                }
            })
            .collect();
        PhaseReport {
            name: name.to_string(),
            target,
            seconds: measured_secs,
            reserve_per_sec: run.reserve_rate,
            rpcs,
            decisions: run.stats.decisions(),
            errors: run.stats.errors(),
            dropped: run.stats.dropped(),
            buckets_checked: checked.0,
            overspend: checked.1,
            debt_windows,
            redis,
        }
    }

    /// The report as a table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n== {} — {} ({:.0} s measured)",
            self.name, self.target, self.seconds
        );
        self.render_latency(&mut out);
        self.render_outcomes(&mut out);
        if let Some(r) = &self.redis {
            let _ = writeln!(
                out,
                "redis: {} EVALSHA, {:.1} µs of Redis CPU per call (reserve and settle mixed)",
                r.calls, r.usec_per_call
            );
            for m in &r.masters {
                let _ = writeln!(
                    out,
                    "  master {}: {} EVALSHA, {} µs, {:.1}% of the script CPU",
                    m.node,
                    m.calls,
                    m.usec,
                    m.share * 100.0
                );
            }
            if let Some(g) = r.global_calls_per_reservation {
                let _ = writeln!(
                    out,
                    "  global key: {g:.4} calls per reservation with a global limit"
                );
            }
        }
        self.render_overspend(&mut out);
        out
    }

    /// The per-RPC latency table.
    fn render_latency(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "rpc", "calls", "per sec", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
        );
        for r in &self.rpcs {
            let _ = writeln!(
                out,
                "{:<16} {:>10} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                r.rpc, r.count, r.per_sec, r.p50_ms, r.p90_ms, r.p99_ms, r.p999_ms, r.max_ms
            );
        }
    }

    /// Decisions by reason, errors, and requests not sent.
    fn render_outcomes(&self, out: &mut String) {
        let total: u64 = self.decisions.values().sum();
        let decisions: Vec<String> = self
            .decisions
            .iter()
            .map(|(k, v)| format!("{k} {v} ({:.1}%)", *v as f64 * 100.0 / total.max(1) as f64))
            .collect();
        let _ = writeln!(out, "decisions: {}", decisions.join(", "));
        if self.errors.is_empty() {
            let _ = writeln!(out, "errors: 0");
        } else {
            let errors: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(out, "errors: {}", errors.join(", "));
        }
        if self.dropped > 0 {
            let _ = writeln!(out, "not sent (over 50,000 outstanding): {}", self.dropped);
        }
    }

    /// The overspend check: the count checked, or the first 20 offenders.
    fn render_overspend(&self, out: &mut String) {
        let (windows, in_debt) = self.debt_windows;
        if windows > 0 {
            let _ = writeln!(
                out,
                "token debt beyond one request's worth: {in_debt} of {windows} bucket checks ({:.2}%)",
                in_debt as f64 * 100.0 / windows as f64
            );
        }
        if self.overspend.is_empty() {
            let _ = writeln!(
                out,
                "overspend: 0 ({} buckets and scopes checked)",
                self.buckets_checked
            );
            return;
        }
        let n = self.overspend.len();
        let noun = if n == 1 { "bucket" } else { "buckets" };
        let _ = writeln!(out, "OVERSPEND in {n} {noun}:");
        for o in self.overspend.iter().take(20) {
            let _ = writeln!(
                out,
                "  {}: granted {:.0}, limit {} allows {:.1}",
                o.bucket, o.granted, o.limit, o.allowed
            );
        }
    }
}

/// Redis CPU per script, measured apart from any load.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    /// Calls of each script.
    pub calls: u64,
    /// µs of Redis CPU per CheckAndReserve (reserve.lua).
    pub reserve_usec: f64,
    /// µs of Redis CPU per Commit (settle.lua).
    pub commit_usec: f64,
    /// What the calls looked like.
    pub shape: String,
}

/// A whole bench run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The command line.
    pub command: String,
    /// Machine facts.
    pub machine: String,
    /// Each phase in order.
    pub phases: Vec<PhaseReport>,
    /// Service throughput ÷ ceiling throughput, with --ceiling.
    pub ceiling_ratio: Option<f64>,
    /// Per-script Redis CPU, when Redis was involved.
    pub calibration: Option<Calibration>,
}

impl BenchReport {
    /// The whole report as text.
    pub fn render(&self) -> String {
        let mut out = format!(
            "ctxbudget bench: {}\nmachine: {}\n",
            self.command, self.machine
        );
        for p in &self.phases {
            out.push_str(&p.render());
        }
        if let Some(ratio) = self.ceiling_ratio {
            let _ = writeln!(
                out,
                "\nservice / ceiling throughput: {:.0}% ({:.0} vs {:.0} reservations/s)",
                ratio * 100.0,
                self.phases.last().map_or(0.0, |p| p.reserve_per_sec),
                self.phases.first().map_or(0.0, |p| p.reserve_per_sec)
            );
        }
        if let Some(c) = &self.calibration {
            let _ = writeln!(
                out,
                "\nRedis CPU per call ({} calls each, {}): CheckAndReserve {:.1} µs, Commit {:.1} µs",
                c.calls, c.shape, c.reserve_usec, c.commit_usec
            );
        }
        let spent: usize = self.phases.iter().map(|p| p.overspend.len()).sum();
        let _ = writeln!(out, "\noverspend: {spent}");
        out
    }

    /// True when any phase overspent.
    pub fn overspent(&self) -> bool {
        self.phases.iter().any(|p| !p.overspend.is_empty())
    }
}
