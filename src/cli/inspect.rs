//! `ctxbudget inspect`: a tenant's (and user's) live state in Redis — every
//! bucket's level now, debt, when it is full again, and the live leases with
//! their expiry.

use super::admin::AdminArgs;
use super::output::{Effective, effective_lines, limits_summary, print_json, table};
use crate::domain::budget::state::{LevelState, bucket_id};
use crate::domain::decision::period_label;
use crate::domain::plan::{self, LevelPlan};
use crate::domain::{
    BucketSpec, Dimension, Level, LevelLimits, Limits as DomainLimits, TenantId, Tier, UserId,
};
use crate::store::keys::Keys;
use anyhow::Context;
use clap::Args;
use redis::AsyncCommands;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `ctxbudget inspect` flags.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Where and how.
    #[command(flatten)]
    pub admin: AdminArgs,
    /// The tenant.
    #[arg(long)]
    pub tenant: String,
    /// One of its users.
    #[arg(long)]
    pub user: Option<String>,
    /// The tier, to show each bucket against its limit (and refilled to now).
    #[arg(long)]
    pub tier: Option<String>,
    /// A model, to show its model group's limits among them (with --tier).
    #[arg(long)]
    pub model: Option<String>,
}

#[derive(Serialize)]
struct BucketRow {
    level: &'static str,
    dimension: &'static str,
    period: String,
    limit: Option<u64>,
    /// Level now (refilled) when the limit is known; as stored otherwise.
    level_now: f64,
    debt: bool,
    full_in_ms: Option<u64>,
    stored_ms_ago: u64,
}

#[derive(Serialize)]
struct LeaseRow {
    level: &'static str,
    reservation: String,
    expires_in_ms: i64,
}

/// The limits in force at every level.
#[derive(Serialize)]
struct Limits {
    global: crate::config::LevelSection,
    #[serde(flatten)]
    tier: Effective,
}

#[derive(Serialize)]
struct Report {
    tenant: String,
    user: Option<String>,
    tier: Option<String>,
    configuration_version: u64,
    override_applies: bool,
    /// The limits in force (with `--tier`): the tier with the override laid over it.
    limits: Option<Limits>,
    buckets: Vec<BucketRow>,
    leases: Vec<LeaseRow>,
}

/// `ctxbudget inspect`.
pub async fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let cfg = args.admin.connect().await?;
    let doc = cfg.load().await?;
    let limits = doc
        .limits()
        .map_err(|e| anyhow::anyhow!("the stored configuration is invalid: {e}"))?;
    let who = Subject::parse(&args, &limits)?;
    let planned: Vec<LevelPlan> = match &who.tier {
        Some(tier) => {
            let scope = plan::Scope {
                tier: Some(tier),
                group: who.model.as_deref().and_then(|m| limits.group_of(m)),
                has_user: who.user.is_some(),
            };
            plan::levels(&limits, scope, true)
        }
        None => Vec::new(),
    };
    let keys = Keys::new(&args.admin.key_prefix)?;
    let mut conn = cfg.client().get_multiplexed_async_connection().await?;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let now = (secs * 1_000_000 + micros) as f64;

    let mut report = Report {
        tenant: who.tenant.to_string(),
        user: who.user.as_ref().map(|u| u.to_string()),
        tier: args.tier.clone(),
        configuration_version: doc.version,
        override_applies: limits.overrides.contains_key(who.tenant.as_str()),
        limits: who.tier.as_ref().map(|t| Limits {
            global: super::output::level_section(&limits.global),
            tier: Effective::of(t),
        }),
        buckets: Vec::new(),
        leases: Vec::new(),
    };
    for level in who.levels() {
        let key = keys.level(level, &who.tenant, who.user.as_ref());
        let fields: BTreeMap<String, Vec<u8>> = conn.hgetall(&key).await?;
        let specs: Vec<&BucketSpec> = planned
            .iter()
            .filter(|p| p.level == level)
            .flat_map(|p| &p.buckets)
            .collect();
        report
            .buckets
            .extend(bucket_rows(level, &fields, &specs, now)?);
        report.leases.extend(lease_rows(level, &fields, now));
    }
    if args.admin.json {
        return print_json(&report);
    }
    let in_force = who.tier.as_ref().map(|t| (&limits.global, &**t));
    print_text(&report, in_force);
    Ok(())
}

/// Whose state to show: the flags, checked and resolved.
struct Subject {
    tenant: TenantId,
    user: Option<UserId>,
    /// The tier with the tenant's override laid over it, with `--tier`.
    tier: Option<Arc<Tier>>,
    /// The model, with `--model`.
    model: Option<String>,
}

impl Subject {
    fn parse(args: &InspectArgs, limits: &DomainLimits) -> anyhow::Result<Self> {
        let tenant = TenantId::parse(&args.tenant)
            .map_err(|e| anyhow::anyhow!("--tenant: {}", e.message))?;
        let user = match &args.user {
            Some(u) => {
                Some(UserId::parse(u).map_err(|e| anyhow::anyhow!("--user: {}", e.message))?)
            }
            None => None,
        };
        let tier = match &args.tier {
            Some(t) => Some(limits.resolve(t, tenant.as_str()).with_context(|| {
                format!("no tier {t:?}; the tiers are: {}", limits.tier_names())
            })?),
            None => None,
        };
        Ok(Subject {
            tenant,
            user,
            tier,
            model: args.model.clone(),
        })
    }

    /// The levels that hold its state: global, tenant, and user with `--user`.
    fn levels(&self) -> Vec<Level> {
        let mut levels = vec![Level::Global, Level::Tenant];
        if self.user.is_some() {
            levels.push(Level::User);
        }
        levels
    }
}

/// The buckets stored in one level's hash, refilled to `now` where `specs`
/// (the planned buckets of the level) know their limit.
fn bucket_rows(
    level: Level,
    fields: &BTreeMap<String, Vec<u8>>,
    specs: &[&BucketSpec],
    now: f64,
) -> anyhow::Result<Vec<BucketRow>> {
    let state = fields
        .get("s")
        .map(|raw| LevelState::decode(raw))
        .transpose()
        .map_err(anyhow::Error::msg)?
        .flatten()
        .unwrap_or_default();
    let rows = state.buckets.iter().map(|b| {
        let spec = specs.iter().find(|s| bucket_id(s) == b.id);
        let period = (b.id % 1e7) as u64;
        let dimension = if (b.id / 1e7) as u64 == 1 {
            Dimension::Requests
        } else {
            Dimension::Tokens
        };
        let (level_now, full_in_ms) = match spec {
            Some(s) => {
                let l = s.refill(b.level, (now - b.t) as i64);
                (l, Some(s.until_full_us(l).div_ceil(1000)))
            }
            None => (b.level, None),
        };
        BucketRow {
            level: level.as_str(),
            dimension: dimension.as_str(),
            period: period_label(period),
            limit: spec.map(|s| s.limit),
            level_now,
            debt: level_now < 0.0,
            full_in_ms,
            stored_ms_ago: ((now - b.t).max(0.0) / 1000.0) as u64,
        }
    });
    Ok(rows.collect())
}

/// The live leases in one level's hash (fields `#nonce`, expiry as f64 µs).
fn lease_rows(level: Level, fields: &BTreeMap<String, Vec<u8>>, now: f64) -> Vec<LeaseRow> {
    let mut rows = Vec::new();
    for (field, value) in fields {
        if let Some(nonce) = field.strip_prefix('#')
            && let Ok(bytes) = <[u8; 8]>::try_from(value.as_slice())
        {
            let expires = f64::from_le_bytes(bytes);
            rows.push(LeaseRow {
                level: level.as_str(),
                reservation: format!("…{}", &nonce[nonce.len().saturating_sub(8)..]),
                expires_in_ms: ((expires - now) / 1000.0).round() as i64,
            });
        }
    }
    rows
}

/// The report for people; `in_force`: the global limits and the resolved tier.
fn print_text(report: &Report, in_force: Option<(&LevelLimits, &Tier)>) {
    print_heading(report);
    if let Some((global, t)) = in_force {
        println!("limits in force:");
        println!("  global  {}", limits_summary(global));
        for line in effective_lines(t) {
            println!("  {line}");
        }
        println!();
    }
    let rows: Vec<Vec<String>> = report.buckets.iter().map(bucket_cells).collect();
    table(
        &["LEVEL", "BUCKET", "LIMIT", "NOW", "DEBT", "FULL IN"],
        &rows,
    );
    println!();
    let rows: Vec<Vec<String>> = report
        .leases
        .iter()
        .map(|l| {
            vec![
                l.level.into(),
                l.reservation.clone(),
                format!("{} ms", l.expires_in_ms),
            ]
        })
        .collect();
    table(&["LEVEL", "LEASE", "EXPIRES IN"], &rows);
    if report.tier.is_none() {
        println!("\n(pass --tier to see the limits in force and levels refilled to now)");
    }
}

/// Who, which tier, which configuration.
fn print_heading(report: &Report) {
    println!(
        "tenant {}{}{} — configuration version {}{}",
        report.tenant,
        report
            .user
            .as_ref()
            .map_or(String::new(), |u| format!(", user {u}")),
        report
            .tier
            .as_ref()
            .map_or(String::new(), |t| format!(", tier {t}")),
        report.configuration_version,
        if report.override_applies {
            " (this tenant has an override)"
        } else {
            ""
        }
    );
}

/// One bucket as a table row.
fn bucket_cells(b: &BucketRow) -> Vec<String> {
    vec![
        b.level.into(),
        format!("{} per {}", b.dimension, b.period),
        b.limit.map_or("?".into(), |l| l.to_string()),
        format!("{:.1}", b.level_now),
        if b.debt {
            format!("{:.0}", -b.level_now)
        } else {
            "-".into()
        },
        b.full_in_ms
            .map_or(format!("(stored {} ms ago)", b.stored_ms_ago), |ms| {
                format!("{ms} ms")
            }),
    ]
}
