//! The live configuration in Redis: tiers, model groups, global limits and tenants' overrides
//! as JSON documents in one hash, with a version that every change bumps, an
//! audit stream, and a channel on which changes are announced.
//!
//! ```text
//! ctxb:cfg            hash    version; global; model:<group>; tier:<name>; override:<tenant>
//! ctxb:cfg:audit      stream  actor, field, old, new, version, at_ms (capped)
//! ctxb:cfg:changed    channel the new version, on every change
//! ```
//!
//! Changes go through `lua/config_set.lua`: write, version, audit and notify at
//! once. The documents are opaque here (JSON text by field): `config::live`
//! reads them as sections and writes sections as them. Callers validate
//! documents before writing; replicas validate again on load and keep their
//! last good configuration if a document is bad. The key and field names are
//! built in `store::keys`.

use super::StoreError;
use super::keys::{config_audit, config_channel, config_field, config_hash};
use super::redis::wire::Args;
use super::redis::{Endpoint, RedisTls, SharedConn};
use super::scripts;
use redis::{AsyncCommands, Script};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// `lua/config_seed.lua`, loaded once (NOSCRIPT reloads it).
static SEED: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CONFIG_SEED));
/// `lua/config_set.lua`, loaded once (NOSCRIPT reloads it).
static SET: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CONFIG_SET));

/// Audit entries kept (approximately).
pub const AUDIT_KEEP: u64 = 10_000;

/// The configuration documents as stored: JSON text by the field holding it.
#[derive(Clone, Debug, Default)]
pub struct StoredConfig {
    /// The version (0: never written).
    pub version: u64,
    /// Every document, by the field that holds it (fields no document kind
    /// names are left out).
    pub documents: Vec<(Field, String)>,
    /// The hash they were read from, for messages.
    pub source: String,
}

/// What a [`ConfigStore::set`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetOutcome {
    /// Written as version `version`; `old` the document before ('' if none).
    Written {
        /// The document before ('' if none).
        old: String,
        /// The configuration version the change produced.
        version: u64,
    },
    /// Refused: the document changed (at version `changed`) after the
    /// version the writer read; nothing was written.
    Stale {
        /// The version of the document's last change.
        changed: u64,
    },
    /// Refused: the writer named a version the configuration never reached
    /// (it is at `current`); nothing was written.
    Unknown {
        /// The configuration's version.
        current: u64,
    },
}

/// One audited change.
#[derive(Clone, Debug, Serialize)]
pub struct AuditEntry {
    /// Stream id (time-ordered).
    pub id: String,
    /// Who: `--actor` or the OS user.
    pub actor: String,
    /// What: `tier:<name>`, `model:<group>`, `global`, `override:<tenant>`, or
    /// `*` for a seed.
    pub field: String,
    /// The document before ('' if none).
    pub old: String,
    /// The document after ('' if deleted).
    pub new: String,
    /// The configuration version the change produced.
    pub version: u64,
    /// When, ms since the Unix epoch (Redis time).
    pub at_ms: u64,
}

/// Which document a change is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    /// The global limits.
    Global,
    /// A model group.
    Model(String),
    /// A model group's prices.
    Price(String),
    /// A tier.
    Tier(String),
    /// A tenant's override.
    Override(String),
    /// The Envoy descriptor map.
    Envoy,
    /// How the external processor reads requests.
    ExtProc,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Global => f.write_str("the global limits"),
            Field::Model(m) => write!(f, "model group {m}"),
            Field::Price(m) => write!(f, "the prices of model group {m}"),
            Field::Tier(t) => write!(f, "tier {t}"),
            Field::Override(t) => write!(f, "the override of tenant {t}"),
            Field::Envoy => f.write_str("the Envoy descriptor map"),
            Field::ExtProc => f.write_str("the external processor's settings"),
        }
    }
}

impl Field {
    /// The document a hash field holds; `None` for the version and for
    /// fields no document kind names.
    pub fn parse(field: &str) -> Option<Field> {
        if field == config_field::GLOBAL {
            Some(Field::Global)
        } else if field == config_field::ENVOY {
            Some(Field::Envoy)
        } else if field == config_field::EXT_PROC {
            Some(Field::ExtProc)
        } else if let Some(name) = config_field::as_price(field) {
            Some(Field::Price(name.into()))
        } else if let Some(name) = config_field::as_model(field) {
            Some(Field::Model(name.into()))
        } else if let Some(name) = config_field::as_tier(field) {
            Some(Field::Tier(name.into()))
        } else {
            config_field::as_override(field).map(|tenant| Field::Override(tenant.into()))
        }
    }

    /// The hash field that holds the document.
    pub fn name(&self) -> String {
        match self {
            Field::Global => config_field::GLOBAL.into(),
            Field::Model(m) => config_field::model(m),
            Field::Price(m) => config_field::price(m),
            Field::Tier(t) => config_field::tier(t),
            Field::Override(t) => config_field::override_of(t),
            Field::Envoy => config_field::ENVOY.into(),
            Field::ExtProc => config_field::EXT_PROC.into(),
        }
    }
}

/// The live configuration of one key prefix.
#[derive(Clone)]
pub struct ConfigStore {
    /// One Redis's client, for a subscription; `None` on a cluster (replicas
    /// check the version every second instead).
    client: Option<redis::Client>,
    conn: SharedConn,
    hash: String,
    audit: String,
    channel: String,
    url: String,
}

impl ConfigStore {
    /// Connects to the configuration under `prefix` (lazily: a Redis down at
    /// start-up is reached once it answers).
    pub async fn connect(
        endpoint: &Endpoint,
        tls: &RedisTls,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        let (conn, client) = endpoint.connect(tls)?;
        let cluster = endpoint.is_cluster();
        Ok(ConfigStore {
            client,
            conn,
            hash: config_hash(prefix, cluster),
            audit: config_audit(prefix, cluster),
            channel: config_channel(prefix),
            url: endpoint.shown(),
        })
    }

    /// The channel changes are announced on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// A client for a subscription of its own (one Redis only).
    pub fn client(&self) -> Option<&redis::Client> {
        self.client.as_ref()
    }

    /// The shared connection, for reads beside the configuration.
    pub fn connection(&self) -> SharedConn {
        self.conn.clone()
    }

    fn err(&self, e: redis::RedisError) -> StoreError {
        StoreError::Unavailable(format!("{}: {e}", self.url).into())
    }

    /// The current version (0: never written).
    pub async fn version(&self) -> Result<u64, StoreError> {
        let v: Option<u64> = self
            .conn
            .clone()
            .hget(&self.hash, config_field::VERSION)
            .await
            .map_err(|e| self.err(e))?;
        Ok(v.unwrap_or(0))
    }

    /// Every document, as stored. A version that is not a number is an error.
    pub async fn load(&self) -> Result<StoredConfig, StoreError> {
        let all: BTreeMap<String, String> = self
            .conn
            .clone()
            .hgetall(&self.hash)
            .await
            .map_err(|e| self.err(e))?;
        let mut stored = StoredConfig {
            source: self.hash.clone(),
            ..StoredConfig::default()
        };
        for (field, value) in all {
            if field == config_field::VERSION {
                stored.version = value.parse().map_err(|_| {
                    StoreError::Protocol(format!("{field} in {}: not a number", self.hash).into())
                })?;
            } else if let Some(field) = Field::parse(&field) {
                stored.documents.push((field, value));
            }
        }
        Ok(stored)
    }

    /// Writes `documents` if Redis holds no tier yet. Returns the new version,
    /// or `None` when Redis was already configured.
    pub async fn seed(
        &self,
        documents: &[(Field, String)],
        actor: &str,
    ) -> Result<Option<u64>, StoreError> {
        use super::redis::spec::{config_keys as k, config_seed_argv as a};
        let mut inv = SEED.prepare_invoke();
        let mut args = Args::new(&mut inv);
        args.key(k::HASH, self.hash.clone())
            .key(k::AUDIT, self.audit.clone())
            .at(a::ACTOR, actor)
            .at(a::CHANNEL, &self.channel)
            .at(a::AUDIT_KEEP, AUDIT_KEEP);
        // Then field, document pairs.
        for (field, document) in documents {
            let at = args.next();
            args.at(at, field.name()).at(at + 1, document);
        }
        let v: u64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.err(e))?;
        Ok((v > 0).then_some(v))
    }

    /// Sets (`Some`) or deletes (`None`) one document; with `read_at`, only
    /// if the document has not changed since that configuration version.
    pub async fn set(
        &self,
        field: &Field,
        document: Option<&str>,
        actor: &str,
        read_at: Option<u64>,
    ) -> Result<SetOutcome, StoreError> {
        let name = field.name();
        use super::redis::spec::{config_keys as k, config_set_argv as a, config_set_reply as r};
        let mut inv = SET.prepare_invoke();
        Args::new(&mut inv)
            .key(k::HASH, self.hash.clone())
            .key(k::AUDIT, self.audit.clone())
            .at(a::FIELD, &name)
            .at(a::DOCUMENT, document.unwrap_or(""))
            .at(a::ACTOR, actor)
            .at(a::CHANNEL, &self.channel)
            .at(a::AUDIT_KEEP, AUDIT_KEEP)
            .at(a::READ_AT, read_at.map_or(String::new(), |v| v.to_string()))
            .at(a::CHANGED_FIELD, config_field::changed(&name));
        let reply: Vec<redis::Value> = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.err(e))?;
        let value = |i: usize| reply.get(i).cloned().unwrap_or(redis::Value::Nil);
        let number = |i: usize| redis::from_redis_value::<u64>(value(i));
        let (old, version, changed, current) = (
            redis::from_redis_value::<String>(value(r::OLD)).map_err(|e| self.err(e.into()))?,
            number(r::VERSION).map_err(|e| self.err(e.into()))?,
            number(r::CHANGED).map_err(|e| self.err(e.into()))?,
            number(r::CURRENT).map_err(|e| self.err(e.into()))?,
        );
        Ok(match version {
            0 if read_at.is_some_and(|v| v > current) => SetOutcome::Unknown { current },
            0 => SetOutcome::Stale { changed },
            _ => SetOutcome::Written { old, version },
        })
    }

    /// The newest `count` audit entries, newest first.
    pub async fn history(&self, count: usize) -> Result<Vec<AuditEntry>, StoreError> {
        self.history_before(None, count).await
    }

    /// The `count` audit entries before entry `before` (exclusive; `None`:
    /// the newest), newest first: one page of a longer read.
    pub async fn history_before(
        &self,
        before: Option<&str>,
        count: usize,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let end = before.map_or("+".to_string(), |id| format!("({id}"));
        let reply: redis::streams::StreamRangeReply = self
            .conn
            .clone()
            .xrevrange_count(&self.audit, end, "-", count)
            .await
            .map_err(|e| self.err(e))?;
        Ok(reply
            .ids
            .into_iter()
            .map(|e| {
                let get = |k: &str| e.get::<String>(k).unwrap_or_default();
                AuditEntry {
                    actor: get("actor"),
                    field: get("field"),
                    old: get("old"),
                    new: get("new"),
                    version: get("version").parse().unwrap_or(0),
                    at_ms: get("at_ms").parse().unwrap_or(0),
                    id: e.id,
                }
            })
            .collect())
    }
}
