//! `ctxbudget usage`: a tenant's usage ledger (or one user's) over a range,
//! summed by hour, day or month per model group, as a table, CSV or JSON.
//! The rows are read from Redis; with the in-memory store the ledger lives
//! inside the service process and this command cannot reach it.

use super::admin::AdminArgs;
use super::flags::parse_instant;
use super::output::{Stdout, print_json, table};
use crate::admin::usage::{UsageLine, UsageQuery};
pub(super) use crate::admin::usage::{group_label, usd};
use crate::config::ConfigDoc;
use crate::domain::Dimension;
use crate::domain::dimension::DECLARED_FIRST;
use crate::domain::usage::By;
use crate::domain::{Limits, TenantId, UserId};
use crate::store::Retention;
use crate::store::config_repo::ConfigStore;
use crate::store::keys::Keys;
use crate::store::redis::{Endpoint, RedisSettings, RedisStore};
use anyhow::Context;
use clap::{Args, ValueEnum};
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

/// Runs `ctxbudget usage`.
pub(super) async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let query = UsageQuery {
        tenant: TenantId::parse(&args.tenant).context("--tenant")?,
        user: args
            .user
            .as_deref()
            .map(UserId::parse)
            .transpose()
            .context("--user")?,
        model: args.model.clone(),
        from: args.from.clone(),
        to: args.to.clone(),
        by: args.by,
    };
    parse_instant(&args.from).context("--from")?;
    parse_instant(&args.to).context("--to")?;
    // The groups name the rows; without a readable configuration, the
    // ungrouped row is still `other models`.
    let limits = live_limits(&args.admin).await;
    if args.model.is_some() {
        limits.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
    }
    let store = ledger_store(&args.admin).await?;
    let report =
        crate::admin::usage::report(&store, limits.as_ref().ok().map(|(_, l)| l), &query).await?;
    let format = if args.admin.json {
        Format::Json
    } else {
        args.format
    };
    match format {
        Format::Json => print_json(&report),
        Format::Csv => Ok(crate::admin::usage::csv(&report.lines, Stdout)?),
        Format::Table => {
            print_table(&report.lines, &report.total, report.grouped);
            Ok(())
        }
    }
}

fn print_table(lines: &[UsageLine], total: &UsageLine, grouped: bool) {
    // Each dimension the caller counts (images) gets a column after
    // reasoning.
    let declared = &Dimension::RATES[DECLARED_FIRST - 1..];
    let cells = |l: &UsageLine| {
        let mut cells = vec![
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
        ];
        cells.extend(declared.iter().map(|d| l.declared[*d].to_string()));
        cells.push(l.cost_usd.clone());
        cells.push(
            l.estimate_error_pct
                .map_or("-".into(), |p| format!("{p:.2}%")),
        );
        cells
    };
    let mut rows: Vec<Vec<String>> = lines.iter().map(cells).collect();
    if !lines.is_empty() {
        let mut t = cells(total);
        t[1] = String::new();
        rows.push(t);
    }
    let names: Vec<String> = declared.iter().map(|d| d.as_str().to_uppercase()).collect();
    let mut headers = vec![
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
    ];
    headers.extend(names.iter().map(String::as_str));
    headers.extend(["COST USD", "EST. ERROR"]);
    table(&headers, &rows);
}
