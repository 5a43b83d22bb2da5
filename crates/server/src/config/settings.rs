//! [`Settings`]: what the server runs with, built from a [`FileConfig`] and
//! flags. Each section is turned into its settings and checked by its own
//! function, in the file's order, so the first bad field is the one reported.

use super::input::within;
pub use super::server::{AdmissionSettings, TlsFiles};
use super::server::{admission, tls_files};
use super::{
    ConfigDoc, ConfigError, EnvoySection, FileConfig, Flags, ReservationsSection, StoreSection,
    TokenSection, read_token_files, validate_tokens,
};
use crate::domain::budget::ledger::LedgerRetention;
use crate::domain::plan::LeasePolicy;
use crate::domain::{Limits, LimitsError, Priorities};
use crate::engine::{BreakerSettings, FailurePolicy};
use crate::store::Retention;
use crate::store::redis::{PoolKind, RedisTls};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Validated settings the server runs with. `Debug` hides the Redis password.
#[derive(Clone)]
pub struct Settings {
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// The HTTP/JSON API's listen address; `None`: not served.
    pub http_listen: Option<SocketAddr>,
    /// Redis URL; `None` selects the in-memory store (unless `cluster_nodes`).
    pub redis_url: Option<String>,
    /// A Redis Cluster's seed nodes; non-empty selects the cluster.
    pub cluster_nodes: Vec<String>,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Redis connection strategy.
    pub pool: PoolKind,
    /// Redis connections.
    pub connections: usize,
    /// Certificates for `rediss://`.
    pub redis_tls: RedisTls,
    /// Deadline of one store call.
    pub store_timeout: Duration,
    /// Lease lengths.
    pub leases: LeasePolicy,
    /// Record and idempotency retention.
    pub retention: Retention,
    /// Random jitter added to retry_after_ms.
    pub retry_jitter_ms: u64,
    /// Longest retry_after suggested for a full concurrency limit.
    pub concurrency_retry_ms: u64,
    /// Every limit.
    pub limits: Arc<Limits>,
    /// How Envoy's descriptors map to levels (`[envoy]`).
    pub envoy: EnvoySection,
    /// How the external processor reads requests (`[ext_proc]`).
    pub ext_proc: super::ExtProcSection,
    /// The share of every limit each priority class must leave.
    pub priorities: Priorities,
    /// `[money] require_price`.
    pub require_price: bool,
    /// `[queue] max_queued`: calls one shared level's line holds.
    pub max_queued: usize,
    /// `[telemetry]`: where traces go (off without an endpoint).
    pub traces: crate::telemetry::traces::TraceSettings,
    /// `[alerts]`.
    pub alerts: super::AlertSettings,
    /// The configuration file read, if any (SIGHUP re-reads it).
    pub config_path: Option<PathBuf>,
    /// The live configuration as written: what seeds an empty Redis.
    pub seed: ConfigDoc,
    /// What happens when the store fails.
    pub policy: FailurePolicy,
    /// Replicas sharing the store (`local` divides limits by it).
    pub replicas: u64,
    /// The store's circuit breaker.
    pub breaker: BreakerSettings,
    /// Largest request accepted, in bytes.
    pub max_message_bytes: usize,
    /// How many calls are worked on at once, and what happens to the rest.
    pub admission: AdmissionSettings,
    /// Model rules for counting.
    pub models: crate::estimator::ModelRules,
    /// The adaptive multiplier.
    pub adaptive: crate::estimator::AdaptiveSettings,
    /// Long prompts counted at once.
    pub count_workers: usize,
    /// Tokens callers must present (empty: no authentication).
    pub tokens: Vec<TokenSection>,
    /// TLS for the gRPC listener.
    pub tls: Option<TlsFiles>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("http_listen", &self.http_listen)
            .field(
                "redis_url",
                &self
                    .redis_url
                    .as_deref()
                    .map(crate::store::redis::redact_url),
            )
            .field(
                "cluster_nodes",
                &self
                    .cluster_nodes
                    .iter()
                    .map(|n| crate::store::redis::redact_url(n))
                    .collect::<Vec<_>>(),
            )
            .field("key_prefix", &self.key_prefix)
            .field("pool", &self.pool)
            .field("connections", &self.connections)
            .field("redis_tls", &self.redis_tls)
            .field("store_timeout", &self.store_timeout)
            .field("leases", &self.leases)
            .field("retention", &self.retention)
            .field("limits", &self.limits)
            .field("tokens", &self.tokens)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl From<&Settings> for crate::telemetry::KnownSeries {
    fn from(settings: &Settings) -> Self {
        crate::telemetry::KnownSeries {
            tiers: settings.limits.tiers.keys().cloned().collect(),
            model_groups: settings.limits.models.keys().cloned().collect(),
            estimator_keys: settings
                .models
                .keys()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            initial_multiplier: settings.adaptive.initial,
            max_in_flight: settings.admission.max_in_flight,
        }
    }
}

const DAY_MS: u64 = 86_400_000;

/// Where state lives, as the store section and flags say.
struct StoreSettings {
    redis_url: Option<String>,
    cluster_nodes: Vec<String>,
    key_prefix: String,
}

impl FileConfig {
    /// Validated settings, with `overrides` applied last.
    #[expect(
        clippy::too_many_lines,
        reason = "every setting taken from its section in turn, one statement each"
    )]
    pub fn settings(self, overrides: Flags) -> Result<Settings, ConfigError> {
        let limits = self.limits()?;
        let priorities = self.priorities.unwrap_or_default().to_domain()?;
        let money = self.money.clone().unwrap_or_default();
        let (require_price, ledger) = (money.require_price, money.ledger()?);
        let alerts = self.alerts.clone().unwrap_or_default().settings()?;
        let seed = ConfigDoc::written(&self);
        let defaults = Self::built_in();
        let server = self.server.or(defaults.server).expect("built-in [server]");
        let store = self.store.or(defaults.store).expect("built-in [store]");
        let res = self
            .reservations
            .or(defaults.reservations)
            .expect("built-in [reservations]");
        let where_ = store_settings(&store, &overrides)?;
        check_reservations(&res)?;
        within(
            "server.max_message_bytes",
            server.max_message_bytes as u64,
            1024,
            1 << 30,
        )?;
        let est = self
            .estimator
            .or(defaults.estimator)
            .expect("built-in [estimator]");
        let adaptive = est.adaptive()?;
        let models = est.model_rules()?;
        let resilience = self
            .resilience
            .or(defaults.resilience)
            .expect("built-in [resilience]");
        let breaker = resilience.breaker()?;
        let tokens = read_token_files(self.auth.unwrap_or_default().tokens)?;
        validate_tokens(&tokens)?;
        let tls = tls_files(&server)?;
        let http_listen = overrides
            .http_listen
            .or_else(|| self.http.as_ref().and_then(|h| h.listen));
        if tls.is_some()
            && http_listen.is_some()
            && !self.http.as_ref().is_some_and(|h| h.allow_plaintext)
        {
            return Err(LimitsError::new(
                "http.listen",
                "gRPC serves TLS ([server] tls_cert) but the HTTP listener serves plain HTTP, \
                 tokens and all: put a TLS proxy in front of it and set [http] allow_plaintext \
                 = true, or leave the HTTP listener off",
            )
            .into());
        }
        Ok(Settings {
            listen: overrides.listen.unwrap_or(server.listen),
            http_listen,
            redis_url: where_.redis_url,
            cluster_nodes: where_.cluster_nodes,
            key_prefix: where_.key_prefix,
            pool: store.pool,
            connections: store.connections,
            store_timeout: Duration::from_millis(store.timeout_ms),
            redis_tls: RedisTls {
                ca: store.tls_ca,
                cert: store.tls_cert,
                key: store.tls_key,
            },
            leases: res.leases(),
            retention: res.retention(adaptive.samples_kept(), ledger, alerts.max_queued),
            retry_jitter_ms: res.retry_jitter_ms,
            concurrency_retry_ms: res.concurrency_retry_ms,
            limits: Arc::new(limits),
            envoy: self.envoy.clone().unwrap_or_default(),
            ext_proc: self.ext_proc.clone().unwrap_or_default(),
            priorities,
            require_price,
            max_queued: queue_settings(self.queue)?,
            traces: self
                .telemetry
                .clone()
                .unwrap_or_default()
                .traces(|name| std::env::var(name).ok())?,
            alerts,
            max_message_bytes: server.max_message_bytes,
            admission: admission(&server)?,
            config_path: None,
            seed,
            policy: resilience.policy,
            replicas: resilience.replicas,
            breaker,
            models,
            adaptive,
            count_workers: est.count_workers(),
            tokens,
            tls,
        })
    }
}

impl ReservationsSection {
    /// The lease lengths.
    fn leases(&self) -> LeasePolicy {
        LeasePolicy {
            default_ttl_ms: self.default_lease_ttl_ms,
            max_ttl_ms: self.max_lease_ttl_ms,
        }
    }

    /// How long records and idempotency keys are kept, `samples` estimator
    /// samples per key, the ledger's rows, and the alerts a tenant's queue holds.
    fn retention(
        &self,
        samples: usize,
        ledger: Option<LedgerRetention>,
        alert_queue: usize,
    ) -> Retention {
        Retention {
            record_ms: self.retention_ms,
            idempotency_ms: self.idempotency_ttl_ms,
            samples,
            ledger,
            alert_queue,
        }
    }
}

/// The Redis URL (flags first; empty selects memory) and key prefix, and the
/// store section's ranges.
fn store_settings(store: &StoreSection, overrides: &Flags) -> Result<StoreSettings, LimitsError> {
    let redis_url = overrides
        .redis_url
        .clone()
        .or_else(|| store.redis_url.clone())
        .filter(|u| !u.trim().is_empty());
    let cluster_nodes: Vec<String> = match overrides.redis_cluster_nodes.is_empty() {
        false => overrides.redis_cluster_nodes.clone(),
        true => store.cluster_nodes.clone(),
    };
    let cluster_nodes: Vec<String> = cluster_nodes
        .into_iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    if let Some(bad) = cluster_nodes
        .iter()
        .find(|n| !(n.starts_with("redis://") || n.starts_with("rediss://")))
    {
        return Err(LimitsError::new(
            "store.cluster_nodes",
            format!(
                "{} is not a redis:// or rediss:// URL",
                crate::store::redis::redact_url(bad)
            ),
        ));
    }
    let key_prefix = overrides
        .key_prefix
        .clone()
        .unwrap_or_else(|| store.key_prefix.clone());
    crate::store::keys::Keys::new(&key_prefix)
        .map_err(|problem| LimitsError::new("store.key_prefix", problem))?;
    within("store.timeout_ms", store.timeout_ms, 1, 60_000)?;
    within("store.connections", store.connections as u64, 1, 256)?;
    Ok(StoreSettings {
        redis_url,
        cluster_nodes,
        key_prefix,
    })
}

/// The `[reservations]` ranges.
fn check_reservations(res: &ReservationsSection) -> Result<(), LimitsError> {
    within(
        "reservations.max_lease_ttl_ms",
        res.max_lease_ttl_ms,
        1,
        DAY_MS,
    )?;
    within(
        "reservations.default_lease_ttl_ms",
        res.default_lease_ttl_ms,
        1,
        res.max_lease_ttl_ms,
    )?;
    within("reservations.retention_ms", res.retention_ms, 1, 7 * DAY_MS)?;
    within(
        "reservations.idempotency_ttl_ms",
        res.idempotency_ttl_ms,
        1,
        7 * DAY_MS,
    )?;
    within(
        "reservations.retry_jitter_ms",
        res.retry_jitter_ms,
        0,
        60_000,
    )?;
    within(
        "reservations.concurrency_retry_ms",
        res.concurrency_retry_ms,
        1,
        3_600_000,
    )
}

/// `[queue] max_queued`, checked: 1 to 100,000.
fn queue_settings(queue: Option<super::QueueSection>) -> Result<usize, ConfigError> {
    let max = queue.unwrap_or_default().max_queued;
    if !(1..=100_000).contains(&max) {
        return Err(ConfigError::Invalid(crate::domain::LimitsError::new(
            "queue.max_queued",
            format!("is {max}; a line holds 1 to 100000 calls"),
        )));
    }
    Ok(max)
}
