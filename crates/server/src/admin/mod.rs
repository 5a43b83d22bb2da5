//! What operators and finance do, in one implementation for the `ctxbudget`
//! CLI and the HTTP admin API. Changes to the live configuration: each
//! document kind's validation (as a document, then as part of the whole
//! configuration) in [`documents`], blocks in [`blocks`], and [`apply`]: read
//! the configuration, build the change, write it — versioned, audited,
//! announced — refused when its document changed after the version read
//! (retried on a fresh read when the writer named no version, so concurrent
//! writers never undo each other's change). Nothing is written unless
//! everything checks. Beside them, the audit [`history`], [`usage`] reports
//! and [`reconcile`]iation, from any store.

pub mod blocks;
pub mod documents;
pub mod history;
pub mod reconcile;
pub mod usage;

pub use documents::{Change, Kind};

use crate::config::ConfigDoc;
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
    /// The writer's precondition does not hold: the document changed after
    /// the version it read, exists when it should not, or does not when it
    /// should.
    #[error("{0}")]
    Precondition(String),
    /// The configuration could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a writer requires of the document before its change applies
/// (HTTP's `If-Match` and `If-None-Match`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Nothing: the change applies to whatever is stored (the CLI's).
    None,
    /// The document has not changed since this configuration version.
    Unchanged(u64),
    /// The document exists (`If-Match: *`).
    Exists,
    /// The document does not exist yet (`If-None-Match: *`: create only).
    Absent,
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
    /// What else the writer should know (a block that stays).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The document before, as stored ('' if none).
    #[serde(skip)]
    pub old_text: String,
    /// The document after, as stored.
    #[serde(skip)]
    pub new_text: Option<String>,
}

/// Writes made in a row before a writer that named no version gives up on
/// other writers changing the same document.
const ATTEMPTS: usize = 3;

/// Reads the configuration, builds a change of it with `build`, and writes
/// it as `actor` if `precondition` holds. A change built on a read that
/// another writer's change to the same document overtook is built again on
/// a fresh read (at most [`ATTEMPTS`] times) when the writer named no
/// version, and refused when it did.
pub async fn apply(
    cfg: &ConfigStore,
    actor: &str,
    precondition: Precondition,
    mut build: impl FnMut(&mut ConfigDoc) -> Result<Change, AdminError>,
) -> Result<Written, AdminError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut doc = ConfigDoc::from_stored(cfg.load().await?)?;
        let read = doc.version;
        let change = build(&mut doc)?;
        check(precondition, change.existed, &change.field)?;
        let read_at = match precondition {
            Precondition::Unchanged(v) => v,
            _ => read,
        };
        match write(cfg, change, actor, Some(read_at)).await {
            Err(AdminError::Precondition(_))
                if !matches!(precondition, Precondition::Unchanged(_)) && attempt < ATTEMPTS =>
            {
                continue;
            }
            other => return other,
        }
    }
}

/// Refuses a change whose `If-Match: *` or `If-None-Match: *` does not hold.
fn check(precondition: Precondition, existed: bool, field: &Field) -> Result<(), AdminError> {
    match (precondition, existed) {
        (Precondition::Exists, false) => Err(AdminError::Precondition(format!(
            "{field} does not exist (If-Match: *); nothing was written: create it without If-Match"
        ))),
        (Precondition::Absent, true) => Err(AdminError::Precondition(format!(
            "{field} exists already (If-None-Match: *); nothing was written: read it and send its \
             version in If-Match to replace it"
        ))),
        _ => Ok(()),
    }
}

/// Writes `change` as `actor`; with `read_at`, only if its document has not
/// changed since that configuration version (a version the configuration
/// never reached is refused too).
pub async fn write(
    cfg: &ConfigStore,
    change: Change,
    actor: &str,
    read_at: Option<u64>,
) -> Result<Written, AdminError> {
    let outcome = cfg
        .set(&change.field, change.document.as_deref(), actor, read_at)
        .await?;
    let at = read_at.unwrap_or(0);
    match outcome {
        SetOutcome::Written { old, version } => Ok(Written {
            field: change.field.name(),
            version,
            old: (!old.is_empty()).then(|| parsed(&old)),
            new: change.document.as_deref().map(parsed),
            note: change.note,
            old_text: old,
            new_text: change.document,
        }),
        SetOutcome::Stale { changed } => Err(AdminError::Precondition(format!(
            "{} changed at configuration version {changed}, after version {at} it was read at; \
             nothing was written: read it again, reapply the change and send the new version",
            change.field
        ))),
        SetOutcome::Unknown { current } => Err(AdminError::Precondition(format!(
            "version {at} was never the configuration's (it is at version {current}); nothing \
             was written: send the ETag a GET answered"
        ))),
    }
}

/// A stored document as JSON (a document that is not JSON, as a string).
fn parsed(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.into()))
}
