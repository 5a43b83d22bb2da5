//! `ctxbudget usage`: a tenant's usage ledger (or one user's) over a range,
//! summed by hour, day or month per model group, as a table, CSV or JSON.
//! The rows are read from Redis; with the in-memory store the ledger lives
//! inside the service process and this command cannot reach it.

use super::admin::AdminArgs;
use super::flags::parse_instant;
use super::output::{Stdout, print_json, table};
use crate::config::ConfigDoc;
use crate::domain::budget::ledger::Row;
use crate::domain::usage::{self, By, Line};
use crate::domain::{Limits, TenantId, UserId};
use crate::store::config_repo::ConfigStore;
use crate::store::keys::Keys;
use crate::store::redis::{Endpoint, RedisSettings, RedisStore};
use crate::store::{Retention, Store};
use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::time::Duration;

/// How a report prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns, with a total line.
    Table,
    /// One line per row, a header first (no total).
    Csv,
    /// One document.
    Json,
}

/// `ctxbudget usage` flags.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Where.
    #[command(flatten)]
    pub admin: AdminArgs,
    /// The tenant.
    #[arg(long)]
    pub tenant: String,
    /// One of its users (daily rows: --by day or month).
    #[arg(long)]
    pub user: Option<String>,
    /// A model group, or a model its patterns match.
    #[arg(long)]
    pub model: Option<String>,
    /// From (inclusive): a date such as 2026-12-01 (00:00 UTC) or an RFC 3339 time.
    #[arg(long)]
    pub from: String,
    /// To (exclusive): a date or an RFC 3339 time.
    #[arg(long)]
    pub to: String,
    /// Sum by hour, day or month (UTC).
    #[arg(long, default_value = "day")]
    pub by: By,
    /// How to print.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// One line of the report, as JSON and CSV show it.
#[derive(Serialize)]
struct Shown {
    period: String,
    model_group: String,
    requests: u64,
    refunds: u64,
    unsettled: u64,
    reserved_tokens: u64,
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
    completion_tokens: u64,
    cost_micros: u64,
    cost_usd: String,
    prompt_reserved: u64,
    prompt_error: u64,
    /// Σ |prompt reserved − prompt| ÷ Σ prompt, in percent.
    estimate_error_pct: Option<f64>,
    // Last, so scripts reading the earlier columns by position still work.
    cache_write_prompt_tokens: u64,
    cache_write_1h_prompt_tokens: u64,
    reasoning_tokens: u64,
}

impl Shown {
    fn of(period: String, model_group: &str, r: &Row) -> Shown {
        let n = |v: f64| v.max(0.0) as u64;
        Shown {
            period,
            model_group: model_group.to_owned(),
            requests: n(r.requests),
            refunds: n(r.refunds),
            unsettled: n(r.unsettled),
            reserved_tokens: n(r.reserved_tokens),
            prompt_tokens: n(r.prompt_tokens),
            cached_prompt_tokens: n(r.cached_prompt_tokens),
            completion_tokens: n(r.completion_tokens),
            cost_micros: n(r.cost_micros),
            cost_usd: usd(n(r.cost_micros)),
            prompt_reserved: n(r.prompt_reserved),
            prompt_error: n(r.prompt_error),
            estimate_error_pct: (r.prompt_tokens > 0.0)
                .then(|| (r.prompt_error / r.prompt_tokens * 1e4).round() / 100.0),
            cache_write_prompt_tokens: n(r.cache_write_prompt_tokens),
            cache_write_1h_prompt_tokens: n(r.cache_write_1h_prompt_tokens),
            reasoning_tokens: n(r.reasoning_tokens),
        }
    }
}

/// The whole report as JSON.
#[derive(Serialize)]
struct Report<'a> {
    tenant: &'a str,
    user: Option<&'a str>,
    model_group: Option<&'a str>,
    from: &'a str,
    to: &'a str,
    by: &'static str,
    lines: Vec<Shown>,
    total: Shown,
}

/// µ$ as dollars, exactly: `12.345678`.
pub(super) fn usd(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// A model group's name as reports show it. "" holds the calls whose model
/// was in no group when they were made: `all models` while the configuration
/// has no groups (`grouped` false), else `other models`.
pub(super) fn group_label(group: &str, grouped: bool) -> &str {
    match (group, grouped) {
        ("", false) => "all models",
        ("", true) => "other models",
        (g, _) => g,
    }
}

/// The ledger's store: the service's Redis, for reading.
pub(super) async fn ledger_store(admin: &AdminArgs) -> anyhow::Result<RedisStore> {
    let endpoint = admin.endpoint().context(
        "the usage ledger is in Redis: pass --redis-url or set CTXBUDGET_REDIS_URL (or \
         --redis-cluster-nodes; with the in-memory store the ledger lives inside the service \
         process)",
    )?;
    let (url, cluster_nodes) = match endpoint {
        Endpoint::Single(url) => (url, Vec::new()),
        Endpoint::Cluster(nodes) => (String::new(), nodes),
    };
    let settings = RedisSettings {
        url,
        pool: Default::default(),
        connections: 1,
        timeout: Duration::from_secs(10),
        tls: admin.tls(),
        cluster_nodes,
    };
    // Reading only: the retention is never used.
    let retention = Retention {
        record_ms: 0,
        idempotency_ms: 0,
        samples: 0,
        ledger: None,
        alert_queue: 0,
    };
    let keys = Keys::new(&admin.key_prefix)?;
    Ok(RedisStore::connect(&settings, keys, retention).await?)
}

/// The live configuration's limits (model groups, to name a model's group).
pub(super) async fn live_limits(admin: &AdminArgs) -> anyhow::Result<(ConfigStore, Limits)> {
    let cfg = admin.connect().await?;
    let limits = ConfigDoc::from_stored(cfg.load().await?)?
        .limits()
        .map_err(|e| anyhow::anyhow!("the stored configuration is invalid: {e}"))?;
    Ok((cfg, limits))
}

/// The model group `model` names: a group's own name, or the group whose
/// patterns match it.
fn group_named(limits: &Limits, model: &str) -> anyhow::Result<String> {
    if limits.models.contains_key(model) {
        return Ok(model.to_owned());
    }
    match limits.group_of(model) {
        Some(g) => Ok(g.name.clone()),
        None => anyhow::bail!(
            "{model:?} is no model group and no group's patterns match it; the ledger keeps \
             usage per model group (groups: {}; see ctxbudget models list)",
            limits.group_names()
        ),
    }
}

/// Runs `ctxbudget usage`.
pub(super) async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let tenant = TenantId::parse(&args.tenant).context("--tenant")?;
    let user = args
        .user
        .as_deref()
        .map(UserId::parse)
        .transpose()
        .context("--user")?;
    if user.is_some() && args.by == By::Hour {
        anyhow::bail!("a user's usage is kept per day: use --by day or --by month");
    }
    let from = parse_instant(&args.from).context("--from")?;
    let to = parse_instant(&args.to).context("--to")?;
    let periods = usage::periods(from, to, args.by)?;
    // The groups name the rows; without a readable configuration, the
    // ungrouped row is still `other models`.
    let limits = live_limits(&args.admin).await;
    let grouped = limits.as_ref().map_or(true, |(_, l)| !l.models.is_empty());
    let group = match &args.model {
        Some(m) => Some(group_named(&limits?.1, m)?),
        None => None,
    };
    let store = ledger_store(&args.admin).await?;
    let read = store.ledger(&tenant, &periods).await?;
    let rows: Vec<_> = periods.into_iter().zip(read).collect();
    let lines = usage::sum(&rows, args.by, user.as_ref(), group.as_deref());
    let mut total = Row::default();
    lines.iter().for_each(|l| total.add(&l.row));
    let shown: Vec<Shown> = lines.iter().map(|l| line(l, args.by)).collect();
    let format = if args.admin.json {
        Format::Json
    } else {
        args.format
    };
    match format {
        Format::Json => print_json(&Report {
            tenant: tenant.as_str(),
            user: user.as_ref().map(|u| u.as_str()),
            model_group: group.as_deref(),
            from: &args.from,
            to: &args.to,
            by: args.by.name(),
            lines: shown,
            total: Shown::of("total".into(), "", &total),
        }),
        Format::Csv => print_csv(&shown),
        Format::Table => {
            print_table(&shown, &Shown::of("total".into(), "", &total), grouped);
            Ok(())
        }
    }
}

fn line(l: &Line, by: By) -> Shown {
    Shown::of(usage::label(l.start_us, by), &l.model_group, &l.row)
}

fn print_csv(lines: &[Shown]) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_writer(Stdout);
    for l in lines {
        w.serialize(l)?;
    }
    if lines.is_empty() {
        // The header alone, so a script still reads the columns.
        w.write_record(CSV_HEADER)?;
    }
    w.flush()?;
    Ok(())
}

const CSV_HEADER: [&str; 17] = [
    "period",
    "model_group",
    "requests",
    "refunds",
    "unsettled",
    "reserved_tokens",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "cost_micros",
    "cost_usd",
    "prompt_reserved",
    "prompt_error",
    "estimate_error_pct",
    "cache_write_prompt_tokens",
    "cache_write_1h_prompt_tokens",
    "reasoning_tokens",
];

fn print_table(lines: &[Shown], total: &Shown, grouped: bool) {
    let cells = |l: &Shown| {
        vec![
            l.period.clone(),
            group_label(&l.model_group, grouped).to_owned(),
            l.requests.to_string(),
            l.refunds.to_string(),
            l.unsettled.to_string(),
            l.reserved_tokens.to_string(),
            l.prompt_tokens.to_string(),
            l.cached_prompt_tokens.to_string(),
            (l.cache_write_prompt_tokens + l.cache_write_1h_prompt_tokens).to_string(),
            l.completion_tokens.to_string(),
            l.reasoning_tokens.to_string(),
            l.cost_usd.clone(),
            l.estimate_error_pct
                .map_or("-".into(), |p| format!("{p:.2}%")),
        ]
    };
    let mut rows: Vec<Vec<String>> = lines.iter().map(cells).collect();
    if !lines.is_empty() {
        let mut t = cells(total);
        t[1] = String::new();
        rows.push(t);
    }
    table(
        &[
            "PERIOD",
            "MODEL GROUP",
            "REQUESTS",
            "REFUNDS",
            "UNSETTLED",
            "RESERVED",
            "PROMPT",
            "CACHED",
            "CACHE WRITES",
            "COMPLETION",
            "REASONING",
            "COST USD",
            "EST. ERROR",
        ],
        &rows,
    );
}
