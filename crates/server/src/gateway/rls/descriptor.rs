//! Rate limit descriptors — ordered key/value entries, the vocabulary of
//! Envoy's rate limit protocol — mapped to what a budget decision needs: the
//! tenant, user, session, tier and model a descriptor names, and whether it charges
//! usage that already happened (the response path) or asks before a request
//! goes upstream (the request path). The map is `[envoy]` (validated by
//! `config::envoy`); [`LiveMap`] holds the one in force.

use crate::config::EnvoySection;
use crate::domain::{InvalidInput, SessionId, TenantId, UserId};
use std::sync::{Arc, RwLock};

/// Which descriptor entries carry what (`[envoy]`, validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorMap {
    /// The rate limit domain served; `*` serves every domain. Requests for
    /// another domain are answered OK and counted, as envoyproxy/ratelimit
    /// answers a domain it has no configuration for.
    pub domain: String,
    /// The entry key that carries the tenant id.
    pub tenant: String,
    /// The entry key that carries the user id (optional in a descriptor).
    pub user: String,
    /// The entry key that carries the session id (optional in a descriptor).
    pub session: String,
    /// The entry key that carries the tier (optional: else `default_tier`).
    pub tier: String,
    /// The entry key that carries the model (optional: all-model limits only).
    pub model: String,
    /// The entry key whose value `response` marks a response-path charge.
    pub phase: String,
    /// The tier of descriptors without a tier entry; `None`: such a
    /// descriptor is an error.
    pub default_tier: Option<String>,
    /// Add `x-ratelimit-*` and `retry-after` headers to the responses.
    pub headers: bool,
    /// Entry keys that mark a descriptor whose path its hits tell: 0 is a
    /// request-path check, more a response-path charge of tokens (for proxies
    /// that send the same descriptor on both paths, such as Envoy Gateway's
    /// rules with a request cost of 0). May be the tenant key itself.
    pub response_keys: Vec<String>,
}

impl From<&EnvoySection> for DescriptorMap {
    fn from(section: &EnvoySection) -> Self {
        DescriptorMap {
            domain: section.domain.clone(),
            tenant: section.tenant.clone(),
            user: section.user.clone(),
            session: section.session.clone(),
            tier: section.tier.clone(),
            model: section.model.clone(),
            phase: section.phase.clone(),
            default_tier: section.default_tier.clone(),
            headers: section.headers,
            response_keys: section.response_keys.clone(),
        }
    }
}

/// The map in force: replaced, like the limits, when the configuration
/// changes; requests in flight keep the one they started with.
#[derive(Debug)]
pub struct LiveMap(RwLock<Arc<DescriptorMap>>);

impl LiveMap {
    /// `section` (validated with the limits) in force.
    pub fn new(section: &EnvoySection) -> Self {
        LiveMap(RwLock::new(Arc::new(section.into())))
    }

    /// The map in force.
    pub fn get(&self) -> Arc<DescriptorMap> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `section` (validated with the limits) in force.
    pub fn replace(&self, section: &EnvoySection) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(section.into());
    }
}

/// The value of the phase entry that marks a response-path charge.
pub const RESPONSE_PHASE: &str = "response";
/// The value of the phase entry that marks the request path (the default).
pub const REQUEST_PHASE: &str = "request";

/// What a descriptor names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described<'a> {
    /// The tenant.
    pub tenant: TenantId,
    /// The user, if the descriptor names one.
    pub user: Option<UserId>,
    /// The session, if the descriptor names one.
    pub session: Option<SessionId>,
    /// The tier the descriptor names, or the default.
    pub tier: &'a str,
    /// The model ('' when the descriptor names none).
    pub model: &'a str,
    /// Which path the call is on.
    pub path: Path,
}

/// Which of Envoy's two calls a descriptor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Before the request goes upstream: a check (hits 0) or a count.
    Request,
    /// After the response: the tokens it used.
    Response,
    /// Marked by a `response_keys` key: hits 0 a check, more the tokens used.
    ByHits,
}

impl Path {
    /// True when a call with `hits` charges tokens already spent.
    pub fn charges_usage(self, hits: u64) -> bool {
        match self {
            Path::Request => false,
            Path::Response => true,
            Path::ByHits => hits > 0,
        }
    }
}

/// A descriptor, mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mapping<'a> {
    /// No entry key maps to anything: nothing applies (answered OK).
    Unmapped,
    /// The budget levels it names.
    Budget(Described<'a>),
}

impl DescriptorMap {
    /// Whether this map serves `domain`.
    pub fn serves(&self, domain: &str) -> bool {
        self.domain == "*" || self.domain == domain
    }

    /// Maps one descriptor's entries. A descriptor naming a user, tier or
    /// model but no tenant, a key twice, an invalid id or an unknown phase is
    /// an error (`index` names the descriptor); one whose keys all map to
    /// nothing is [`Mapping::Unmapped`]. Entries with other keys are ignored.
    #[expect(
        clippy::too_many_lines,
        reason = "each descriptor entry's rule in the order Envoy sends them, read top to bottom"
    )]
    pub fn map<'a>(
        &'a self,
        index: usize,
        entries: &[(&'a str, &'a str)],
    ) -> Result<Mapping<'a>, InvalidInput> {
        let bad = |message: String| InvalidInput::new("descriptors", message);
        let mut found: [Option<&'a str>; 6] = [None; 6];
        let mut marked = false;
        for &(key, value) in entries {
            let slot = [
                &self.tenant,
                &self.user,
                &self.tier,
                &self.model,
                &self.phase,
                &self.session,
            ]
            .iter()
            .position(|k| k.as_str() == key);
            marked |= self.response_keys.iter().any(|k| k == key);
            let Some(slot) = slot else { continue };
            if found[slot].replace(value).is_some() {
                return Err(bad(format!(
                    "descriptor {index} has the entry {key:?} twice; send it once"
                )));
            }
        }
        let [tenant, user, tier, model, phase, session] = found;
        let Some(tenant) = tenant else {
            if let Some(key) = [
                (&self.user, user),
                (&self.session, session),
                (&self.tier, tier),
                (&self.model, model),
            ]
            .iter()
            .find_map(|(k, v)| v.map(|_| k.as_str()))
            {
                return Err(bad(format!(
                    "descriptor {index} has a {key:?} entry but no {:?} entry: budgets belong \
                     to a tenant; add the tenant entry to the rate limit actions",
                    self.tenant
                )));
            }
            return Ok(Mapping::Unmapped);
        };
        let at = |e: InvalidInput, key: &str| {
            bad(format!(
                "descriptor {index}, entry {key:?}: {} {}",
                e.field, e.message
            ))
        };
        let tenant = TenantId::parse(tenant).map_err(|e| at(e, &self.tenant))?;
        let user = user
            .filter(|u| !u.is_empty())
            .map(UserId::parse)
            .transpose()
            .map_err(|e| at(e, &self.user))?;
        let session = session
            .filter(|s| !s.is_empty())
            .map(SessionId::parse)
            .transpose()
            .map_err(|e| at(e, &self.session))?;
        let tier = match (tier.filter(|t| !t.is_empty()), &self.default_tier) {
            (Some(t), _) => t,
            (None, Some(d)) => d.as_str(),
            (None, None) => {
                return Err(bad(format!(
                    "descriptor {index} has no {:?} entry and [envoy] default_tier is not set; \
                     send the tier or set default_tier (`ctxbudget envoy set`)",
                    self.tier
                )));
            }
        };
        let path = match phase {
            None if marked => Path::ByHits,
            None | Some(REQUEST_PHASE) => Path::Request,
            Some(RESPONSE_PHASE) => Path::Response,
            Some(other) => {
                return Err(bad(format!(
                    "descriptor {index}: the {:?} entry is {other:?}; it is \"{RESPONSE_PHASE}\" \
                     on the response path, \"{REQUEST_PHASE}\" or absent on the request path",
                    self.phase
                )));
            }
        };
        Ok(Mapping::Budget(Described {
            tenant,
            user,
            session,
            tier,
            model: model.unwrap_or(""),
            path,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> DescriptorMap {
        DescriptorMap::from(&EnvoySection {
            default_tier: Some("free".into()),
            response_keys: vec!["tokens-rule".into()],
            ..EnvoySection::default()
        })
    }

    #[test]
    fn entries_name_the_scope_and_other_keys_are_ignored() {
        let m = map();
        let entries = [
            ("route", "chat"),
            ("tenant", "acme:{eu}"),
            ("user", "alice"),
            ("model", "gpt-4o"),
        ];
        let Mapping::Budget(d) = m.map(0, &entries).unwrap() else {
            panic!("mapped")
        };
        assert_eq!(d.tenant.as_str(), "acme:{eu}");
        assert_eq!(d.user.unwrap().as_str(), "alice");
        assert_eq!((d.tier, d.model, d.path), ("free", "gpt-4o", Path::Request));
        let response = [("tenant", "acme"), ("phase", "response")];
        assert!(matches!(m.map(0, &response), Ok(Mapping::Budget(d)) if d.path == Path::Response));
        let marked = [("tenant", "acme"), ("tokens-rule", "x")];
        let Ok(Mapping::Budget(d)) = m.map(0, &marked) else {
            panic!("mapped")
        };
        assert_eq!(d.path, Path::ByHits);
        assert!(!d.path.charges_usage(0), "hits 0 is a check");
        assert!(d.path.charges_usage(120), "more is tokens spent");
    }

    #[test]
    fn unmapped_and_malformed_descriptors() {
        let m = map();
        assert_eq!(
            m.map(0, &[("remote_address", "10.0.0.1")]),
            Ok(Mapping::Unmapped)
        );
        for (entries, says) in [
            (&[("user", "alice")][..], "no \"tenant\" entry"),
            (&[("tenant", "a"), ("tenant", "b")][..], "twice"),
            (&[("tenant", "")][..], "tenant"),
            (&[("tenant", "a\u{7}b")][..], "tenant"),
            (&[("tenant", "a"), ("phase", "later")][..], "\"later\""),
        ] {
            let e = m.map(3, entries).unwrap_err();
            assert!(e.message.contains("descriptor 3"), "{}", e.message);
            assert!(e.message.contains(says), "{says}: {}", e.message);
        }
        let no_default = DescriptorMap::from(&EnvoySection::default());
        let e = no_default.map(0, &[("tenant", "a")]).unwrap_err();
        assert!(e.message.contains("default_tier"), "{}", e.message);
    }
}
