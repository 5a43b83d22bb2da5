//! `ctxbudget envoy` and `ctxbudget ext-proc`: the Envoy services' settings
//! (`[envoy]`, how rate limit descriptors map to budget levels; `[ext_proc]`,
//! how the external processor reads requests), one document each in the
//! live configuration (Redis). Changes are validated, versioned, audited and
//! announced like `ctxbudget tiers`; every replica applies them within a
//! second.

use super::admin::{AdminArgs, apply, read_input};
use super::output::{print_document, print_json};
use crate::admin::{Kind, documents};
use crate::config::live::ConfigDoc;
use crate::config::{EnvoySection, ExtProcSection};
use clap::Subcommand;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

/// `ctxbudget envoy ...` and `ctxbudget ext-proc ...`.
#[derive(Debug, Subcommand)]
pub enum SectionCmd {
    /// Show the section as a TOML document that `set` takes back.
    Get,
    /// Set the section from a TOML or JSON document (`-`: stdin); keys left
    /// out take their defaults.
    Set {
        /// The document.
        file: PathBuf,
    },
    /// Go back to the defaults.
    Reset,
}

/// One single-document section of the live configuration.
struct Section<T> {
    /// The command that manages it.
    command: &'static str,
    /// What it is, for `get`'s header.
    about: &'static str,
    /// Its kind of document.
    kind: Kind,
    /// Its place in the documents.
    slot: fn(&mut ConfigDoc) -> &mut Option<T>,
}

/// `ctxbudget envoy ...`.
pub(super) async fn envoy(cmd: SectionCmd, args: AdminArgs) -> anyhow::Result<()> {
    let section = Section::<EnvoySection> {
        command: "envoy",
        about: "How Envoy's rate limit descriptors map to budgets",
        kind: Kind::Envoy,
        slot: |d| &mut d.envoy,
    };
    run(section, cmd, args, "docs/envoy.md").await
}

/// `ctxbudget ext-proc ...`.
pub(super) async fn ext_proc(cmd: SectionCmd, args: AdminArgs) -> anyhow::Result<()> {
    let section = Section::<ExtProcSection> {
        command: "ext-proc",
        about: "How Envoy's external processor reads requests",
        kind: Kind::ExtProc,
        slot: |d| &mut d.ext_proc,
    };
    run(section, cmd, args, "docs/ext_proc.md").await
}

async fn run<T>(
    section: Section<T>,
    cmd: SectionCmd,
    args: AdminArgs,
    docs: &str,
) -> anyhow::Result<()>
where
    T: Serialize + DeserializeOwned + Default + Clone,
{
    let cfg = args.connect().await?;
    let mut doc = ConfigDoc::from_stored(cfg.load().await?)?;
    let version = doc.version;
    let slot = (section.slot)(&mut doc);
    match cmd {
        SectionCmd::Get => {
            let stored = slot.is_some();
            let value = slot.clone().unwrap_or_default();
            if args.json {
                return print_json(&value);
            }
            let origin = match stored {
                true => format!("configuration version {version}"),
                false => "the defaults: none is stored".into(),
            };
            print_document(
                &[
                    format!("{} ({origin}).", section.about),
                    format!(
                        "`ctxbudget {} set FILE` takes this document back ({docs}).",
                        section.command
                    ),
                ],
                &value,
            )
        }
        SectionCmd::Set { file } => {
            let text = read_input(&file)?;
            apply(&cfg, &args, |doc| {
                documents::set(doc, section.kind, "", &text)
            })
            .await
        }
        SectionCmd::Reset => {
            apply(&cfg, &args, |doc| documents::delete(doc, section.kind, "")).await
        }
    }
}
