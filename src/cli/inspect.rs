//! `ctxbudget inspect`: a tenant's (and user's, and session's) live state in
//! Redis — every bucket's level now, debt, when it is full again, and the
//! tenant's live leases with their expiry and reservation ids (`rsv_…`, as
//! gateways log them: `inspect_ids`); model groups' buckets and slots named by
//! group.
//!
//! Size: the command's one flow (flags, reads, report, words), its rows and
//! ids already apart in `inspect_rows` and `inspect_ids`.

use super::admin::AdminArgs;
use super::inspect_ids::{Candidates, owners};
use super::inspect_rows::{BucketRow, LeaseRow, bucket_rows, lease_rows};
use super::output::{Effective, count, effective_lines, limits_summary, outln, print_json, table};
use crate::config::ConfigDoc;
use crate::config::LevelSection;
use crate::domain::plan::{self, LevelPlan};
use crate::domain::{
    BucketSpec, Level, LevelLimits, Limits as DomainLimits, ModelGroup, SessionId, TenantId, Tier,
    UserId,
};
use anyhow::Context;
use clap::Args;
use redis::AsyncCommands;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
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
    /// One session of that user (or, without --user, of the tenant's calls
    /// naming no user): its session level too.
    #[arg(long)]
    pub session: Option<String>,
    /// The tier, to show each bucket against its limit (and refilled to now).
    #[arg(long)]
    pub tier: Option<String>,
    /// A model, to show its model group's limits among them (with --tier).
    #[arg(long)]
    pub model: Option<String>,
}

/// The limits in force at every level.
#[derive(Serialize)]
struct Limits {
    global: LevelSection,
    #[serde(flatten)]
    tier: Effective,
    /// With `--model` of a group: the group's limits over the whole account.
    model_group: Option<GroupInForce>,
}

/// A model group's own limits, in a report.
#[derive(Serialize)]
struct GroupInForce {
    name: String,
    global: LevelSection,
}

#[derive(Serialize)]
struct Report {
    tenant: String,
    user: Option<String>,
    session: Option<String>,
    tier: Option<String>,
    model: Option<String>,
    /// The group of `--model`, if it has one.
    model_group: Option<String>,
    configuration_version: u64,
    override_applies: bool,
    /// The limits in force (with `--tier`): the tier with the override laid over it.
    limits: Option<Limits>,
    buckets: Vec<BucketRow>,
    /// The tenant's leases, at every level.
    leases: Vec<LeaseRow>,
    /// Leases at the global level that are other tenants' (not listed).
    other_tenants_leases: usize,
}

/// `ctxbudget inspect`.
#[expect(
    clippy::too_many_lines,
    reason = "one section of output after another, each a few lines"
)]
pub(super) async fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let cfg = args.admin.connect().await?;
    let doc = ConfigDoc::from_stored(cfg.load().await?)?;
    let limits = doc
        .limits()
        .map_err(|e| anyhow::anyhow!("the stored configuration is invalid: {e}"))?;
    let who = Subject::parse(&args, &limits)?;
    let group = who.model.as_deref().and_then(|m| limits.group_of(m));
    let planned = planned(&limits, &who, group);
    let keys = args.admin.keys()?;
    let mut conn = cfg.connection();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let now = (secs * 1_000_000 + micros) as f64;

    let mut report = Report {
        tenant: who.tenant.to_string(),
        user: who.user.as_ref().map(|u| u.to_string()),
        session: who.session.as_ref().map(|s| s.to_string()),
        tier: args.tier.clone(),
        model: who.model.clone(),
        model_group: group.map(|g| g.name.clone()),
        configuration_version: doc.version,
        override_applies: limits.overrides.contains_key(who.tenant.as_str()),
        limits: who.tier.as_ref().map(|t| Limits {
            global: LevelSection::of(&limits.global),
            tier: Effective::of(t),
            model_group: group.map(|g| GroupInForce {
                name: g.name.clone(),
                global: LevelSection::of(&g.global),
            }),
        }),
        buckets: Vec::new(),
        leases: Vec::new(),
        other_tenants_leases: 0,
    };
    for level in who.levels() {
        let key = keys.level(level, who.scope());
        let fields: BTreeMap<String, Vec<u8>> = conn.hgetall(&key).await?;
        let specs: Vec<&BucketSpec> = planned
            .iter()
            .filter(|p| p.level == level)
            .flat_map(|p| &p.buckets)
            .collect();
        let rows = bucket_rows(level, &fields, &specs, &limits.models, now)?;
        report.buckets.extend(rows);
        report.leases.extend(lease_rows(level, None, &fields, now));
        // Every configured group's slots at the level: a hash of their own.
        for g in limits.models.values() {
            let slots = slots_of(level, g);
            let key = keys.plan_level(&slots, who.scope());
            let fields: BTreeMap<String, Vec<u8>> = conn.hgetall(&key).await?;
            report
                .leases
                .extend(lease_rows(level, Some(&g.name), &fields, now));
        }
    }
    name_leases(&mut report, &mut conn, &keys, &who, &limits).await?;
    if args.admin.json {
        return print_json(&report);
    }
    let in_force = who.tier.as_ref().map(|t| InForce {
        global: &limits.global,
        tier: t,
        group,
    });
    print_text(&report, in_force);
    Ok(())
}

/// Keeps the tenant's own leases (the global level's hash holds every
/// tenant's) and gives each its reservation id where it can be rebuilt.
async fn name_leases(
    report: &mut Report,
    conn: &mut crate::store::redis::SharedConn,
    keys: &crate::store::keys::Keys,
    who: &Subject,
    limits: &DomainLimits,
) -> anyhow::Result<()> {
    let nonces: BTreeSet<&String> = report.leases.iter().map(|l| &l.nonce).collect();
    let nonces: Vec<String> = nonces.into_iter().cloned().collect();
    let owners = owners(conn, keys, &who.tenant, &nonces).await?;
    let before = report.leases.len();
    report
        .leases
        .retain(|l| l.level != Level::Global.as_str() || owners.contains_key(&l.nonce));
    report.other_tenants_leases = before - report.leases.len();
    let candidates = Candidates::new(
        limits,
        who.user.as_ref(),
        who.session.as_ref(),
        who.model.as_deref(),
    );
    let mut ids: BTreeMap<String, Option<String>> = BTreeMap::new();
    for lease in &mut report.leases {
        let Some(&owner) = owners.get(&lease.nonce) else {
            continue;
        };
        let id = ids.entry(lease.nonce.clone()).or_insert_with(|| {
            candidates
                .rebuild(
                    &who.tenant,
                    &lease.nonce,
                    owner,
                    lease.model_group.as_deref(),
                )
                .map(|id| id.to_string())
        });
        lease.reservation_id = id.clone();
    }
    Ok(())
}

/// The planned levels whose buckets know their limits: with `--tier`, those
/// of `group` (the `--model`'s) or, without `--model`, of every group.
fn planned(
    limits: &DomainLimits,
    who: &Subject,
    group: Option<&Arc<ModelGroup>>,
) -> Vec<LevelPlan> {
    let Some(tier) = &who.tier else {
        return Vec::new();
    };
    let groups: Vec<Option<&Arc<ModelGroup>>> = match (&who.model, limits.models.is_empty()) {
        (Some(_), _) | (None, true) => vec![group],
        (None, false) => limits.models.values().map(Some).collect(),
    };
    groups
        .into_iter()
        .flat_map(|group| {
            let scope = plan::Scope {
                tier: Some(tier),
                group,
                has_user: who.user.is_some(),
                has_session: who.session.is_some(),
                now_us: crate::domain::Clock::now_us(&crate::domain::SystemClock),
            };
            plan::levels(limits, scope, true)
        })
        .collect()
}

/// The plan entry of `group`'s slots at `level`: what names their key.
fn slots_of(level: Level, group: &Arc<ModelGroup>) -> LevelPlan {
    LevelPlan {
        level,
        group: Some(group.clone()),
        slots: true,
        buckets: Vec::new(),
        concurrency: None,
        overrun: None,
        idle_secs: None,
    }
}

/// The limits in force, for the report in words.
struct InForce<'a> {
    global: &'a LevelLimits,
    tier: &'a Tier,
    group: Option<&'a Arc<ModelGroup>>,
}

/// Whose state to show: the flags, checked and resolved.
struct Subject {
    tenant: TenantId,
    user: Option<UserId>,
    session: Option<SessionId>,
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
        let session = match &args.session {
            Some(s) => {
                Some(SessionId::parse(s).map_err(|e| anyhow::anyhow!("--session: {}", e.message))?)
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
            session,
            tier,
            model: args.model.clone(),
        })
    }

    /// The levels that hold its state: global, tenant, user with `--user`
    /// and session with `--session`.
    fn levels(&self) -> Vec<Level> {
        let mut levels = vec![Level::Global, Level::Tenant];
        if self.user.is_some() {
            levels.push(Level::User);
        }
        if self.session.is_some() {
            levels.push(Level::Session);
        }
        levels
    }

    /// Whose keys.
    fn scope(&self) -> crate::store::Scope<'_> {
        crate::store::Scope {
            tenant: &self.tenant,
            user: self.user.as_ref(),
            session: self.session.as_ref(),
        }
    }
}

/// The report for people; `in_force`: the limits in force, with `--tier`.
fn print_text(report: &Report, in_force: Option<InForce<'_>>) {
    print_heading(report);
    if let Some(f) = in_force {
        outln!("limits in force:");
        outln!("  global  {}", limits_summary(f.global));
        if let Some(g) = f.group {
            outln!("  model {} global  {}", g.name, limits_summary(&g.global));
        }
        for line in effective_lines(f.tier) {
            outln!("  {line}");
        }
        outln!();
    }
    let rows: Vec<Vec<String>> = report.buckets.iter().map(bucket_cells).collect();
    table(
        &[
            "LEVEL", "MODEL", "BUCKET", "LIMIT", "NOW", "DEBT", "FULL IN",
        ],
        &rows,
    );
    outln!();
    let rows: Vec<Vec<String>> = report
        .leases
        .iter()
        .map(|l| {
            vec![
                l.level.into(),
                l.model_group.clone().unwrap_or_else(|| "-".into()),
                l.reservation_id
                    .clone()
                    .unwrap_or_else(|| format!("nonce {}", l.nonce)),
                format!("{} ms", l.expires_in_ms),
            ]
        })
        .collect();
    table(&["LEVEL", "MODEL", "RESERVATION", "EXPIRES IN"], &rows);
    if report.leases.iter().any(|l| l.reservation_id.is_none()) {
        outln!(
            "(a lease shown by its nonce: inspect could not rebuild its id — a user's other \
             than --user's (pass --user), or an [estimator] key of the service's file; \
             see docs/operations.md)"
        );
    }
    if report.other_tenants_leases > 0 {
        outln!(
            "({} of other tenants at the global level not shown)",
            count(report.other_tenants_leases, "lease", "leases")
        );
    }
    if report.tier.is_none() {
        outln!("\n(pass --tier to see the limits in force and levels refilled to now)");
    }
}

/// Who, which tier and model, which configuration.
fn print_heading(report: &Report) {
    let model = match (&report.model, &report.model_group) {
        (None, _) => String::new(),
        (Some(m), Some(g)) => format!(", model {m} (group {g})"),
        (Some(m), None) => format!(", model {m} (in no model group)"),
    };
    outln!(
        "tenant {}{}{}{model} — configuration version {}{}",
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
        b.model_group.clone().unwrap_or_else(|| "-".into()),
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
