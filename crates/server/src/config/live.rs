//! The live configuration (tiers, model groups, prices, global limits,
//! tenants' overrides, the `[envoy]` map and `[ext_proc]`) as sections: read from the JSON
//! documents `store::config_repo` keeps in Redis, and written back as them.

use super::{
    EnvoySection, ExtProcSection, FileConfig, LevelSection, LimitSections, ModelSection,
    OverrideSection, PriceSection, TierSection, build_limits,
};
use crate::domain::{Limits, LimitsError};
use crate::store::StoreError;
use crate::store::config_repo::{ConfigStore, Field, StoredConfig};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

/// Where a replica's live configuration is: Redis (read and written through
/// the admin API and the CLI) or its file (the in-memory store: read there,
/// changed by editing the file and sending SIGHUP).
#[derive(Clone)]
pub enum LiveDocs {
    /// The documents in Redis.
    Redis(Box<ConfigStore>),
    /// The file's documents in force.
    File(Arc<FileDocs>),
}

/// The configuration file's documents in force on a replica without Redis,
/// replaced when SIGHUP reloads the file. Their version counts the loads
/// applied (0: as started), so a reader's `ETag` changes when they do.
#[derive(Debug)]
pub struct FileDocs(RwLock<Arc<ConfigDoc>>);

impl FileDocs {
    /// The documents `file` writes, as started (version 0).
    pub fn new(file: ConfigDoc) -> Self {
        FileDocs(RwLock::new(Arc::new(ConfigDoc { version: 0, ..file })))
    }

    /// The documents in force.
    pub fn get(&self) -> Arc<ConfigDoc> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `file`'s documents in force; returns their version (one past
    /// the last).
    pub fn replace(&self, file: ConfigDoc) -> u64 {
        let mut now = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let version = now.version + 1;
        *now = Arc::new(ConfigDoc { version, ..file });
        version
    }
}

/// The configuration documents, as sections.
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
    /// How the external processor reads requests; `None`: the defaults.
    pub ext_proc: Option<ExtProcSection>,
}

impl ConfigDoc {
    /// The live configuration as `file` writes it: what seeds Redis when it
    /// holds none yet.
    pub fn written(file: &FileConfig) -> ConfigDoc {
        ConfigDoc {
            version: 0,
            global: file.global.clone(),
            models: file.models.clone().unwrap_or_default(),
            prices: file.prices.clone().unwrap_or_default(),
            tiers: file.tiers.clone().unwrap_or_default(),
            overrides: file.overrides.clone().unwrap_or_default(),
            envoy: file.envoy.clone(),
            ext_proc: file.ext_proc.clone(),
        }
    }

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
            ext_proc: self.ext_proc.as_ref(),
        }
    }

    /// The stored documents as sections. A document that does not parse is
    /// an error naming its field.
    pub fn from_stored(stored: StoredConfig) -> Result<ConfigDoc, StoreError> {
        fn parse<T: DeserializeOwned>(
            field: &Field,
            text: &str,
            source: &str,
        ) -> Result<T, StoreError> {
            serde_json::from_str(text).map_err(|e| {
                StoreError::Protocol(format!("{} in {source}: {e}", field.name()).into())
            })
        }
        let mut doc = ConfigDoc {
            version: stored.version,
            ..ConfigDoc::default()
        };
        let source = stored.source.as_str();
        for (field, text) in &stored.documents {
            match field {
                Field::Global => doc.global = Some(parse(field, text, source)?),
                Field::Envoy => doc.envoy = Some(parse(field, text, source)?),
                Field::ExtProc => doc.ext_proc = Some(parse(field, text, source)?),
                Field::Price(name) => {
                    doc.prices.insert(name.clone(), parse(field, text, source)?);
                }
                Field::Model(name) => {
                    doc.models.insert(name.clone(), parse(field, text, source)?);
                }
                Field::Tier(name) => {
                    doc.tiers.insert(name.clone(), parse(field, text, source)?);
                }
                Field::Override(tenant) => {
                    doc.overrides
                        .insert(tenant.clone(), parse(field, text, source)?);
                }
            }
        }
        Ok(doc)
    }

    /// Every document, as the store keeps it (what a seed writes).
    pub fn documents(&self) -> Vec<(Field, String)> {
        let mut out = Vec::new();
        out.extend(self.global.iter().map(|g| (Field::Global, document(g))));
        out.extend(
            self.models
                .iter()
                .map(|(n, m)| (Field::Model(n.clone()), document(m))),
        );
        out.extend(
            self.prices
                .iter()
                .map(|(n, p)| (Field::Price(n.clone()), document(p))),
        );
        out.extend(
            self.tiers
                .iter()
                .map(|(n, t)| (Field::Tier(n.clone()), document(t))),
        );
        out.extend((self.overrides.iter()).map(|(t, o)| (Field::Override(t.clone()), document(o))));
        out.extend(self.envoy.iter().map(|e| (Field::Envoy, document(e))));
        out.extend(self.ext_proc.iter().map(|e| (Field::ExtProc, document(e))));
        out
    }
}

/// A section as the JSON document stored for it.
pub fn document<T: Serialize>(section: &T) -> String {
    serde_json::to_string(section).expect("sections serialize")
}
