//! `ctxbudget models`: the model groups in the live configuration (Redis) —
//! which models a group covers, its context window, whether cached prompt
//! tokens count, and its limits over the whole upstream account. Changes are
//! validated, versioned, audited and announced like `ctxbudget tiers`; a group
//! a tier still limits cannot be deleted.

use super::admin::{AdminArgs, apply, check_whole, read_input, write_document};
use super::output::{
    outln, print_document, print_json, rate_summary, table, toml_document, write_out,
};
use crate::admin::{Kind, documents};
use crate::config::live::{ConfigDoc, document};
use crate::config::{FileConfig, ModelSection};
use crate::store::config_repo::{ConfigStore, Field};
use anyhow::Context;
use clap::Subcommand;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `ctxbudget models ...`.
#[derive(Debug, Subcommand)]
pub enum ModelsCmd {
    /// List the model groups.
    List,
    /// Show one group as a TOML document that `models set` takes back.
    Get {
        /// The group.
        name: String,
    },
    /// Create or replace a group from a TOML or JSON document (`-`: stdin).
    Set {
        /// The group.
        name: String,
        /// The document: match, and optionally context_window,
        /// cached_input_counts and global.
        file: PathBuf,
    },
    /// Delete a group (refused while a tier sets limits for it).
    Delete {
        /// The group.
        name: String,
    },
    /// Set every group of a configuration file (its [models.*] sections).
    Import {
        /// A configuration file.
        file: PathBuf,
    },
    /// Print every group as a configuration file that `models import` takes.
    Export,
}

/// `ctxbudget models ...`.
pub(super) async fn models(cmd: ModelsCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let doc = ConfigDoc::from_stored(cfg.load().await?)?;
    match cmd {
        ModelsCmd::List => list(&doc, &args),
        ModelsCmd::Get { name } => get(&doc, &name, &args),
        ModelsCmd::Set { name, file } => {
            let text = read_input(&file)?;
            apply(&cfg, &args, |doc| {
                documents::set(doc, Kind::Model, &name, &text)
            })
            .await
        }
        ModelsCmd::Delete { name } => {
            apply(&cfg, &args, |doc| {
                documents::delete(doc, Kind::Model, &name)
            })
            .await
        }
        ModelsCmd::Import { file } => import(&cfg, doc, &file, &args).await,
        ModelsCmd::Export => export(doc, &args),
    }
}

/// `models list`: one row per group.
fn list(doc: &ConfigDoc, args: &AdminArgs) -> anyhow::Result<()> {
    if args.json {
        return print_json(&doc.models);
    }
    let rows: Vec<Vec<String>> = doc
        .models
        .iter()
        .map(|(name, m)| {
            vec![
                name.clone(),
                m.patterns.join(" "),
                m.context_window.map_or("-".into(), |w| w.to_string()),
                m.cached_input_counts.to_string(),
                rate_summary(&m.global),
            ]
        })
        .collect();
    outln!("configuration version {}", doc.version);
    table(
        &["GROUP", "MATCH", "CONTEXT", "CACHED COUNTS", "GLOBAL"],
        &rows,
    );
    Ok(())
}

/// `models get`: the group as a document `models set` takes back.
fn get(doc: &ConfigDoc, name: &str, args: &AdminArgs) -> anyhow::Result<()> {
    let group = doc.models.get(name).with_context(|| no_group(name, doc))?;
    if args.json {
        return print_json(group);
    }
    let mut comments = vec![
        format!(
            "Model group {name} (configuration version {}).",
            doc.version
        ),
        format!("`ctxbudget models set {name} FILE` takes this document back."),
    ];
    let users = documents::users_of(doc, name);
    if !users.is_empty() {
        comments.push(format!("Limited per tier by {}.", users.join(", ")));
    }
    print_document(&comments, group)
}

/// `models import`: every group of a configuration file, all checked before
/// any is written.
async fn import(
    cfg: &ConfigStore,
    mut doc: ConfigDoc,
    file: &PathBuf,
    args: &AdminArgs,
) -> anyhow::Result<()> {
    let text = read_input(file)?;
    let imported = FileConfig::parse(&text, &file.display().to_string())?;
    let groups = imported
        .models
        .context("the file has no [models.*] sections")?;
    let before = doc.clone();
    for (name, m) in &groups {
        m.to_domain(name)
            .map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
        doc.models.insert(name.clone(), m.clone());
    }
    check_whole(&doc)?;
    let (order, all_valid) = write_order(before, &groups);
    if !all_valid {
        eprintln!(
            "note: no order of writing keeps every step valid (patterns move between groups); \
             replicas keep the last valid version until the last group is written"
        );
    }
    for name in order {
        let value = Some(document(&groups[&name]));
        write_document(cfg, Field::Model(name), value, args).await?;
    }
    Ok(())
}

/// An order to write `groups` in, one by one, so that every version between
/// `doc` and the end validates as well (replicas reject an invalid one, and
/// log it); false when no such order was found (the rest is written anyway).
fn write_order(mut doc: ConfigDoc, groups: &BTreeMap<String, ModelSection>) -> (Vec<String>, bool) {
    let mut left: Vec<&String> = groups.keys().collect();
    let mut order = Vec::with_capacity(left.len());
    while !left.is_empty() {
        let next = left.iter().position(|name| {
            let mut step = doc.clone();
            step.models.insert((*name).clone(), groups[*name].clone());
            step.limits().is_ok()
        });
        let Some(i) = next else {
            order.extend(left.into_iter().cloned());
            return (order, false);
        };
        let name = left.remove(i);
        doc.models.insert(name.clone(), groups[name].clone());
        order.push(name.clone());
    }
    (order, true)
}

/// `models export`: every group as a configuration file.
fn export(doc: ConfigDoc, args: &AdminArgs) -> anyhow::Result<()> {
    if args.json {
        return print_json(&doc.models);
    }
    let file = FileConfig {
        models: Some(doc.models),
        ..FileConfig::default()
    };
    write_out(&toml_document(&file)?);
    Ok(())
}

fn no_group(name: &str, doc: &ConfigDoc) -> String {
    let known: Vec<&str> = doc.models.keys().map(String::as_str).collect();
    match known.is_empty() {
        true => format!("no model group {name:?}; there are none yet"),
        false => format!(
            "no model group {name:?}; the groups are: {}",
            known.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::documents::still_used;
    use crate::config::parse_document;

    fn group(patterns: &str) -> ModelSection {
        parse_document(&format!("match = {patterns}\n")).unwrap()
    }

    fn doc(groups: &[(&str, &str)]) -> ConfigDoc {
        let tier = "max_context_tokens = 1000\ndefault_max_output_tokens = 10\n";
        let mut doc = ConfigDoc::default();
        doc.tiers
            .insert("pro".into(), parse_document(tier).unwrap());
        for (name, patterns) in groups {
            doc.models.insert(name.to_string(), group(patterns));
        }
        doc
    }

    #[test]
    fn an_import_is_written_in_an_order_that_keeps_every_version_valid() {
        // z gives up "gpt-4o-mini" to a new group a: z must be written first.
        let before = doc(&[("z", r#"["gpt-4o*"]"#)]);
        let import = doc(&[("a", r#"["gpt-4o-mini"]"#), ("z", r#"["gpt-4o"]"#)]).models;
        assert_eq!(
            write_order(before, &import),
            (vec!["z".into(), "a".into()], true)
        );
        // Two groups swapping patterns: every order has an invalid step.
        let before = doc(&[("a", r#"["x"]"#), ("b", r#"["y"]"#)]);
        let import = doc(&[("a", r#"["y"]"#), ("b", r#"["x"]"#)]).models;
        let (order, valid) = write_order(before, &import);
        assert_eq!((order.len(), valid), (2, false));
    }

    #[test]
    fn a_group_a_tier_limits_is_not_deleted_and_the_message_says_what_to_do() {
        let mut doc = doc(&[("gpt-4o", r#"["gpt-4o"]"#)]);
        assert_eq!(still_used(&doc, "gpt-4o"), None);
        let tier = "max_context_tokens = 1000\ndefault_max_output_tokens = 10\n\
                    [shadow.models.gpt-4o.user]\nconcurrency = 1\n";
        doc.tiers
            .insert("free".into(), parse_document(tier).unwrap());
        let why = still_used(&doc, "gpt-4o").unwrap();
        assert!(
            why.contains("tier free (tiers.free.shadow.models.gpt-4o)"),
            "{why}"
        );
        assert!(
            why.contains("`ctxbudget tiers set free free.toml`"),
            "{why}"
        );
    }
}
