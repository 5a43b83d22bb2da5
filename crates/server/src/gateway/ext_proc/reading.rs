//! `[ext_proc]` in force, and what it reads off a request's headers and the
//! metadata Envoy forwards: the path's verdict (an LLM call or another
//! request) and the caller — tenant, user, session, tier, priority.

use crate::config::ext_proc::MAX_WAIT_MS;
use crate::config::{ExtProcSection, OtherRequests};
use crate::domain::{InvalidInput, Priority, SessionId, TenantId, UserId, is_tier_name};
use crate::engine::MAX_CANDIDATES;
use crate::envoy::config::core::v3::{HeaderMap, Metadata};
use prost_types::value::Kind;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The request header that sets how long a call may wait in line
/// (milliseconds), over `[ext_proc] max_wait_ms`.
pub const MAX_WAIT_HEADER: &str = "x-ctxbudget-max-wait-ms";

/// `[ext_proc]`, validated, as requests are read by it.
#[derive(Debug)]
pub struct Reading {
    /// The section as written.
    pub section: ExtProcSection,
}

/// The reading in force: replaced, like the limits, when the configuration
/// changes; streams in flight keep the one they started with.
#[derive(Debug)]
pub struct LiveReading(RwLock<Arc<Reading>>);

impl LiveReading {
    /// `section` (validated with the limits) in force.
    pub fn new(section: &ExtProcSection) -> Self {
        LiveReading(RwLock::new(Arc::new(Reading::from(section))))
    }

    /// The reading in force.
    pub fn get(&self) -> Arc<Reading> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `section` (validated with the limits) in force.
    pub fn replace(&self, section: &ExtProcSection) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Reading::from(section));
    }
}

impl From<&ExtProcSection> for Reading {
    fn from(section: &ExtProcSection) -> Self {
        Reading {
            section: section.clone(),
        }
    }
}

/// Who a request is for.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The tenant.
    pub tenant: TenantId,
    /// The user, if named.
    pub user: Option<UserId>,
    /// The session, if named.
    pub session: Option<SessionId>,
    /// The tier named, or the default.
    pub tier: String,
    /// The priority named, or normal.
    pub priority: Priority,
}

/// A request's headers, as the processor needs them.
#[derive(Debug, Default)]
pub struct RequestHead {
    /// `:path` without its query string.
    pub path: String,
    /// Every header, lower-case name → value (the first of repeated ones).
    headers: Vec<(String, String)>,
}

impl RequestHead {
    /// Reads Envoy's header map: values are in `raw_value` (older Envoys
    /// used `value`).
    pub fn from_map(map: Option<&HeaderMap>) -> Self {
        let headers: Vec<(String, String)> = map
            .map(|m| m.headers.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|h| (h.key.to_ascii_lowercase(), header_value(h)))
            .collect();
        let path = headers
            .iter()
            .find(|(k, _)| k == ":path")
            .map(|(_, v)| v.split(['?', '#']).next().unwrap_or_default().to_owned())
            .unwrap_or_default();
        RequestHead { path, headers }
    }

    /// The caller's trace context, from the request's W3C headers (when
    /// traces are on).
    pub fn trace_parent(&self) -> Option<crate::telemetry::traces::Parent> {
        crate::telemetry::traces::parent_from(|name| self.get(name).map(str::to_owned))
    }

    /// The value of header `name` (lower case), if sent.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A header map as Envoy sends one: each value in `raw_value` (what the
/// bench and the tests send, playing Envoy).
pub fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| crate::envoy::config::core::v3::HeaderValue {
                key: (*k).into(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// `path` with repeated slashes merged and a trailing one dropped.
fn normal(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    if out.len() > 1 && out.ends_with('/') {
        out.pop();
    }
    out
}

/// A header's value: `raw_value` when set, else `value`.
fn header_value(h: &crate::envoy::config::core::v3::HeaderValue) -> String {
    match h.raw_value.is_empty() {
        true => h.value.clone(),
        false => String::from_utf8_lossy(&h.raw_value).into_owned(),
    }
}

impl Reading {
    /// Whether `path` is an LLM call's: compared with repeated slashes
    /// merged and a trailing one dropped, as upstreams route them.
    pub fn is_llm_path(&self, path: &str) -> bool {
        let path = normal(path);
        self.section.paths.iter().any(|p| normal(p) == path)
    }

    /// What to do with other requests.
    pub fn other_requests(&self) -> OtherRequests {
        self.section.other_requests
    }

    /// The models to fall back to after `model`, from the fallback header
    /// (comma-separated, in order; `model` itself and repeats left out):
    /// empty when it names none, or when `fallback_header` is "" (off). At
    /// most 7, each a model name.
    pub fn fallbacks(&self, head: &RequestHead, model: &str) -> Result<Vec<String>, InvalidInput> {
        let header = &self.section.fallback_header;
        let Some(value) = head.get(header).filter(|_| !header.is_empty()) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<String> = Vec::new();
        for m in value.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            if m.len() > 256 || m.chars().any(char::is_control) {
                return Err(InvalidInput::new(
                    "fallback",
                    format!(
                        "header {header} names a model longer than 256 bytes or with control characters"
                    ),
                ));
            }
            if m != model && !out.iter().any(|o| o == m) {
                out.push(m.to_owned());
            }
        }
        if out.len() >= MAX_CANDIDATES {
            return Err(InvalidInput::new(
                "fallback",
                format!(
                    "header {header} names {} models; at most {} beside the body's",
                    out.len(),
                    MAX_CANDIDATES - 1
                ),
            ));
        }
        Ok(out)
    }

    /// How long the request may wait in line for the shared account: its
    /// [`MAX_WAIT_HEADER`] header, else `[ext_proc] max_wait_ms`.
    pub fn max_wait(&self, head: &RequestHead) -> Result<Duration, InvalidInput> {
        let Some(value) = head.get(MAX_WAIT_HEADER) else {
            return Ok(Duration::from_millis(self.section.max_wait_ms));
        };
        match value.trim().parse::<u64>() {
            Ok(ms) if ms <= MAX_WAIT_MS => Ok(Duration::from_millis(ms)),
            _ => Err(InvalidInput::new(
                "max_wait_ms",
                format!(
                    "header {MAX_WAIT_HEADER} is {:?}: send milliseconds, 0 to {MAX_WAIT_MS}",
                    value.chars().take(32).collect::<String>()
                ),
            )),
        }
    }

    /// The caller of a request: each value from the metadata namespace when
    /// it sets it (an ext_authz filter's verified identity), else from the
    /// header. A missing tenant, a tier with no default, or a malformed
    /// value is an error naming where it was read.
    pub fn caller(
        &self,
        head: &RequestHead,
        metadata: Option<&Metadata>,
    ) -> Result<Caller, InvalidInput> {
        let s = &self.section;
        let ns = metadata.and_then(|m| m.filter_metadata.get(&s.metadata_namespace));
        let from_metadata = |key: &str| {
            ns.and_then(|n| n.fields.get(key))
                .and_then(|v| match &v.kind {
                    Some(Kind::StringValue(s)) if !s.is_empty() => Some(s.as_str()),
                    _ => None,
                })
        };
        let read = |key: &'static str, header: &str| {
            from_metadata(key).or_else(|| head.get(header).filter(|v| !v.is_empty()))
        };
        let tenant = read("tenant", &s.tenant_header).ok_or_else(|| {
            InvalidInput::new(
                "tenant",
                format!(
                    "the request names no tenant: send the {} header (or have an ext_authz \
                     filter set `tenant` in the {} metadata)",
                    s.tenant_header, s.metadata_namespace
                ),
            )
        })?;
        let tenant = TenantId::parse(tenant)?;
        let user = read("user", &s.user_header)
            .map(UserId::parse)
            .transpose()?;
        let session = read("session", &s.session_header)
            .map(SessionId::parse)
            .transpose()?;
        let tier = self.tier(read("tier", &s.tier_header))?;
        let priority = match read("priority", &s.priority_header) {
            None => Priority::Normal,
            Some(p) => self.priority(p)?,
        };
        Ok(Caller {
            tenant,
            user,
            session,
            tier,
            priority,
        })
    }

    /// The tier named, or the default.
    fn tier(&self, named: Option<&str>) -> Result<String, InvalidInput> {
        let s = &self.section;
        match named {
            Some(t) if is_tier_name(t) => Ok(t.to_owned()),
            Some(t) => {
                let shown: String = t.chars().take(64).collect();
                Err(InvalidInput::new(
                    "tier",
                    format!(
                        "{shown:?} (header {}) is not a tier name (1-64 characters of a-z, A-Z, \
                         0-9, '-', '_', '.')",
                        s.tier_header
                    ),
                ))
            }
            None => s.default_tier.clone().ok_or_else(|| {
                InvalidInput::new(
                    "tier",
                    format!(
                        "the request names no tier and [ext_proc] has no default_tier: send the \
                         {} header, or set default_tier with `ctxbudget ext-proc set`",
                        s.tier_header
                    ),
                )
            }),
        }
    }

    /// A priority as named: critical, normal or batch, in any case.
    fn priority(&self, named: &str) -> Result<Priority, InvalidInput> {
        match named.trim().to_ascii_lowercase().as_str() {
            "critical" => Ok(Priority::Critical),
            "normal" => Ok(Priority::Normal),
            "batch" => Ok(Priority::Batch),
            _ => {
                let shown: String = named.chars().take(32).collect();
                Err(InvalidInput::new(
                    "priority",
                    format!(
                        "{shown:?} (header {}) is not a priority: send critical, normal or batch",
                        self.section.priority_header
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&str, &str)]) -> RequestHead {
        RequestHead::from_map(Some(&header_map(pairs)))
    }

    #[test]
    fn metadata_wins_over_headers_and_the_default_tier_fills_in() {
        let reading = Reading::from(&ExtProcSection {
            default_tier: Some("free".into()),
            ..ExtProcSection::default()
        });
        let h = head(&[
            (":path", "/v1/chat/completions?x=1"),
            ("x-tenant-id", "acme"),
            ("x-priority", "Batch"),
        ]);
        assert!(reading.is_llm_path(&h.path));
        assert!(reading.is_llm_path("//v1//chat/completions/"));
        assert!(!reading.is_llm_path("/v1/chat"));
        let c = reading.caller(&h, None).unwrap();
        assert_eq!((c.tenant.as_str(), c.tier.as_str()), ("acme", "free"));
        assert_eq!(c.priority, Priority::Batch);
        let mut ns = prost_types::Struct::default();
        ns.fields.insert(
            "tenant".into(),
            prost_types::Value {
                kind: Some(Kind::StringValue("verified".into())),
            },
        );
        let md = Metadata {
            filter_metadata: [("envoy.filters.http.ext_authz".to_owned(), ns)].into(),
            ..Metadata::default()
        };
        let c = reading.caller(&h, Some(&md)).unwrap();
        assert_eq!(c.tenant.as_str(), "verified");
    }

    #[test]
    fn a_missing_tenant_or_a_bad_priority_is_an_error_naming_the_header() {
        let reading = Reading::from(&ExtProcSection::default());
        let e = reading.caller(&head(&[]), None).unwrap_err();
        assert!(e.to_string().contains("x-tenant-id"), "{e}");
        let e = reading
            .caller(
                &head(&[
                    ("x-tenant-id", "a"),
                    ("x-tier", "pro"),
                    ("x-priority", "urgent"),
                ]),
                None,
            )
            .unwrap_err();
        assert!(e.to_string().contains("x-priority"), "{e}");
        let e = reading
            .caller(&head(&[("x-tenant-id", "a")]), None)
            .unwrap_err();
        assert!(e.to_string().contains("default_tier"), "{e}");
    }
}
