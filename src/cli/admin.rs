//! Where the operator commands find the live configuration (`AdminArgs`),
//! and how they make and report a change of it: through [`crate::admin`],
//! as the admin API does, changed on every replica at once. Every change is
//! validated — as a document and as part of the whole configuration — before
//! anything is written; then written, versioned, audited and announced in
//! one step.

use super::output::{outln, print_json};
use crate::admin::{Change, Precondition, documents};
use crate::config::live::ConfigDoc;
use crate::store::config_repo::{ConfigStore, Field};
use crate::store::keys::Keys;
use crate::store::redis::Endpoint;
use anyhow::Context;
use clap::Args;
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
