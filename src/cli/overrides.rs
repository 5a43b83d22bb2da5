//! `ctxbudget overrides`: tenants' custom deals. An override names only what
//! differs from the tier; `get` shows the document and, beside it, the limits
//! in force for the tenant on each tier, so what it inherits is never a guess.

use super::admin::{AdminArgs, apply, read_input};
use super::output::{
    Effective, effective_lines, override_summary, print_document, print_json, table,
};
use crate::admin::{Kind, blocks, documents};
use crate::config::OverrideSection;
use crate::config::live::ConfigDoc;
use crate::domain::Limits;
use anyhow::{Context, bail};
use clap::Subcommand;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `ctxbudget overrides ...`.
#[derive(Debug, Subcommand)]
pub enum OverridesCmd {
    /// List the tenants with an override.
    List,
    /// Show a tenant's override as a TOML document that `overrides set` takes
    /// back, and the limits in force for the tenant on each tier.
    Get {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// Show the limits in force on this tier only.
        #[arg(long)]
        tier: Option<String>,
    },
    /// Give a tenant its own limits from a TOML or JSON document (`-`: stdin):
    /// what it names replaces the tier's limit of that kind, `"unlimited"`
    /// removes one, everything else stays the tier's.
    Set {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// The document: tenant, user and optionally shadow levels, each with
        /// requests, tokens and concurrency as needed.
        file: PathBuf,
    },
    /// Remove a tenant's override: its tier's limits apply again (a block
    /// stays until `overrides unblock`).
    Delete {
        /// The tenant.
        #[arg(long)]
        tenant: String,
    },
    /// Refuse all traffic of a tenant, or of one user of it, on every replica
    /// within a second: CheckAndReserve denies with REASON_BLOCKED and the
    /// reason, Envoy's ShouldRateLimit with OVER_LIMIT. Reservations made
    /// before still commit, refund and renew.
    Block {
        /// The tenant (or `--tenant`, as the other verbs take it).
        #[arg(required_unless_present = "tenant_flag")]
        tenant: Option<String>,
        /// The tenant, as `--tenant`.
        #[arg(long = "tenant", id = "tenant_flag", conflicts_with = "tenant")]
        tenant_flag: Option<String>,
        /// Only this user of the tenant.
        #[arg(long)]
        user: Option<String>,
        /// Why, in a sentence: shown to the blocked caller in the denial.
        #[arg(long)]
        reason: String,
    },
    /// Lift a block set with `overrides block`.
    Unblock {
        /// The tenant (or `--tenant`, as the other verbs take it).
        #[arg(required_unless_present = "tenant_flag")]
        tenant: Option<String>,
        /// The tenant, as `--tenant`.
        #[arg(long = "tenant", id = "tenant_flag", conflicts_with = "tenant")]
        tenant_flag: Option<String>,
        /// Only this user's block.
        #[arg(long)]
        user: Option<String>,
    },
}

/// `ctxbudget overrides ...`.
pub(super) async fn overrides(cmd: OverridesCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let doc = ConfigDoc::from_stored(cfg.load().await?)?;
    match cmd {
        OverridesCmd::List => list(&doc, &args)?,
        OverridesCmd::Get { tenant, tier } => get(&doc, &tenant, tier.as_deref(), &args)?,
        OverridesCmd::Set { tenant, file } => {
            let text = read_input(&file)?;
            apply(&cfg, &args, |doc| {
                documents::set(doc, Kind::Override, &tenant, &text)
            })
            .await?;
        }
        OverridesCmd::Delete { tenant } => {
            apply(&cfg, &args, |doc| {
                documents::delete(doc, Kind::Override, &tenant)
            })
            .await?;
        }
        OverridesCmd::Block {
            tenant,
            tenant_flag,
            user,
            reason,
        } => {
            let tenant = one_tenant(tenant, tenant_flag)?;
            apply(&cfg, &args, |doc| {
                blocks::block(doc, &tenant, user.as_deref(), &reason)
            })
            .await?;
        }
        OverridesCmd::Unblock {
            tenant,
            tenant_flag,
            user,
        } => {
            let tenant = one_tenant(tenant, tenant_flag)?;
            apply(&cfg, &args, |doc| {
                blocks::unblock(doc, &tenant, user.as_deref())
            })
            .await?;
        }
    }
    Ok(())
}

fn list(doc: &ConfigDoc, args: &AdminArgs) -> anyhow::Result<()> {
    if args.json {
        return print_json(&doc.overrides);
    }
    let rows: Vec<Vec<String>> = doc
        .overrides
        .iter()
        .map(|(tenant, o)| {
            vec![
                tenant.clone(),
                override_summary(&o.tenant),
                override_summary(&o.user),
                if o.shadow.is_some() { "yes" } else { "-" }.into(),
                blocked(o),
            ]
        })
        .collect();
    table(
        &[
            "TENANT",
            "TENANT LIMITS",
            "USER LIMITS",
            "SHADOW",
            "BLOCKED",
        ],
        &rows,
    );
    Ok(())
}

/// The tenant of `block`/`unblock`, given as TENANT or `--tenant`.
fn one_tenant(positional: Option<String>, flag: Option<String>) -> anyhow::Result<String> {
    positional
        .or(flag)
        .context("name the tenant: `overrides block TENANT` or `--tenant TENANT`")
}

/// The BLOCKED column: the tenant, or how many of its users.
fn blocked(o: &OverrideSection) -> String {
    match (o.blocked.is_some(), o.blocked_users.len()) {
        (true, _) => "tenant".into(),
        (false, 0) => "-".into(),
        (false, 1) => "1 user".into(),
        (false, n) => format!("{n} users"),
    }
}

/// `overrides get --json`: the document as stored and the limits in force.
#[derive(Serialize)]
struct Report<'a> {
    tenant: &'a str,
    configuration_version: u64,
    /// The document, as `overrides set` takes it.
    #[serde(rename = "override")]
    document: &'a OverrideSection,
    /// The limits in force for the tenant, by tier.
    effective: BTreeMap<String, Effective>,
}

fn get(doc: &ConfigDoc, tenant: &str, tier: Option<&str>, args: &AdminArgs) -> anyhow::Result<()> {
    let o = doc
        .overrides
        .get(tenant)
        .with_context(|| format!("tenant {tenant} has no override; its tier's limits apply"))?;
    let limits = doc
        .limits()
        .map_err(|e| anyhow::anyhow!("the stored configuration is invalid: {e}"))?;
    let tiers: Vec<&String> = match tier {
        Some(t) if !limits.tiers.contains_key(t) => {
            bail!("no tier {t:?}; the tiers are: {}", limits.tier_names())
        }
        Some(t) => limits.tiers.keys().filter(|k| *k == t).collect(),
        None => limits.tiers.keys().collect(),
    };
    if args.json {
        let effective = tiers
            .iter()
            .map(|t| ((*t).clone(), Effective::of(&resolved(&limits, t, tenant))))
            .collect();
        return print_json(&Report {
            tenant,
            configuration_version: doc.version,
            document: o,
            effective,
        });
    }
    let mut comments = vec![
        format!(
            "The override of tenant {tenant} (configuration version {}).",
            doc.version
        ),
        "What it names replaces the tier's limit of that kind; \"unlimited\" removes one;".into(),
        "everything else is the tier's. `ctxbudget overrides set` takes this document back.".into(),
        String::new(),
        "Limits in force for the tenant:".into(),
    ];
    for t in tiers {
        comments.push(format!("  on tier {t}:"));
        for line in effective_lines(&resolved(&limits, t, tenant)) {
            comments.push(format!("    {line}"));
        }
    }
    print_document(&comments, o)
}

fn resolved(limits: &Limits, tier: &str, tenant: &str) -> crate::domain::Tier {
    limits
        .resolve(tier, tenant)
        .map(|t| (*t).clone())
        .expect("the tier exists")
}
