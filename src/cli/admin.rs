//! `ctxbudget tiers|global|overrides`: the live configuration in Redis, changed
//! on every replica at once. Every change is validated — as a document and as
//! part of the whole configuration — before anything is written; then written,
//! versioned, audited and announced in one step.

use super::output::{
    outln, print_document, print_json, rate_summary, table, toml_document, write_out,
};
use crate::admin::{Change, Kind, Precondition, documents};
use crate::config::FileConfig;
use crate::config::live::{ConfigDoc, document};
use crate::store::config_repo::{ConfigStore, Field};
use crate::store::keys::Keys;
use crate::store::redis::Endpoint;
use anyhow::Context;
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
    /// A Redis Cluster's nodes, comma-separated (instead of --redis-url).
    #[arg(
        long,
        env = "CTXBUDGET_REDIS_CLUSTER_NODES",
        hide_env_values = true,
        value_delimiter = ',',
        global = true
    )]
    pub redis_cluster_nodes: Vec<String>,
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
        let endpoint = self.endpoint().context(
            "the live configuration is in Redis: pass --redis-url or set CTXBUDGET_REDIS_URL \
             (or --redis-cluster-nodes / CTXBUDGET_REDIS_CLUSTER_NODES; in memory mode, edit \
             the configuration file and send the service SIGHUP)",
        )?;
        Ok(ConfigStore::connect(&endpoint, &self.tls(), &self.key_prefix).await?)
    }

    /// The Redis (or Redis Cluster) named, if any.
    pub fn endpoint(&self) -> Option<Endpoint> {
        Endpoint::of(self.redis_url.as_deref(), &self.redis_cluster_nodes)
    }

    /// The TLS files named.
    pub fn tls(&self) -> crate::store::redis::RedisTls {
        crate::store::redis::RedisTls {
            ca: self.redis_tls_ca.clone(),
            cert: self.redis_tls_cert.clone(),
            key: self.redis_tls_key.clone(),
        }
    }

    /// The service's keys under `--key-prefix`, in the cluster layout on a cluster.
    pub fn keys(&self) -> anyhow::Result<Keys> {
        let keys = Keys::new(&self.key_prefix)?;
        Ok(match self.endpoint().is_some_and(|e| e.is_cluster()) {
            true => keys.clustered(),
            false => keys,
        })
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

pub(super) fn read_input(file: &PathBuf) -> anyhow::Result<String> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))
    }
}

/// Validates `doc` with one change applied, as the replicas will.
pub(super) fn check_whole(doc: &ConfigDoc) -> anyhow::Result<()> {
    Ok(documents::check_whole(doc)?)
}

/// Makes the change `build` makes of the configuration (through
/// [`crate::admin::apply`], as the admin API does: built again on a fresh
/// read if another writer changed the same document meanwhile) and says
/// what happened, in words.
pub(super) async fn apply(
    cfg: &ConfigStore,
    args: &AdminArgs,
    build: impl FnMut(&mut ConfigDoc) -> Result<Change, crate::admin::AdminError>,
) -> anyhow::Result<()> {
    let written = crate::admin::apply(cfg, &args.actor(), Precondition::None, build).await?;
    report(&written, args)
}

/// Writes one change as built (an import's, whose documents were all
/// checked together) and says what happened, in words.
pub(super) async fn write(
    cfg: &ConfigStore,
    change: Change,
    args: &AdminArgs,
) -> anyhow::Result<()> {
    let written = crate::admin::write(cfg, change, &args.actor(), None).await?;
    report(&written, args)
}

/// What a written change says: a line (and its note), or `--json`.
fn report(written: &crate::admin::Written, args: &AdminArgs) -> anyhow::Result<()> {
    if let Some(note) = &written.note {
        eprintln!("{note}");
    }
    if args.json {
        return print_json(&serde_json::json!({
            "version": written.version,
            "old": written.old_text,
            "new": written.new_text,
        }));
    }
    let what = match (written.new.is_some(), written.old.is_none()) {
        (false, _) => "deleted",
        (true, true) => "created",
        _ => "updated",
    };
    let field = Field::parse(&written.field).map_or(written.field.clone(), |f| f.to_string());
    outln!(
        "{what} {field} (configuration version {}); every replica applies it within a second",
        written.version
    );
    Ok(())
}

/// Writes the document `field` holds in `doc`, as the CLI's own verbs
/// (imports, blocks) build it.
pub(super) async fn write_document(
    cfg: &ConfigStore,
    field: Field,
    value: Option<String>,
    args: &AdminArgs,
) -> anyhow::Result<()> {
    let change = Change {
        field,
        document: value,
        note: None,
        existed: true,
    };
    write(cfg, change, args).await
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
