//! `ctxbudget tiers|global|overrides`: the live configuration in Redis, changed
//! on every replica at once. Every change is validated — as a document and as
//! part of the whole configuration — before anything is written; then written,
//! versioned, audited and announced in one step.

use super::output::{print_json, rate_summary, table};
use crate::config::{
    FileConfig, LevelSection, OverrideSection, TierSection, build_limits, parse_document,
};
use crate::store::config::{AuditEntry, ConfigDoc, ConfigStore, Field, document};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use std::io::Read;
use std::path::PathBuf;

/// Where the live configuration is, and how to report.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// Redis holding the configuration.
    #[arg(
        long,
        env = "CTXBUDGET_REDIS_URL",
        hide_env_values = true,
        global = true
    )]
    pub redis_url: Option<String>,
    /// PEM CA of a rediss:// server no public root signed.
    #[arg(long, env = "CTXBUDGET_REDIS_TLS_CA", global = true)]
    pub redis_tls_ca: Option<PathBuf>,
    /// PEM client certificate, when Redis requires one.
    #[arg(long, env = "CTXBUDGET_REDIS_TLS_CERT", global = true)]
    pub redis_tls_cert: Option<PathBuf>,
    /// PEM key of --redis-tls-cert.
    #[arg(long, env = "CTXBUDGET_REDIS_TLS_KEY", global = true)]
    pub redis_tls_key: Option<PathBuf>,
    /// Key prefix of the service's keys.
    #[arg(
        long,
        env = "CTXBUDGET_KEY_PREFIX",
        default_value = "ctxb:",
        global = true
    )]
    pub key_prefix: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Who makes the change, for the audit log [default: the OS user].
    #[arg(long, global = true)]
    pub actor: Option<String>,
}

impl AdminArgs {
    /// Connects to the configuration.
    pub async fn connect(&self) -> anyhow::Result<ConfigStore> {
        let url = self.redis_url.as_deref().context(
            "the live configuration is in Redis: pass --redis-url or set CTXBUDGET_REDIS_URL \
             (in memory mode, edit the configuration file and send the service SIGHUP)",
        )?;
        let tls = crate::store::redis::RedisTls {
            ca: self.redis_tls_ca.clone(),
            cert: self.redis_tls_cert.clone(),
            key: self.redis_tls_key.clone(),
        };
        Ok(ConfigStore::connect(url, &tls, &self.key_prefix).await?)
    }

    /// The actor recorded in the audit log.
    pub fn actor(&self) -> String {
        self.actor.clone().unwrap_or_else(|| {
            std::env::var("USER")
                .or_else(|_| std::env::var("LOGNAME"))
                .unwrap_or_else(|_| "unknown".into())
        })
    }
}

/// `ctxbudget tiers ...`.
#[derive(Debug, Subcommand)]
pub enum TiersCmd {
    /// List the tiers.
    List,
    /// Show one tier as TOML.
    Get {
        /// The tier.
        name: String,
    },
    /// Create or replace a tier from a TOML or JSON document (`-`: stdin).
    Set {
        /// The tier.
        name: String,
        /// The document: max_context_tokens, default_max_output_tokens, tenant,
        /// user and optionally shadow.
        file: PathBuf,
    },
    /// Delete a tier.
    Delete {
        /// The tier.
        name: String,
    },
    /// Set every tier of a configuration file (its [tiers.*] sections).
    Import {
        /// A configuration file.
        file: PathBuf,
    },
    /// Print every tier as a configuration file that `tiers import` takes.
    Export,
    /// The audit log of configuration changes, newest first.
    History {
        /// Entries to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

/// `ctxbudget global ...`.
#[derive(Debug, Subcommand)]
pub enum GlobalCmd {
    /// Show the global limits.
    Get,
    /// Replace the global limits from a TOML or JSON document (`-`: stdin).
    Set {
        /// The document: requests, tokens, concurrency.
        file: PathBuf,
    },
}

/// `ctxbudget overrides ...`.
#[derive(Debug, Subcommand)]
pub enum OverridesCmd {
    /// List the tenants with an override.
    List,
    /// Show a tenant's override.
    Get {
        /// The tenant.
        #[arg(long)]
        tenant: String,
    },
    /// Give a tenant its own limits from a TOML or JSON document (`-`: stdin).
    Set {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// The document: tenant, user and optionally shadow limits.
        file: PathBuf,
    },
    /// Remove a tenant's override: its tier's limits apply again.
    Delete {
        /// The tenant.
        #[arg(long)]
        tenant: String,
    },
}

fn read_input(file: &PathBuf) -> anyhow::Result<String> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
    }
}

/// Validates `doc` with one change applied, as the replicas will.
fn check_whole(doc: &ConfigDoc) -> anyhow::Result<()> {
    build_limits(doc.global.as_ref(), &doc.tiers, &doc.overrides, doc.version)
        .map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
    Ok(())
}

async fn write(
    cfg: &ConfigStore,
    field: Field,
    value: Option<String>,
    args: &AdminArgs,
) -> anyhow::Result<()> {
    let (old, version) = cfg.set(&field, value.as_deref(), &args.actor()).await?;
    if args.json {
        print_json(&serde_json::json!({ "version": version, "old": old, "new": value }))?;
    } else {
        let what = match (&field, value.is_some(), old.is_empty()) {
            (_, false, _) => "deleted",
            (_, true, true) => "created",
            _ => "updated",
        };
        println!(
            "{what} {field:?}; configuration version {version}; every replica applies it within a second"
        );
    }
    Ok(())
}

/// `ctxbudget tiers ...`.
pub async fn tiers(cmd: TiersCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let mut doc = cfg.load().await?;
    match cmd {
        TiersCmd::List => {
            if args.json {
                return print_json(&doc.tiers);
            }
            let rows: Vec<Vec<String>> = doc
                .tiers
                .iter()
                .map(|(name, t)| {
                    vec![
                        name.clone(),
                        t.max_context_tokens.to_string(),
                        t.default_max_output_tokens.to_string(),
                        rate_summary(&t.tenant),
                        rate_summary(&t.user),
                        t.shadow.as_ref().map_or("-".into(), |s| {
                            format!(
                                "tenant {}; user {}",
                                rate_summary(&s.tenant),
                                rate_summary(&s.user)
                            )
                        }),
                    ]
                })
                .collect();
            println!("configuration version {}", doc.version);
            table(
                &["TIER", "CONTEXT", "OUTPUT", "TENANT", "USER", "SHADOW"],
                &rows,
            );
        }
        TiersCmd::Get { name } => {
            let tier = doc.tiers.get(&name).with_context(|| no_tier(&name, &doc))?;
            if args.json {
                return print_json(tier);
            }
            print!("{}", toml::to_string(tier)?);
        }
        TiersCmd::Set { name, file } => {
            let section: TierSection = parse_document(&read_input(&file)?)
                .map_err(|e| anyhow::anyhow!("tiers.{name}.{e}; nothing was written"))?;
            section
                .to_domain(&name)
                .map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
            doc.tiers.insert(name.clone(), section.clone());
            check_whole(&doc)?;
            write(&cfg, Field::Tier(name), Some(document(&section)), &args).await?;
        }
        TiersCmd::Delete { name } => {
            if doc.tiers.remove(&name).is_none() {
                bail!(no_tier(&name, &doc));
            }
            check_whole(&doc)?;
            write(&cfg, Field::Tier(name), None, &args).await?;
        }
        TiersCmd::Import { file } => {
            let text = read_input(&file)?;
            let imported = FileConfig::parse(&text, &file.display().to_string())?;
            let tiers = imported
                .tiers
                .context("the file has no [tiers.*] sections")?;
            for (name, t) in &tiers {
                t.to_domain(name)
                    .map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
                doc.tiers.insert(name.clone(), t.clone());
            }
            check_whole(&doc)?;
            for (name, t) in tiers {
                write(&cfg, Field::Tier(name), Some(document(&t)), &args).await?;
            }
        }
        TiersCmd::Export => {
            if args.json {
                return print_json(&doc.tiers);
            }
            let file = FileConfig {
                tiers: Some(doc.tiers),
                ..FileConfig::default()
            };
            print!("{}", toml::to_string(&file)?);
        }
        TiersCmd::History { limit } => history(&cfg, limit, &args).await?,
    }
    Ok(())
}

fn no_tier(name: &str, doc: &ConfigDoc) -> String {
    let known: Vec<&str> = doc.tiers.keys().map(String::as_str).collect();
    format!("no tier {name:?}; the tiers are: {}", known.join(", "))
}

async fn history(cfg: &ConfigStore, limit: usize, args: &AdminArgs) -> anyhow::Result<()> {
    let entries: Vec<AuditEntry> = cfg.history(limit).await?;
    if args.json {
        return print_json(&entries);
    }
    let short = |s: &str| {
        let s: String = s.chars().take(60).collect();
        if s.is_empty() { "-".to_string() } else { s }
    };
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                utc(e.at_ms),
                e.actor.clone(),
                e.field.clone(),
                e.version.to_string(),
                short(&e.old),
                short(&e.new),
            ]
        })
        .collect();
    table(
        &["WHEN (UTC)", "ACTOR", "WHAT", "VERSION", "OLD", "NEW"],
        &rows,
    );
    Ok(())
}

/// `ms` since the epoch as `YYYY-MM-DD hh:mm:ss`.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `ctxbudget global ...`.
pub async fn global(cmd: GlobalCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let mut doc = cfg.load().await?;
    match cmd {
        GlobalCmd::Get => {
            let global = doc.global.unwrap_or_default();
            if args.json {
                return print_json(&global);
            }
            println!("global: {}", rate_summary(&global));
        }
        GlobalCmd::Set { file } => {
            let section: LevelSection = parse_document(&read_input(&file)?)
                .map_err(|e| anyhow::anyhow!("global.{e}; nothing was written"))?;
            doc.global = Some(section.clone());
            check_whole(&doc)?;
            write(&cfg, Field::Global, Some(document(&section)), &args).await?;
        }
    }
    Ok(())
}

/// `ctxbudget overrides ...`.
pub async fn overrides(cmd: OverridesCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let mut doc = cfg.load().await?;
    match cmd {
        OverridesCmd::List => {
            if args.json {
                return print_json(&doc.overrides);
            }
            let rows: Vec<Vec<String>> = doc
                .overrides
                .iter()
                .map(|(tenant, o)| {
                    vec![
                        tenant.clone(),
                        rate_summary(&o.tenant),
                        rate_summary(&o.user),
                        if o.shadow.is_some() {
                            "yes".into()
                        } else {
                            "-".into()
                        },
                    ]
                })
                .collect();
            table(&["TENANT", "TENANT LIMITS", "USER LIMITS", "SHADOW"], &rows);
        }
        OverridesCmd::Get { tenant } => {
            let o = doc.overrides.get(&tenant).with_context(|| {
                format!("tenant {tenant:?} has no override; its tier's limits apply")
            })?;
            if args.json {
                return print_json(o);
            }
            print!("{}", toml::to_string(o)?);
        }
        OverridesCmd::Set { tenant, file } => {
            crate::domain::TenantId::parse(&tenant)
                .map_err(|e| anyhow::anyhow!("--tenant: {}", e.message))?;
            let section: OverrideSection = parse_document(&read_input(&file)?)
                .map_err(|e| anyhow::anyhow!("overrides.{tenant}.{e}; nothing was written"))?;
            section
                .to_domain(&tenant)
                .map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
            doc.overrides.insert(tenant.clone(), section.clone());
            check_whole(&doc)?;
            write(
                &cfg,
                Field::Override(tenant),
                Some(document(&section)),
                &args,
            )
            .await?;
        }
        OverridesCmd::Delete { tenant } => {
            if doc.overrides.remove(&tenant).is_none() {
                bail!("tenant {tenant:?} has no override");
            }
            write(&cfg, Field::Override(tenant), None, &args).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_the_epoch_and_a_leap_day() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_709_164_800_000), "2024-02-29 00:00:00");
    }
}
