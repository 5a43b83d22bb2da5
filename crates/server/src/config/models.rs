//! Model groups and priorities as written.
//!
//! ```toml
//! [models.gpt-4o]
//! match = ["gpt-4o", "gpt-4o-2024-*"]
//! context_window = 128000
//! cached_input_counts = true
//! global = { requests = [{ limit = 10000, period = "1m" }], concurrency = 800 }
//!
//! [tiers.pro.models.gpt-4o]
//! tenant = { tokens = [{ limit = 2000000, period = "1m" }] }
//!
//! [priorities]
//! normal = 0.1
//! batch = 0.3
//! ```

use super::level::LevelSection;
use crate::domain::{LimitsError, ModelGroup, ModelLimits, Priorities};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `[models.<name>]`: one model group.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Glob patterns on the request's model.
    #[serde(rename = "match")]
    pub patterns: Vec<String>,
    /// Prompt + output may not exceed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// False: cached prompt tokens do not count toward `input_tokens`.
    #[serde(default = "yes")]
    pub cached_input_counts: bool,
    /// The group's limits over the whole upstream account.
    #[serde(default)]
    pub global: LevelSection,
}

fn yes() -> bool {
    true
}

impl ModelSection {
    /// The domain group `name`, its own rules checked.
    pub fn to_domain(&self, name: &str) -> Result<ModelGroup, LimitsError> {
        let path = format!("models.{name}");
        let group = ModelGroup {
            name: name.to_string(),
            patterns: self.patterns.clone(),
            context_window: self.context_window,
            cached_input_counts: self.cached_input_counts,
            global: self.global.to_domain(&format!("{path}.global"))?,
        };
        group.validate(&path)?;
        Ok(group)
    }
}

/// Written model groups as domain groups.
pub fn model_groups(
    sections: &BTreeMap<String, ModelSection>,
) -> Result<BTreeMap<String, Arc<ModelGroup>>, LimitsError> {
    sections
        .iter()
        .map(|(name, m)| Ok((name.clone(), Arc::new(m.to_domain(name)?))))
        .collect()
}

/// `[tiers.<t>.models.<group>]`: a tier's limits for one model group.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLimitsSection {
    /// Tenant-level limits of the group's traffic.
    #[serde(default)]
    pub tenant: LevelSection,
    /// User-level limits of the group's traffic.
    #[serde(default)]
    pub user: LevelSection,
    /// Session-level limits of the group's traffic.
    #[serde(default, skip_serializing_if = "LevelSection::is_empty")]
    pub session: LevelSection,
}

impl ModelLimitsSection {
    /// The domain limits; `path` names the section in errors.
    pub fn to_domain(&self, path: &str) -> Result<ModelLimits, LimitsError> {
        Ok(ModelLimits {
            tenant: self.tenant.to_domain(&format!("{path}.tenant"))?,
            user: self.user.to_domain(&format!("{path}.user"))?,
            session: self.session.to_domain(&format!("{path}.session"))?,
        })
    }
}

/// A tier's `models` table as domain limits; `path` names it in errors.
pub fn model_limits(
    path: &str,
    sections: &BTreeMap<String, ModelLimitsSection>,
) -> Result<BTreeMap<String, ModelLimits>, LimitsError> {
    sections
        .iter()
        .map(|(name, m)| Ok((name.clone(), m.to_domain(&format!("{path}.{name}"))?)))
        .collect()
}

/// `[priorities]`: the share of every limit each class must leave.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrioritiesSection {
    /// Headroom of critical requests (default 0).
    #[serde(default)]
    pub critical: f64,
    /// Headroom of normal requests, and of requests that name no priority.
    #[serde(default)]
    pub normal: f64,
    /// Headroom of batch requests.
    #[serde(default)]
    pub batch: f64,
}

impl PrioritiesSection {
    /// The validated priorities.
    pub fn to_domain(self) -> Result<Priorities, LimitsError> {
        let p = Priorities {
            critical: self.critical,
            normal: self.normal,
            batch: self.batch,
        };
        p.validate()?;
        Ok(p)
    }
}
