//! `[ext_proc]`: how Envoy's external processor finds the caller and which
//! requests are LLM calls. Live in Redis like the limits (`ctxbudget ext-proc
//! get|set`); see docs/ext_proc.md.
//!
//! ```toml
//! [ext_proc]
//! tenant_header = "x-tenant-id"
//! user_header = "x-user-id"        # optional on a request
//! session_header = "x-session-id"  # optional: the session level (an agent run)
//! tier_header = "x-tier"           # optional: else default_tier
//! priority_header = "x-priority"   # critical, normal (the default) or batch
//! fallback_header = "x-fallback-models"  # models to fall back to, comma-separated
//! default_tier = "free"
//! paths = ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
//! other_requests = "pass"          # or "deny": other paths, bodies that are no LLM call
//! metadata_namespace = "envoy.filters.http.ext_authz"  # read before the headers
//! headers = true                   # x-ratelimit-* on answers and denials
//! stream_usage = true              # ask OpenAI chat streams for their usage chunk
//! max_wait_ms = 0                  # wait in line for the shared account (docs/queue.md)
//! ```

use crate::domain::LimitsError;
use serde::{Deserialize, Serialize};

/// What the processor does with a request that is no LLM call it knows: on
/// another path, or whose body is not one of the APIs it reads.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OtherRequests {
    /// Let it through untouched, charging nothing.
    #[default]
    Pass,
    /// Refuse it: 404 for another path, 400 for a body it cannot read.
    Deny,
}

/// `[ext_proc]` as written; every key has a default. Validated with the
/// limits ([`super::build_limits`]); `gateway::ext_proc` reads requests by it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ExtProcSection {
    /// The request header that carries the tenant id.
    pub tenant_header: String,
    /// The request header that carries the user id (optional on a request).
    pub user_header: String,
    /// The request header that carries the session id (an agent run, a
    /// trace; optional on a request): the tier's session limits apply to it.
    /// Left out when stored as the default, so replicas of the release
    /// before sessions still read the section.
    #[serde(skip_serializing_if = "is_default_session_header")]
    pub session_header: String,
    /// The request header that carries the tier (optional: else `default_tier`).
    pub tier_header: String,
    /// The request header that carries the priority: `critical`, `normal`
    /// (when absent) or `batch`.
    pub priority_header: String,
    /// The request header that names models to fall back to, in order,
    /// comma-separated: the first of the body's model and these with room
    /// is reserved, and the body's model rewritten to it. "": off.
    pub fallback_header: String,
    /// The tier of requests without a tier header; `None`: such a request is
    /// refused (400).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_tier: Option<String>,
    /// The request paths that are LLM calls (the query string ignored).
    pub paths: Vec<String>,
    /// Requests on other paths, or whose body is no LLM call: `pass` or `deny`.
    pub other_requests: OtherRequests,
    /// The dynamic metadata namespace (in the `metadata_context` Envoy
    /// forwards) whose `tenant`, `user`, `session`, `tier` and `priority` fields, when
    /// set, take precedence over the headers: where an ext_authz filter puts
    /// the identity it verified.
    pub metadata_namespace: String,
    /// Add `x-ratelimit-*` headers to answers and denials (docs/http.md).
    pub headers: bool,
    /// Ask streamed OpenAI chat completions for their final usage chunk
    /// (`stream_options.include_usage`) when the caller did not, so the
    /// stream commits the provider's count.
    pub stream_usage: bool,
    /// How long a call may wait in line when only the shared account
    /// denies it (docs/queue.md); a request's `x-ctxbudget-max-wait-ms`
    /// header sets its own. 0: answer at once. Left out when 0, so replicas
    /// of the release before waiting still read the section.
    #[serde(skip_serializing_if = "is_zero")]
    pub max_wait_ms: u64,
}

fn is_zero(ms: &u64) -> bool {
    *ms == 0
}

/// The longest wait in line (`max_wait_ms`, or the request's header).
pub const MAX_WAIT_MS: u64 = 60_000;

/// The default LLM paths: OpenAI chat completions, OpenAI Responses,
/// Anthropic messages.
pub const DEFAULT_PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/responses", "/v1/messages"];

impl Default for ExtProcSection {
    fn default() -> Self {
        ExtProcSection {
            tenant_header: "x-tenant-id".into(),
            user_header: "x-user-id".into(),
            session_header: "x-session-id".into(),
            tier_header: "x-tier".into(),
            priority_header: "x-priority".into(),
            fallback_header: "x-fallback-models".into(),
            default_tier: None,
            paths: DEFAULT_PATHS.iter().map(|p| (*p).to_owned()).collect(),
            other_requests: OtherRequests::Pass,
            metadata_namespace: "envoy.filters.http.ext_authz".into(),
            headers: true,
            stream_usage: true,
            max_wait_ms: 0,
        }
    }
}

fn is_default_session_header(header: &str) -> bool {
    header == "x-session-id"
}

impl ExtProcSection {
    /// Checks the section: header names non-empty, lower-case HTTP tokens and
    /// distinct; paths absolute. (The default tier is checked against the
    /// tiers by [`super::build_limits`].)
    pub fn validate(&self) -> Result<(), LimitsError> {
        let bad = |name: &str, problem: String| {
            Err(LimitsError::new(format!("ext_proc.{name}"), problem))
        };
        if self.max_wait_ms > MAX_WAIT_MS {
            return bad(
                "max_wait_ms",
                format!("is {}; at most {MAX_WAIT_MS} (a minute)", self.max_wait_ms),
            );
        }
        let headers = [
            ("tenant_header", &self.tenant_header),
            ("user_header", &self.user_header),
            ("session_header", &self.session_header),
            ("tier_header", &self.tier_header),
            ("priority_header", &self.priority_header),
            ("fallback_header", &self.fallback_header),
        ];
        for (i, (name, header)) in headers.iter().enumerate() {
            if *name == "fallback_header" && header.is_empty() {
                continue; // off
            }
            let token = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c);
            if header.is_empty() || !header.chars().all(token) {
                return bad(
                    name,
                    format!(
                        "{header:?} is not a header name: use lower case letters, digits, '-', \
                         '_' and '.' (Envoy sends header names in lower case)"
                    ),
                );
            }
            if let Some((other, _)) = headers[..i].iter().find(|(_, h)| h == header) {
                return bad(
                    name,
                    format!("is {header:?} like ext_proc.{other}: each names a different header"),
                );
            }
        }
        if let Some(p) = self.paths.iter().find(|p| !p.starts_with('/')) {
            return bad(
                "paths",
                format!("{p:?} is not a path: each must start with '/'"),
            );
        }
        if self.metadata_namespace.is_empty() {
            return bad(
                "metadata_namespace",
                "must name a dynamic metadata namespace (e.g. envoy.filters.http.ext_authz)".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_must_be_distinct_lower_case_names_and_paths_absolute() {
        assert!(ExtProcSection::default().validate().is_ok());
        let clash = ExtProcSection {
            user_header: "x-tenant-id".into(),
            ..ExtProcSection::default()
        };
        assert_eq!(clash.validate().unwrap_err().field, "ext_proc.user_header");
        let upper = ExtProcSection {
            tier_header: "X-Tier".into(),
            ..ExtProcSection::default()
        };
        assert_eq!(upper.validate().unwrap_err().field, "ext_proc.tier_header");
        let relative = ExtProcSection {
            paths: vec!["v1/chat/completions".into()],
            ..ExtProcSection::default()
        };
        assert_eq!(relative.validate().unwrap_err().field, "ext_proc.paths");
    }

    #[test]
    fn the_default_session_header_is_not_stored() {
        let stored = serde_json::to_string(&ExtProcSection::default()).unwrap();
        assert!(!stored.contains("session"), "{stored}");
        let back: ExtProcSection = serde_json::from_str(&stored).unwrap();
        assert_eq!(back.session_header, "x-session-id");
    }

    #[test]
    fn other_requests_reads_pass_or_deny() {
        let s: ExtProcSection = toml::from_str("other_requests = \"deny\"").unwrap();
        assert_eq!(s.other_requests, OtherRequests::Deny);
        assert!(toml::from_str::<ExtProcSection>("other_requests = \"drop\"").is_err());
    }
}
