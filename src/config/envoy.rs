//! `[envoy]`: how Envoy's rate limit descriptors name a budget's levels.
//! Live in Redis like the limits (`ctxbudget envoy get|set`); see docs/envoy.md.
//!
//! ```toml
//! [envoy]
//! domain = "llm"          # "*": every domain
//! tenant = "tenant"       # the entry key that carries the tenant id
//! user = "user"           # optional in a descriptor
//! tier = "tier"           # optional: else default_tier
//! model = "model"         # optional
//! phase = "phase"         # "response" marks the response-path charge
//! default_tier = "free"
//! headers = true          # x-ratelimit-* and retry-after in the response
//! response_keys = []      # keys marking a descriptor whose hits are always tokens spent
//! ```

use crate::domain::LimitsError;
use crate::domain::descriptor::DescriptorMap;
use serde::{Deserialize, Serialize};

/// `[envoy]` as written; every key has a default.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvoySection {
    /// The rate limit domain served ("*": all).
    pub domain: String,
    /// The tenant's entry key.
    pub tenant: String,
    /// The user's entry key.
    pub user: String,
    /// The tier's entry key.
    pub tier: String,
    /// The model's entry key.
    pub model: String,
    /// The phase entry's key.
    pub phase: String,
    /// The tier of descriptors without a tier entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_tier: Option<String>,
    /// Rate limit headers in the responses.
    pub headers: bool,
    /// Keys that mark a response-path descriptor.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub response_keys: Vec<String>,
}

impl Default for EnvoySection {
    fn default() -> Self {
        let d = DescriptorMap::default();
        EnvoySection {
            domain: d.domain,
            tenant: d.tenant,
            user: d.user,
            tier: d.tier,
            model: d.model,
            phase: d.phase,
            default_tier: d.default_tier,
            headers: d.headers,
            response_keys: d.response_keys,
        }
    }
}

impl EnvoySection {
    /// The validated map (the default tier is checked against the tiers with
    /// the rest of the limits).
    pub fn to_domain(&self) -> Result<DescriptorMap, LimitsError> {
        let map = DescriptorMap {
            domain: self.domain.clone(),
            tenant: self.tenant.clone(),
            user: self.user.clone(),
            tier: self.tier.clone(),
            model: self.model.clone(),
            phase: self.phase.clone(),
            default_tier: self.default_tier.clone(),
            headers: self.headers,
            response_keys: self.response_keys.clone(),
        };
        map.validate("envoy")
            .map_err(|(field, problem)| LimitsError::new(field, problem))?;
        Ok(map)
    }
}
