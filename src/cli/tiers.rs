//! `ctxbudget tiers` and `ctxbudget global`: the tiers and the global limits
//! of the live configuration, changed through [`crate::admin`] as the admin
//! API changes them; `tiers history`, the audit log.

use super::admin::{AdminArgs, apply, check_whole, read_input, write_document};
use super::output::{
    outln, print_document, print_json, rate_summary, table, toml_document, write_out,
};
use crate::admin::{Kind, documents};
use crate::config::FileConfig;
use crate::config::live::{ConfigDoc, document};
use crate::store::config_repo::{ConfigStore, Field};
use anyhow::Context;
use clap::Subcommand;
use std::path::PathBuf;

/// `ctxbudget tiers ...`.
#[derive(Debug, Subcommand)]
pub enum TiersCmd {
    /// List the tiers.
    List,
    /// Show one tier as a TOML document that `tiers set` takes back.
    Get {
        /// The tier.
        name: String,
    },
    /// Create or replace a tier from a TOML or JSON document (`-`: stdin).
    Set {
        /// The tier.
        name: String,
        /// The document: max_context_tokens, default_max_output_tokens, tenant,
        /// user and optionally shadow and models (limits per model group).
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
    /// Show the global limits as a TOML document that `global set` takes back.
    Get,
    /// Replace the global limits from a TOML or JSON document (`-`: stdin).
    Set {
        /// The document: requests, tokens, concurrency.
        file: PathBuf,
    },
}

/// `ctxbudget tiers ...`.
pub(super) async fn tiers(cmd: TiersCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let doc = ConfigDoc::from_stored(cfg.load().await?)?;
    match cmd {
        TiersCmd::List => list_tiers(&doc, &args),
        TiersCmd::Get { name } => get_tier(&doc, &name, &args),
        TiersCmd::Set { name, file } => {
            let text = read_input(&file)?;
            apply(&cfg, &args, |doc| {
                documents::set(doc, Kind::Tier, &name, &text)
            })
            .await
        }
        TiersCmd::Delete { name } => {
            apply(&cfg, &args, |doc| documents::delete(doc, Kind::Tier, &name)).await
        }
        TiersCmd::Import { file } => import_tiers(&cfg, doc, &file, &args).await,
        TiersCmd::Export => export_tiers(doc, &args),
        TiersCmd::History { limit } => print_history(&cfg, limit, args.json).await,
    }
}

/// `tiers list`: one row per tier.
fn list_tiers(doc: &ConfigDoc, args: &AdminArgs) -> anyhow::Result<()> {
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
                match t.models.is_empty() {
                    true => "-".into(),
                    false => t.models.keys().cloned().collect::<Vec<_>>().join(", "),
                },
            ]
        })
        .collect();
    outln!("configuration version {}", doc.version);
    table(
        &[
            "TIER", "CONTEXT", "OUTPUT", "TENANT", "USER", "SHADOW", "MODELS",
        ],
        &rows,
    );
    Ok(())
}

/// `tiers get`: the tier as a document `tiers set` takes back.
fn get_tier(doc: &ConfigDoc, name: &str, args: &AdminArgs) -> anyhow::Result<()> {
    let tier = doc.tiers.get(name).with_context(|| no_tier(name, doc))?;
    if args.json {
        return print_json(tier);
    }
    print_document(
        &[
            format!("Tier {name} (configuration version {}).", doc.version),
            format!("`ctxbudget tiers set {name} FILE` takes this document back."),
        ],
        tier,
    )
}

/// `tiers import`: every tier of a configuration file, all checked before any
/// is written.
async fn import_tiers(
    cfg: &ConfigStore,
    mut doc: ConfigDoc,
    file: &PathBuf,
    args: &AdminArgs,
) -> anyhow::Result<()> {
    let text = read_input(file)?;
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
        write_document(cfg, Field::Tier(name), Some(document(&t)), args).await?;
    }
    Ok(())
}

/// `tiers export`: every tier as a configuration file.
fn export_tiers(doc: ConfigDoc, args: &AdminArgs) -> anyhow::Result<()> {
    if args.json {
        return print_json(&doc.tiers);
    }
    let file = FileConfig {
        tiers: Some(doc.tiers),
        ..FileConfig::default()
    };
    write_out(&toml_document(&file)?);
    Ok(())
}

fn no_tier(name: &str, doc: &ConfigDoc) -> String {
    let known: Vec<&str> = doc.tiers.keys().map(String::as_str).collect();
    format!("no tier {name:?}; the tiers are: {}", known.join(", "))
}

/// `ctxbudget global ...`.
pub(super) async fn global(cmd: GlobalCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let doc = ConfigDoc::from_stored(cfg.load().await?)?;
    match cmd {
        GlobalCmd::Get => {
            let global = doc.global.unwrap_or_default();
            if args.json {
                return print_json(&global);
            }
            print_document(
                &[
                    format!(
                        "The global limits (configuration version {}): {}.",
                        doc.version,
                        rate_summary(&global)
                    ),
                    "`ctxbudget global set FILE` takes this document back.".into(),
                ],
                &global,
            )?;
        }
        GlobalCmd::Set { file } => {
            let text = read_input(&file)?;
            apply(&cfg, &args, |doc| {
                documents::set(doc, Kind::Global, "", &text)
            })
            .await?;
        }
    }
    Ok(())
}

/// `tiers history`: the newest `limit` audit entries, each with what it
/// changed (as JSON with `json`: `--json`).
async fn print_history(cfg: &ConfigStore, limit: usize, json: bool) -> anyhow::Result<()> {
    let shown = crate::admin::history::history(cfg, None, limit).await?;
    if json {
        let entries: Vec<_> = shown.into_iter().map(|s| s.entry).collect();
        return print_json(&entries);
    }
    if shown.is_empty() {
        outln!("(no changes recorded)");
    }
    for s in &shown {
        let e = &s.entry;
        outln!(
            "{} UTC  {}  {}  version {} ({})",
            s.at,
            e.actor,
            e.field,
            e.version,
            s.what
        );
        for line in &s.changes {
            outln!("    {line}");
        }
    }
    Ok(())
}
