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
//! once. Callers validate documents before writing; replicas validate again on
//! load and keep their last good configuration if a document is bad. The key
//! and field names are built in `store::keys`.

use super::{
    EnvoySection, LevelSection, LimitSections, ModelSection, OverrideSection, PriceSection,
    TierSection, build_limits,
};
use crate::domain::{Limits, LimitsError};
use crate::store::StoreError;
use crate::store::keys::{config_audit, config_channel, config_field, config_hash};
use crate::store::redis::{Endpoint, RedisTls, SharedConn};
use crate::store::scripts;
use redis::{AsyncCommands, Script};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// `lua/config_seed.lua`, loaded once (NOSCRIPT reloads it).
static SEED: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CONFIG_SEED));
/// `lua/config_set.lua`, loaded once (NOSCRIPT reloads it).
static SET: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::CONFIG_SET));

/// Audit entries kept (approximately).
const AUDIT_KEEP: u64 = 10_000;

/// The configuration documents as stored.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConfigDoc {
    /// The version (0: never written).
    pub version: u64,
    /// Global limits.
    pub global: Option<LevelSection>,
    /// Model groups by name.
    pub models: BTreeMap<String, ModelSection>,
    /// Prices by model group.
    pub prices: BTreeMap<String, PriceSection>,
    /// Tiers by name.
    pub tiers: BTreeMap<String, TierSection>,
    /// Overrides by tenant id.
    pub overrides: BTreeMap<String, OverrideSection>,
    /// How Envoy's descriptors map to levels; `None`: the defaults.
    pub envoy: Option<EnvoySection>,
}

impl ConfigDoc {
    /// The validated limits these documents describe.
    pub fn limits(&self) -> Result<Limits, LimitsError> {
        build_limits(self.sections(), self.version)
    }

    /// The documents as the sections limits are built from.
    pub fn sections(&self) -> LimitSections<'_> {
        LimitSections {
            global: self.global.as_ref(),
            models: &self.models,
            prices: &self.prices,
            tiers: &self.tiers,
            overrides: &self.overrides,
            envoy: self.envoy.as_ref(),
        }
    }
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
        }
    }
}

impl Field {
    fn name(&self) -> String {
        match self {
            Field::Global => config_field::GLOBAL.into(),
            Field::Model(m) => config_field::model(m),
            Field::Price(m) => config_field::price(m),
            Field::Tier(t) => config_field::tier(t),
            Field::Override(t) => config_field::override_of(t),
            Field::Envoy => config_field::ENVOY.into(),
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

    /// Every document, as stored. A document that does not parse is an error
    /// naming its field.
    pub async fn load(&self) -> Result<ConfigDoc, StoreError> {
        let all: BTreeMap<String, String> = self
            .conn
            .clone()
            .hgetall(&self.hash)
            .await
            .map_err(|e| self.err(e))?;
        let mut doc = ConfigDoc::default();
        let bad = |field: &str, e: String| {
            StoreError::Protocol(format!("{field} in {}: {e}", self.hash).into())
        };
        for (field, value) in &all {
            if field == config_field::VERSION {
                doc.version = value
                    .parse()
                    .map_err(|_| bad(field, "not a number".into()))?;
            } else if field == config_field::GLOBAL {
                doc.global =
                    Some(serde_json::from_str(value).map_err(|e| bad(field, e.to_string()))?);
            } else if field == config_field::ENVOY {
                doc.envoy =
                    Some(serde_json::from_str(value).map_err(|e| bad(field, e.to_string()))?);
            } else if let Some(name) = config_field::as_price(field) {
                let price = serde_json::from_str(value).map_err(|e| bad(field, e.to_string()))?;
                doc.prices.insert(name.to_string(), price);
            } else if let Some(name) = config_field::as_model(field) {
                let model = serde_json::from_str(value).map_err(|e| bad(field, e.to_string()))?;
                doc.models.insert(name.to_string(), model);
            } else if let Some(name) = config_field::as_tier(field) {
                let tier = serde_json::from_str(value).map_err(|e| bad(field, e.to_string()))?;
                doc.tiers.insert(name.to_string(), tier);
            } else if let Some(tenant) = config_field::as_override(field) {
                let o = serde_json::from_str(value).map_err(|e| bad(field, e.to_string()))?;
                doc.overrides.insert(tenant.to_string(), o);
            }
        }
        Ok(doc)
    }

    /// Writes `doc`'s global limits, tiers and overrides if Redis holds no tier
    /// yet. Returns the new version, or `None` when Redis was already configured.
    pub async fn seed(&self, doc: &ConfigDoc, actor: &str) -> Result<Option<u64>, StoreError> {
        let mut inv = SEED.prepare_invoke();
        inv.key(&self.hash)
            .key(&self.audit)
            .arg(actor)
            .arg(&self.channel)
            .arg(AUDIT_KEEP);
        if let Some(g) = &doc.global {
            inv.arg(config_field::GLOBAL).arg(document(g));
        }
        for (name, m) in &doc.models {
            inv.arg(config_field::model(name)).arg(document(m));
        }
        for (name, p) in &doc.prices {
            inv.arg(config_field::price(name)).arg(document(p));
        }
        for (name, t) in &doc.tiers {
            inv.arg(config_field::tier(name)).arg(document(t));
        }
        for (tenant, o) in &doc.overrides {
            inv.arg(config_field::override_of(tenant)).arg(document(o));
        }
        if let Some(e) = &doc.envoy {
            inv.arg(config_field::ENVOY).arg(document(e));
        }
        let v: u64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.err(e))?;
        Ok((v > 0).then_some(v))
    }

    /// Sets (`Some`) or deletes (`None`) one document. Returns the previous
    /// document ('' if none) and the new version.
    pub async fn set(
        &self,
        field: &Field,
        document: Option<&str>,
        actor: &str,
    ) -> Result<(String, u64), StoreError> {
        let mut inv = SET.prepare_invoke();
        inv.key(&self.hash)
            .key(&self.audit)
            .arg(field.name())
            .arg(document.unwrap_or(""))
            .arg(actor)
            .arg(&self.channel)
            .arg(AUDIT_KEEP);
        let (old, version): (String, u64) = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.err(e))?;
        Ok((old, version))
    }

    /// The newest `count` audit entries, newest first.
    pub async fn history(&self, count: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let reply: redis::streams::StreamRangeReply = self
            .conn
            .clone()
            .xrevrange_count(&self.audit, "+", "-", count)
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

/// A section as the JSON document stored for it.
pub fn document<T: Serialize>(section: &T) -> String {
    serde_json::to_string(section).expect("sections serialize")
}
