//! `ctxbudget reconcile`: the provider's usage export (CSV) against the
//! ledger, per hour and model group; prints ours, theirs and the drift of
//! each metric, and fails (exit 1) when any row drifts more than
//! `--max-drift`, so a cron job or CI alerts on it. The comparison is
//! `admin::reconcile`'s, as the admin API's.

use super::admin::AdminArgs;
use super::flags::{parse_instant, parse_max_drift};
use super::output::{Stdout, count, outln, print_json, table};
use super::usage::{Format, group_label, ledger_store, live_limits, usd};
use crate::admin::reconcile::{ReconcileQuery, hour_label, pct, read_export};
use crate::domain::TenantId;
use crate::domain::reconcile::{Columns, Compared, Metric};
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

/// `ctxbudget reconcile` flags.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Where.
    #[command(flatten)]
    pub admin: AdminArgs,
    /// The provider's usage export: a CSV with a header line.
    #[arg(long)]
    pub provider_usage: PathBuf,
    /// From (inclusive): a date such as 2026-12-01 (00:00 UTC) or an RFC 3339 time on a whole hour.
    #[arg(long)]
    pub from: String,
    /// To (exclusive).
    #[arg(long)]
    pub to: String,
    /// The export's column names, where they differ:
    /// `hour_start=start_time,model=model_id,input_tokens=…,cached_input_tokens=…,
    /// cache_write_input_tokens=…,cache_write_1h_input_tokens=…,output_tokens=…,
    /// reasoning_tokens=…,cost=…`.
    #[arg(long, default_value = "")]
    pub columns: String,
    /// The drift a row may have before it is flagged.
    #[arg(long, default_value = "1%")]
    pub max_drift: String,
    /// Only these tenants' usage (the provider bills one account per tenant);
    /// by default every tenant's.
    #[arg(long)]
    pub tenant: Vec<String>,
    /// How to print.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// A row flattened for CSV.
#[derive(Serialize)]
struct CsvRow<'a> {
    hour: &'a str,
    model_group: &'a str,
    input_ours: u64,
    input_theirs: u64,
    input_drift_pct: Option<f64>,
    cached_ours: Option<u64>,
    cached_theirs: Option<u64>,
    cached_drift_pct: Option<f64>,
    output_ours: u64,
    output_theirs: u64,
    output_drift_pct: Option<f64>,
    cost_ours_micros: Option<u64>,
    cost_theirs_micros: Option<u64>,
    cost_drift_pct: Option<f64>,
    unsettled: u64,
    flagged: bool,
    // Last, so scripts reading the earlier columns by position still work.
    cache_write_ours: Option<u64>,
    cache_write_theirs: Option<u64>,
    cache_write_drift_pct: Option<f64>,
    cache_write_1h_ours: Option<u64>,
    cache_write_1h_theirs: Option<u64>,
    cache_write_1h_drift_pct: Option<f64>,
    reasoning_ours: Option<u64>,
    reasoning_theirs: Option<u64>,
    reasoning_drift_pct: Option<f64>,
}

/// Runs `ctxbudget reconcile`.
pub(super) async fn reconcile(args: ReconcileArgs) -> anyhow::Result<()> {
    let from = parse_instant(&args.from).context("--from")?;
    let to = parse_instant(&args.to).context("--to")?;
    // The range's errors name the flags, before the export is read.
    crate::domain::usage::periods(from, to, crate::domain::usage::By::Hour)?;
    let max_drift = parse_max_drift(&args.max_drift)?;
    let columns = Columns::with_mapping(&args.columns)?;
    let file = std::fs::File::open(&args.provider_usage).with_context(|| {
        format!(
            "cannot read --provider-usage {}",
            args.provider_usage.display()
        )
    })?;
    let shown = args.provider_usage.display().to_string();
    let theirs = read_export(file, &columns, &shown)?;
    let (_, limits) = live_limits(&args.admin).await?;
    let store = ledger_store(&args.admin).await?;
    let query = ReconcileQuery {
        from: args.from.clone(),
        to: args.to.clone(),
        max_drift,
        tenants: args
            .tenant
            .iter()
            .map(|t| TenantId::parse(t).with_context(|| format!("--tenant {t:?}")))
            .collect::<Result<_, _>>()?,
    };
    let done = crate::admin::reconcile::reconcile(&store, &limits, &query, theirs).await?;
    let compared = &done.compared;
    let flagged = compared.iter().filter(|c| c.flagged).count();
    let format = if args.admin.json {
        Format::Json
    } else {
        args.format
    };
    match format {
        Format::Json => print_json(&done.report(&query))?,
        Format::Csv => print_csv(compared)?,
        Format::Table => print_table(compared, done.tenants, done.grouped),
    }
    if flagged > 0 {
        let drift = if flagged == 1 { "drifts" } else { "drift" };
        anyhow::bail!(
            "{flagged} of {} {drift} more than {}% from the provider's usage (flagged above): \
             check the unsettled count (usage that never came back), model groups without a \
             price, and the export's columns",
            count(compared.len(), "row", "rows"),
            pct(max_drift)
        );
    }
    Ok(())
}

fn print_csv(rows: &[Compared]) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_writer(Stdout);
    for c in rows {
        let hour = hour_label(c);
        w.serialize(CsvRow {
            hour: &hour,
            model_group: &c.model_group,
            input_ours: c.input.ours,
            input_theirs: c.input.theirs,
            input_drift_pct: c.input.drift.map(pct),
            cached_ours: c.cached.map(|m| m.ours),
            cached_theirs: c.cached.map(|m| m.theirs),
            cached_drift_pct: c.cached.and_then(|m| m.drift.map(pct)),
            output_ours: c.output.ours,
            output_theirs: c.output.theirs,
            output_drift_pct: c.output.drift.map(pct),
            cost_ours_micros: c.cost.map(|m| m.ours),
            cost_theirs_micros: c.cost.map(|m| m.theirs),
            cost_drift_pct: c.cost.and_then(|m| m.drift.map(pct)),
            unsettled: c.unsettled,
            flagged: c.flagged,
            cache_write_ours: c.cache_write.map(|m| m.ours),
            cache_write_theirs: c.cache_write.map(|m| m.theirs),
            cache_write_drift_pct: c.cache_write.and_then(|m| m.drift.map(pct)),
            cache_write_1h_ours: c.cache_write_1h.map(|m| m.ours),
            cache_write_1h_theirs: c.cache_write_1h.map(|m| m.theirs),
            cache_write_1h_drift_pct: c.cache_write_1h.and_then(|m| m.drift.map(pct)),
            reasoning_ours: c.reasoning.map(|m| m.ours),
            reasoning_theirs: c.reasoning.map(|m| m.theirs),
            reasoning_drift_pct: c.reasoning.and_then(|m| m.drift.map(pct)),
        })?;
    }
    w.flush()?;
    Ok(())
}

/// The compared metrics a table shows, by column title; the parts (cache
/// writes, reasoning) only `with_parts`.
fn table_metrics(c: &Compared, with_parts: bool) -> Vec<(&'static str, Option<Metric>)> {
    let mut m = vec![
        ("INPUT OURS / THEIRS", Some(c.input)),
        ("CACHED", c.cached),
        ("OUTPUT", Some(c.output)),
    ];
    if with_parts {
        m.extend([
            ("CACHE WRITES", c.cache_write),
            ("1H WRITES", c.cache_write_1h),
            ("REASONING", c.reasoning),
        ]);
    }
    m.push(("COST USD", c.cost));
    m
}

/// The rows in words; `grouped`: the configuration has model groups.
fn print_table(rows: &[Compared], tenants: usize, grouped: bool) {
    let pair = |title: &str, m: &Metric| match title {
        "COST USD" => format!("{} / {}", usd(m.ours), usd(m.theirs)),
        _ => format!("{} / {}", m.ours, m.theirs),
    };
    let drift = |m: &Metric| {
        m.drift
            .map_or("new".to_owned(), |d| format!("{:.2}%", pct(d)))
    };
    // The parts only when some row has them.
    let used = |m: &Option<Metric>| m.is_some_and(|m| m.ours > 0 || m.theirs > 0);
    let with_parts = rows.iter().any(|c| {
        [c.cache_write, c.cache_write_1h, c.reasoning]
            .iter()
            .any(used)
    });
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|c| {
            let group = std::iter::once(group_label(&c.model_group, grouped))
                .chain(c.folded.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" + ");
            let metrics = table_metrics(c, with_parts)
                .into_iter()
                .flat_map(|(t, m)| match m {
                    Some(m) => [pair(t, &m), drift(&m)],
                    None => ["-".into(), "-".into()],
                });
            let flag = if c.flagged { "DRIFT" } else { "ok" };
            [hour_label(c), group]
                .into_iter()
                .chain(metrics)
                .chain([c.unsettled.to_string(), flag.into()])
                .collect()
        })
        .collect();
    let titles = rows.first().map_or_else(
        || table_metrics(&Compared::default(), false),
        |c| table_metrics(c, with_parts),
    );
    let header: Vec<&str> = ["HOUR", "MODEL GROUP"]
        .into_iter()
        .chain(titles.iter().flat_map(|(t, _)| [*t, "DRIFT"]))
        .chain(["UNSETTLED", ""])
        .collect();
    table(&header, &cells);
    outln!(
        "({} in the ledger for the range)",
        count(tenants, "tenant", "tenants")
    );
}
