//! `ctxbudget envoy`: how Envoy's rate limit descriptors map to budget levels
//! (`[envoy]`), in the live configuration (Redis). Changes are validated,
//! versioned, audited and announced like `ctxbudget tiers`; every replica
//! applies them within a second.

use super::admin::{AdminArgs, check_whole, read_input, write};
use super::output::{print_document, print_json};
use crate::config::live::{ConfigDoc, document};
use crate::config::{EnvoySection, parse_document};
use crate::store::config_repo::Field;
use clap::Subcommand;
use std::path::PathBuf;

/// `ctxbudget envoy ...`.
#[derive(Debug, Subcommand)]
pub enum EnvoyCmd {
    /// Show the map as a TOML document that `envoy set` takes back.
    Get,
    /// Set the map from a TOML or JSON document (`-`: stdin); keys left out
    /// take their defaults.
    Set {
        /// The document.
        file: PathBuf,
    },
    /// Go back to the defaults.
    Reset,
}

/// `ctxbudget envoy ...`.
pub(super) async fn envoy(cmd: EnvoyCmd, args: AdminArgs) -> anyhow::Result<()> {
    let cfg = args.connect().await?;
    let mut doc = ConfigDoc::from_stored(cfg.load().await?)?;
    match cmd {
        EnvoyCmd::Get => {
            let stored = doc.envoy.is_some();
            let section = doc.envoy.unwrap_or_default();
            if args.json {
                return print_json(&section);
            }
            let origin = match stored {
                true => format!("configuration version {}", doc.version),
                false => "the defaults: none is stored".into(),
            };
            print_document(
                &[
                    format!("How Envoy's rate limit descriptors map to budgets ({origin})."),
                    "`ctxbudget envoy set FILE` takes this document back (docs/envoy.md).".into(),
                ],
                &section,
            )
        }
        EnvoyCmd::Set { file } => {
            let section: EnvoySection = parse_document(&read_input(&file)?)
                .map_err(|e| anyhow::anyhow!("envoy.{e}; nothing was written"))?;
            doc.envoy = Some(section.clone());
            check_whole(&doc)?;
            write(&cfg, Field::Envoy, Some(document(&section)), &args).await
        }
        EnvoyCmd::Reset => {
            doc.envoy = None;
            check_whole(&doc)?;
            write(&cfg, Field::Envoy, None, &args).await
        }
    }
}
