//! The configuration file as written: its sections, with serde's strictness
//! (unknown fields are errors). The settings sections of the listener, the
//! store and reservations are here; each other section has a file of its own
//! (limits, estimation, resilience, auth, overrides).

use super::{
    AuthSection, EstimatorSection, LevelSection, ModelSection, MoneySection, OverrideSection,
    PriceSection, PrioritiesSection, ResilienceSection, TierSection,
};
use crate::store::keys::DEFAULT_PREFIX;
use crate::store::redis::PoolKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// A configuration file as written. Every section is optional: a missing
/// section keeps the built-in default.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Listener settings.
    pub server: Option<ServerSection>,
    /// The HTTP/JSON API's listener.
    pub http: Option<HttpSection>,
    /// Where state lives.
    pub store: Option<StoreSection>,
    /// Lease and retention settings.
    pub reservations: Option<ReservationsSection>,
    /// Limits on all traffic.
    pub global: Option<LevelSection>,
    /// Model groups by name: per-model limits of the upstream account.
    pub models: Option<BTreeMap<String, ModelSection>>,
    /// Tiers by name.
    pub tiers: Option<BTreeMap<String, TierSection>>,
    /// The share of every limit each priority class must leave.
    pub priorities: Option<PrioritiesSection>,
    /// Prices per model group, USD per million tokens.
    pub prices: Option<BTreeMap<String, PriceSection>>,
    /// Money settings.
    pub money: Option<MoneySection>,
    /// Token counting and the adaptive estimator.
    pub estimator: Option<EstimatorSection>,
    /// Tenants' own limits, by tenant id.
    pub overrides: Option<BTreeMap<String, OverrideSection>>,
    /// What happens when the store fails.
    pub resilience: Option<ResilienceSection>,
    /// Who may call the service.
    pub auth: Option<AuthSection>,
    /// How Envoy's rate limit descriptors map to levels.
    pub envoy: Option<super::EnvoySection>,
    /// How Envoy's external processor reads requests.
    pub ext_proc: Option<super::ExtProcSection>,
    /// Where threshold alerts go.
    pub alerts: Option<super::AlertsSection>,
    /// Calls waiting in line for the shared account (`max_wait_ms`).
    pub queue: Option<QueueSection>,
    /// Where traces go.
    pub telemetry: Option<super::TelemetrySection>,
}

/// `[queue]`: the lines calls wait in for a shared level.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    /// Calls one shared level's line holds (1 to 100,000); a call that
    /// finds it full is answered at once.
    #[serde(default = "default_max_queued")]
    pub max_queued: usize,
}

impl Default for QueueSection {
    fn default() -> Self {
        QueueSection {
            max_queued: default_max_queued(),
        }
    }
}

/// The most calls a shared level's line holds by default.
pub const DEFAULT_MAX_QUEUED: usize = 1000;

fn default_max_queued() -> usize {
    DEFAULT_MAX_QUEUED
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
    /// Budget and Envoy calls worked on at once; more wait or are shed.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// How long a call waits for one of them to finish before it is shed (ms).
    #[serde(default = "default_queue_ms")]
    pub queue_ms: u64,
    /// The retry hint of a call shed (ms).
    #[serde(default = "default_shed_retry_ms")]
    pub shed_retry_ms: u64,
    /// HTTP/2 streams one connection may have open at once.
    #[serde(default = "default_max_concurrent_streams")]
    pub max_concurrent_streams: u32,
}

/// `[http]`: the HTTP/JSON API, the admin API and the console.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Where they listen; absent: no HTTP listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Serve plain HTTP even though gRPC serves TLS (a proxy in front ends
    /// TLS): without it, such a configuration is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plaintext: bool,
}

fn default_max_message_bytes() -> usize {
    16 * 1024 * 1024
}
fn default_max_in_flight() -> usize {
    512
}
fn default_queue_ms() -> u64 {
    5
}
fn default_shed_retry_ms() -> u64 {
    50
}
fn default_max_concurrent_streams() -> u32 {
    1024
}

/// `[store]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// Redis URL; absent or empty selects the in-memory store.
    #[serde(default)]
    pub redis_url: Option<String>,
    /// A Redis Cluster's seed nodes (`redis://host:port`, auth and TLS as for
    /// `redis_url`); non-empty selects the cluster instead of `redis_url`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_nodes: Vec<String>,
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
