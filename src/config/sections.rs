//! The configuration file as written: every section and field, with serde's
//! strictness (unknown fields are errors), and the conversion of limits into
//! domain values.
//!
//! Size: one serde struct per section, kept together so the file reads as the
//! schema; it is just past 400 lines, and the split by section is issue 11's.

use super::OverrideSection;
use crate::domain::limits::Rate;
use crate::domain::{LevelLimits, Limits, LimitsError, ShadowLimits, Tier};
use crate::store::keys::DEFAULT_PREFIX;
use crate::store::redis::PoolKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// A configuration file as written. Every section is optional: a missing
/// section keeps the built-in default.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Listener settings.
    pub server: Option<ServerSection>,
    /// Where state lives.
    pub store: Option<StoreSection>,
    /// Lease and retention settings.
    pub reservations: Option<ReservationsSection>,
    /// Limits on all traffic.
    pub global: Option<LevelSection>,
    /// Tiers by name.
    pub tiers: Option<BTreeMap<String, TierSection>>,
    /// Token counting and the adaptive estimator.
    pub estimator: Option<EstimatorSection>,
    /// Tenants' own limits, by tenant id.
    pub overrides: Option<BTreeMap<String, OverrideSection>>,
    /// What happens when the store fails.
    pub resilience: Option<ResilienceSection>,
    /// Who may call the service.
    pub auth: Option<AuthSection>,
}

/// `[auth]`: the bearer tokens callers must present. No tokens: anyone who
/// can reach the listener may call (fine on a private network, nowhere else).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// Accepted tokens; during a rotation, list the new one beside the old.
    #[serde(default)]
    pub tokens: Vec<crate::api::auth::TokenSection>,
}

/// What the service does when the store cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Answer UNAVAILABLE: the gateway decides.
    FailClosed,
    /// Allow every request, flagged degraded.
    FailOpen,
    /// Decide from this replica's memory with every limit divided by the number
    /// of replicas, flagged degraded.
    #[default]
    Local,
}

impl FailurePolicy {
    /// The name as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::Local => "local",
        }
    }
}

/// `[resilience]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResilienceSection {
    /// What happens when the store cannot answer.
    #[serde(default)]
    pub policy: FailurePolicy,
    /// Replicas sharing the store: `local` divides every limit by this.
    #[serde(default = "one")]
    pub replicas: u64,
    /// The breaker's sliding window.
    #[serde(default = "default_breaker_window_ms")]
    pub breaker_window_ms: u64,
    /// Calls in the window before it may open.
    #[serde(default = "default_breaker_min_calls")]
    pub breaker_min_calls: u32,
    /// Failure share that opens it.
    #[serde(default = "default_breaker_failure_rate")]
    pub breaker_failure_rate: f64,
    /// How long it stays open before the store is probed (and between probes).
    #[serde(default = "default_breaker_cool_down_ms")]
    pub breaker_cool_down_ms: u64,
    /// Probe calls at once while half-open.
    #[serde(default = "default_breaker_probes")]
    pub breaker_probes: u32,
    /// Consecutive probe successes that close it.
    #[serde(default = "default_breaker_probes")]
    pub breaker_close_after: u32,
}

fn one() -> u64 {
    1
}
fn default_breaker_window_ms() -> u64 {
    10_000
}
fn default_breaker_min_calls() -> u32 {
    20
}
fn default_breaker_failure_rate() -> f64 {
    0.5
}
fn default_breaker_cool_down_ms() -> u64 {
    1_000
}
fn default_breaker_probes() -> u32 {
    3
}

/// `[estimator]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EstimatorSection {
    /// Encoding for models that are not OpenAI's.
    #[serde(default = "default_encoding")]
    pub default_encoding: crate::estimator::Encoding,
    /// Model patterns (`name` or `prefix*`) counted with the fast heuristic.
    #[serde(default)]
    pub fast_path: Vec<String>,
    /// Model pattern → estimator key: models whose samples are pooled. With
    /// the fast-path patterns and the built-in table's rows, the only
    /// estimator keys there are; other models share their encoding's key.
    #[serde(default)]
    pub groups: BTreeMap<String, String>,
    /// Samples kept per key.
    #[serde(default = "default_window")]
    pub window: usize,
    /// Samples needed before the P95 replaces the initial multiplier.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
    /// The multiplier until then.
    #[serde(default = "default_initial")]
    pub initial_multiplier: f64,
    /// Lowest multiplier.
    #[serde(default = "default_min_multiplier")]
    pub min_multiplier: f64,
    /// Highest multiplier.
    #[serde(default = "default_max_multiplier")]
    pub max_multiplier: f64,
    /// Long prompts counted at once (0: one per CPU).
    #[serde(default)]
    pub workers: usize,
}

impl EstimatorSection {
    /// The model rules, each group key and fast-path pattern checked: they
    /// become estimator keys, which reservation ids carry.
    pub fn model_rules(&self) -> Result<crate::estimator::ModelRules, LimitsError> {
        use crate::estimator::encoding::{Pattern, check_key};
        for (pattern, key) in &self.groups {
            check_key(pattern)
                .and_then(|()| check_key(key))
                .map_err(|p| LimitsError::new(format!("estimator.groups.{pattern:?}"), p))?;
        }
        for (i, pattern) in self.fast_path.iter().enumerate() {
            check_key(pattern)
                .map_err(|p| LimitsError::new(format!("estimator.fast_path[{i}]"), p))?;
        }
        Ok(crate::estimator::ModelRules {
            default_encoding: self.default_encoding,
            fast: self.fast_path.iter().map(|p| Pattern::new(p)).collect(),
            groups: self
                .groups
                .iter()
                .map(|(p, k)| (Pattern::new(p), k.clone()))
                .collect(),
        })
    }
}

fn default_encoding() -> crate::estimator::Encoding {
    crate::estimator::Encoding::O200kBase
}
fn default_window() -> usize {
    100
}
fn default_min_samples() -> usize {
    20
}
fn default_initial() -> f64 {
    1.15
}
fn default_min_multiplier() -> f64 {
    1.0
}
fn default_max_multiplier() -> f64 {
    3.0
}

/// `[server]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// Largest request accepted, in bytes; larger ones are refused.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// PEM certificate chain: serve gRPC over TLS (with `tls_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<std::path::PathBuf>,
    /// PEM CA bundle: require client certificates it signed (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<std::path::PathBuf>,
}

fn default_max_message_bytes() -> usize {
    16 * 1024 * 1024
}

/// `[store]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// Redis URL; absent or empty selects the in-memory store.
    #[serde(default)]
    pub redis_url: Option<String>,
    /// Prefix of every key.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// Connection strategy.
    #[serde(default)]
    pub pool: PoolKind,
    /// Connections (multiplexed) or pool size (deadpool).
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// Deadline of one store call.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// PEM CA of a `rediss://` server whose certificate no public root signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate, when Redis requires one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM key of `tls_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<std::path::PathBuf>,
}

fn default_prefix() -> String {
    DEFAULT_PREFIX.into()
}
fn default_connections() -> usize {
    4
}
fn default_timeout_ms() -> u64 {
    50
}

/// `[reservations]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationsSection {
    /// Lease length when a request names none.
    pub default_lease_ttl_ms: u64,
    /// Longest lease a request may ask for.
    pub max_lease_ttl_ms: u64,
    /// How long records outlive their lease or settlement.
    pub retention_ms: u64,
    /// How long an idempotency key is remembered.
    pub idempotency_ttl_ms: u64,
    /// Random jitter added to retry_after_ms.
    pub retry_jitter_ms: u64,
    /// Longest retry_after suggested for a full concurrency limit.
    pub concurrency_retry_ms: u64,
}

/// One rate as written: `{ limit = 60, period = "1m" }`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateSection {
    /// Units per period.
    pub limit: u64,
    /// `"30s"`, `"1m"`, `"1h"`, `"1d"` or seconds.
    pub period: Period,
}

/// A period as written: a number of seconds or a string with a unit.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Period {
    /// Seconds.
    Secs(u64),
    /// `"<n><s|m|h|d>"`.
    Text(String),
}

impl Period {
    /// The period in seconds, or what is wrong with it.
    pub fn seconds(&self) -> Result<u64, String> {
        match self {
            Period::Secs(s) => Ok(*s),
            Period::Text(t) => parse_period(t),
        }
    }
}

/// Parses `"90s"`, `"1m"`, `"2h"`, `"1d"` or a bare number of seconds.
pub fn parse_period(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a period like \"30s\", \"1m\", \"1h\" or \"1d\""))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?} has an unknown unit; use s, m, h or d")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// The limits of one level as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LevelSection {
    /// Request rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<RateSection>,
    /// Token rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<RateSection>,
    /// Requests in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
}

impl LevelSection {
    /// The domain limits; `path` names the section in errors.
    pub fn to_domain(&self, path: &str) -> Result<LevelLimits, LimitsError> {
        Ok(LevelLimits {
            requests: rates(&format!("{path}.requests"), &self.requests)?,
            tokens: rates(&format!("{path}.tokens"), &self.tokens)?,
            concurrency: self.concurrency,
        })
    }
}

/// Written rates as domain rates; `path` names the list in errors.
pub(crate) fn rates(path: &str, rates: &[RateSection]) -> Result<Vec<Rate>, LimitsError> {
    rates
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let period_secs = r
                .period
                .seconds()
                .map_err(|problem| LimitsError::new(format!("{path}[{i}].period"), problem))?;
            Ok(Rate {
                limit: r.limit,
                period_secs,
            })
        })
        .collect()
}

/// A tier as written.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TierSection {
    /// Prompt + output tokens above this are refused.
    pub max_context_tokens: u64,
    /// Output tokens reserved when a request names none.
    pub default_max_output_tokens: u64,
    /// Tenant-level limits.
    #[serde(default)]
    pub tenant: LevelSection,
    /// User-level limits.
    #[serde(default)]
    pub user: LevelSection,
    /// A stricter quota evaluated and reported but not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowSection>,
}

/// A quota in shadow: tenant- and user-level limits.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSection {
    /// Tenant-level limits.
    #[serde(default)]
    pub tenant: LevelSection,
    /// User-level limits.
    #[serde(default)]
    pub user: LevelSection,
}

impl ShadowSection {
    pub(crate) fn to_domain(&self, path: &str) -> Result<ShadowLimits, LimitsError> {
        Ok(ShadowLimits {
            tenant: self.tenant.to_domain(&format!("{path}.tenant"))?,
            user: self.user.to_domain(&format!("{path}.user"))?,
        })
    }
}

impl TierSection {
    /// The domain tier `name`, validated.
    pub fn to_domain(&self, name: &str) -> Result<Tier, LimitsError> {
        let path = format!("tiers.{name}");
        let tier = Tier {
            name: name.to_string(),
            tenant: self.tenant.to_domain(&format!("{path}.tenant"))?,
            user: self.user.to_domain(&format!("{path}.user"))?,
            max_context_tokens: self.max_context_tokens,
            default_max_output_tokens: self.default_max_output_tokens,
            shadow: self
                .shadow
                .as_ref()
                .map(|s| s.to_domain(&format!("{path}.shadow")))
                .transpose()?,
        };
        tier.validate(&path)?;
        Ok(tier)
    }
}

/// Validated limits from the written sections.
pub fn build_limits(
    global: Option<&LevelSection>,
    tiers: &BTreeMap<String, TierSection>,
    overrides: &BTreeMap<String, OverrideSection>,
    version: u64,
) -> Result<Limits, LimitsError> {
    let global = global.cloned().unwrap_or_default().to_domain("global")?;
    let mut limits = Limits {
        global,
        version,
        ..Limits::default()
    };
    for (name, t) in tiers {
        limits
            .tiers
            .insert(name.clone(), Arc::new(t.to_domain(name)?));
    }
    for (tenant, o) in overrides {
        limits
            .overrides
            .insert(tenant.clone(), Arc::new(o.to_domain(tenant)?));
    }
    limits.validate()?;
    Ok(limits)
}
