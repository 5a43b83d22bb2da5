//! `ctxbudget prices`: each model group's prices in the live configuration
//! (Redis), USD per million tokens — what spend limits charge. Changes are
//! validated, versioned, audited and announced like `ctxbudget tiers`.

use super::admin::{AdminArgs, apply, check_whole, read_input, write_document};
use super::output::{outln, print_document, print_json, table, toml_document, write_out};
use crate::admin::{Kind, documents};
use crate::config::FileConfig;
use crate::config::live::{ConfigDoc, document};
use crate::store::config_repo::Field;
use anyhow::Context;
use clap::Subcommand;
use std::path::PathBuf;

/// `ctxbudget prices ...`.
#[derive(Debug, Subcommand)]
pub enum PricesCmd {
    /// List every model group's prices.
    List,
    /// Show one group's prices as a TOML document that `prices set` takes back.
    Get {
        /// The model group.
        group: String,
    },
    /// Set a group's prices from a TOML or JSON document (`-`: stdin):
    /// input, output and optionally cached_input, cache_write, cache_write_1h,
    /// reasoning (USD per million tokens), per_call (USD a call), image (USD
    /// an image) and
    /// [[above]] long-context tiers.
    Set {
        /// The model group.
        group: String,
        /// The document.
        file: PathBuf,
    },
    /// Remove a group's prices: its requests cost nothing from then on.
    Delete {
        /// The model group.
        group: String,
    },
    /// Set every price of a configuration file (its [prices.*] sections).
    Import {
        /// A configuration file.
        file: PathBuf,
    },
    /// Print every price as a configuration file that `prices import` takes.
    Export,
}

/// `ctxbudget prices ...`.
pub(super) async fn prices(cmd: PricesCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let mut doc = ConfigDoc::from_stored(cfg.load().await?)?;
    match cmd {
        PricesCmd::List => list(&doc, &args),
        PricesCmd::Get { group } => get(&doc, &group, &args),
        PricesCmd::Set { group, file } => {
            let text = read_input(&file)?;
            apply(&cfg, &args, |doc| {
                documents::set(doc, Kind::Price, &group, &text)
            })
            .await
        }
        PricesCmd::Delete { group } => {
            apply(&cfg, &args, |doc| {
                documents::delete(doc, Kind::Price, &group)
            })
            .await
        }
        PricesCmd::Import { file } => {
            let text = read_input(&file)?;
            let imported = FileConfig::parse(&text, &file.display().to_string())?;
            let prices = imported
                .prices
                .context("the file has no [prices.*] sections")?;
            doc.prices.extend(prices.clone());
            check_whole(&doc)?;
            for (group, p) in prices {
                write_document(&cfg, Field::Price(group), Some(document(&p)), &args).await?;
            }
            Ok(())
        }
        PricesCmd::Export => {
            if args.json {
                return print_json(&doc.prices);
            }
            let file = FileConfig {
                prices: Some(doc.prices),
                ..FileConfig::default()
            };
            write_out(&toml_document(&file)?);
            Ok(())
        }
    }
}

/// `prices get`: the group's prices as a document `prices set` takes back.
fn get(doc: &ConfigDoc, group: &str, args: &AdminArgs) -> anyhow::Result<()> {
    let price = doc
        .prices
        .get(group)
        .with_context(|| no_price(group, doc))?;
    if args.json {
        return print_json(price);
    }
    print_document(
        &[
            format!(
                "Prices of model group {group}, USD per million tokens, per_call USD a call, \
                 image USD an image \
                 (configuration version {}).",
                doc.version
            ),
            format!("`ctxbudget prices set {group} FILE` takes this document back."),
        ],
        price,
    )
}

/// `prices list`: one row per group with a price.
fn list(doc: &ConfigDoc, args: &AdminArgs) -> anyhow::Result<()> {
    if args.json {
        return print_json(&doc.prices);
    }
    let usd = |v: f64| format!("{v}");
    let rows: Vec<Vec<String>> = doc
        .prices
        .iter()
        .map(|(group, p)| {
            let tiers: Vec<String> = p
                .above
                .iter()
                .map(|t| format!(">{}", t.prompt_tokens))
                .collect();
            vec![
                group.clone(),
                usd(p.input),
                usd(p.cached_input.unwrap_or(p.input)),
                usd(p.cache_write.unwrap_or(p.input)),
                usd(p.cache_write_1h.unwrap_or(p.input)),
                usd(p.output),
                usd(p.reasoning.unwrap_or(p.output)),
                usd(p.per_call.unwrap_or(0.0)),
                usd(p.image.unwrap_or(0.0)),
                if tiers.is_empty() {
                    "-".into()
                } else {
                    tiers.join(" ")
                },
            ]
        })
        .collect();
    outln!(
        "configuration version {}; USD per million tokens (PER CALL: USD a call; IMAGE: USD \
         an image; LONG CONTEXT: prompt sizes above which a tier prices the call, `prices get`)",
        doc.version
    );
    table(
        &[
            "MODEL GROUP",
            "INPUT",
            "CACHED INPUT",
            "CACHE WRITE",
            "CACHE WRITE 1H",
            "OUTPUT",
            "REASONING",
            "PER CALL",
            "IMAGE",
            "LONG CONTEXT",
        ],
        &rows,
    );
    Ok(())
}

fn no_price(group: &str, doc: &ConfigDoc) -> String {
    let known: Vec<&str> = doc.prices.keys().map(String::as_str).collect();
    format!(
        "model group {group:?} has no price; the groups with one: {}",
        if known.is_empty() {
            "none".into()
        } else {
            known.join(", ")
        }
    )
}
