//! `[envoy]`: how Envoy's rate limit descriptors name a budget's levels.
//! Live in Redis like the limits (`ctxbudget envoy get|set`); see docs/envoy.md.
//!
//! ```toml
//! [envoy]
//! domain = "llm"          # "*": every domain
//! tenant = "tenant"       # the entry key that carries the tenant id
//! user = "user"           # optional in a descriptor
//! session = "session"     # optional: the session level (an agent run)
//! tier = "tier"           # optional: else default_tier
//! model = "model"         # optional
//! phase = "phase"         # "response" marks the response-path charge
//! default_tier = "free"
//! headers = true          # x-ratelimit-* and retry-after in the response
//! response_keys = []      # keys marking a descriptor whose hits are always tokens spent
//! ```

use crate::domain::LimitsError;
use serde::{Deserialize, Serialize};

/// `[envoy]` as written; every key has a default. Validated with the limits
/// ([`super::build_limits`]); `gateway::rls` maps descriptors by it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvoySection {
    /// The rate limit domain served; `*` serves every domain. Requests for
    /// another domain are answered OK and counted, as envoyproxy/ratelimit
    /// answers a domain it has no configuration for.
    pub domain: String,
    /// The entry key that carries the tenant id.
    pub tenant: String,
    /// The entry key that carries the user id (optional in a descriptor).
    pub user: String,
    /// The entry key that carries the session id (optional in a descriptor).
    /// Left out when stored as the default, so replicas of the release
    /// before sessions still read the section.
    #[serde(skip_serializing_if = "is_default_session")]
    pub session: String,
    /// The entry key that carries the tier (optional: else `default_tier`).
    pub tier: String,
    /// The entry key that carries the model (optional: all-model limits only).
    pub model: String,
    /// The entry key whose value `response` marks a response-path charge.
    pub phase: String,
    /// The tier of descriptors without a tier entry; `None`: such a
    /// descriptor is an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_tier: Option<String>,
    /// Add `x-ratelimit-*` and `retry-after` headers to the responses.
    pub headers: bool,
    /// Entry keys that mark a descriptor whose path its hits tell: 0 is a
    /// request-path check, more a response-path charge of tokens (for proxies
    /// that send the same descriptor on both paths, such as Envoy Gateway's
    /// rules with a request cost of 0). May be the tenant key itself.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub response_keys: Vec<String>,
}

impl Default for EnvoySection {
    fn default() -> Self {
        EnvoySection {
            domain: "llm".into(),
            tenant: "tenant".into(),
            user: "user".into(),
            session: "session".into(),
            tier: "tier".into(),
            model: "model".into(),
            phase: "phase".into(),
            default_tier: None,
            headers: true,
            response_keys: Vec::new(),
        }
    }
}

fn is_default_session(key: &str) -> bool {
    key == "session"
}

impl EnvoySection {
    /// Checks the map: keys non-empty and distinct; the domain non-empty. (The
    /// default tier is checked against the tiers by [`super::build_limits`].)
    pub fn validate(&self) -> Result<(), LimitsError> {
        let bad =
            |name: &str, problem: String| Err(LimitsError::new(format!("envoy.{name}"), problem));
        if self.domain.is_empty() {
            return bad(
                "domain",
                "must not be empty (\"*\" serves every domain)".into(),
            );
        }
        let keys = [
            ("tenant", &self.tenant),
            ("user", &self.user),
            ("session", &self.session),
            ("tier", &self.tier),
            ("model", &self.model),
            ("phase", &self.phase),
        ];
        for (i, (name, key)) in keys.iter().enumerate() {
            if key.is_empty() {
                return bad(name, "must name a descriptor entry key".into());
            }
            if let Some((other, _)) = keys[..i].iter().find(|(_, k)| k == key) {
                return bad(
                    name,
                    format!("is {key:?} like envoy.{other}: each names a different entry"),
                );
            }
        }
        if self.response_keys.iter().any(String::is_empty) {
            return bad("response_keys", "must not hold an empty key".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_session_key_is_not_stored() {
        let stored = serde_json::to_string(&EnvoySection::default()).unwrap();
        assert!(!stored.contains("session"), "{stored}");
        let named = EnvoySection {
            session: "run".into(),
            ..EnvoySection::default()
        };
        let stored = serde_json::to_string(&named).unwrap();
        let back: EnvoySection = serde_json::from_str(&stored).unwrap();
        assert_eq!(back, named);
    }

    #[test]
    fn a_map_needs_distinct_keys() {
        let clash = EnvoySection {
            user: "tenant".into(),
            ..EnvoySection::default()
        };
        assert_eq!(clash.validate().unwrap_err().field, "envoy.user");
        assert!(EnvoySection::default().validate().is_ok());
        let empty = EnvoySection {
            domain: String::new(),
            ..EnvoySection::default()
        };
        assert!(empty.validate().is_err());
    }
}
