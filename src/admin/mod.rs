//! Changes to the live configuration, in one implementation for the
//! `ctxbudget` CLI and the HTTP admin API: each document kind's validation
//! (as a document, then as part of the whole configuration) in
//! [`documents`], and the write — versioned, audited, announced, and refused
//! when the document changed after the version the writer read — in
//! [`write`]. Nothing is written unless everything checks.

pub mod blocks;
pub mod documents;
pub mod history;
pub mod reconcile;
pub mod usage;

pub use documents::{Change, Kind};

use crate::store::StoreError;
use crate::store::config_repo::{ConfigStore, Field, SetOutcome};

/// Why a change was not made. Every message ends by saying so.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The document, or the configuration with it, breaks a rule.
    #[error("{0}")]
    Invalid(String),
    /// No such document.
    #[error("{0}")]
    NotFound(String),
    /// The document changed after the version the writer read.
    #[error(
        "{field} changed at configuration version {changed}, after version {read_at} you read it \
         at; nothing was written: read it again, reapply your change and send the new version"
    )]
    Stale {
        /// The document.
        field: Field,
        /// The version the writer read.
        read_at: u64,
        /// The version of its last change.
        changed: u64,
    },
    /// The configuration could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A change as written.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Written {
    /// The document changed, as its hash field names it (`tier:pro`).
    pub field: String,
    /// The configuration version the change produced.
    pub version: u64,
    /// The document before (`None`: it did not exist).
    pub old: Option<serde_json::Value>,
    /// The document after (`None`: deleted).
    pub new: Option<serde_json::Value>,
}

/// Writes `change` as `actor`; with `read_at`, only if its document has not
/// changed since that configuration version.
pub async fn write(
    cfg: &ConfigStore,
    change: Change,
    actor: &str,
    read_at: Option<u64>,
) -> Result<Written, AdminError> {
    let outcome = cfg
        .set(&change.field, change.document.as_deref(), actor, read_at)
        .await?;
    match outcome {
        SetOutcome::Written { old, version } => Ok(Written {
            field: change.field.name(),
            version,
            old: (!old.is_empty()).then(|| parsed(&old)),
            new: change.document.as_deref().map(parsed),
        }),
        SetOutcome::Stale { changed } => Err(AdminError::Stale {
            field: change.field,
            read_at: read_at.unwrap_or(0),
            changed,
        }),
    }
}

/// A stored document as JSON (a document that is not JSON, as a string).
fn parsed(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.into()))
}
