//! The Redis store: state shared by every replica, changed only by the Lua
//! scripts in `lua/` (one EVALSHA per call, loaded at connect and on NOSCRIPT);
//! a Redis silent at start-up is no error: the breaker's probe checks it.
//!
//! This file owns the store type, its settings and its set-up. The rest:
//! - `client`: the URL and TLS files as a [`redis::Client`] ([`open_client`]),
//!   or the cluster's nodes as a cluster client ([`open_cluster_client`]).
//! - `endpoint`: one Redis or a cluster, and a shared connection to it, for
//!   the live configuration and the CLI.
//! - `pool`: multiplexed connections or a deadpool pool; PINGs for the probe.
//! - `verify`: the once-per-store checks (version, scripts) and the probe.
//! - `call`: one call under the store deadline, its error classified.
//! - `reserve`, `settle`, `charge`, `reads`: each operation's KEYS and ARGV, and its reply.
//! - `lease`: the global level's sync on a Redis Cluster (`store::cluster`).
//! - `errors`: Redis errors as store errors (transient, maybe applied, wrong settings).
//! - `wire`: the scripts' argument encoding and reply decoding.
//! - `alerts`: threshold alerts' arguments to the budget scripts, and the
//!   sender's calls on the queues.
//! - `line`: the lines of waiting calls (`lua/line.lua`) and their
//!   subscription.
//!
//! Size: the `Store` implementation is one impl block, each operation a line
//! handing over to its submodule.

mod alerts;
mod call;
mod charge;
mod client;
mod endpoint;
mod errors;
mod lease;
mod ledger;
mod line;
mod pool;
mod reads;
mod reserve;
mod settle;
pub(super) mod spec;
mod verify;
pub(super) mod wire;

pub use client::{RedisTls, open_client, open_cluster_client};
pub use endpoint::{Endpoint, SharedConn, cluster_masters};
pub use errors::redact_url;
pub use lease::{BucketAsk, EntryAsk, EntryGrant, LeaseCall, LeaseReply};
pub use pool::PoolKind;

use super::keys::Keys;
use super::{
    AlertBacklog, AlertDone, AlertStore, LedgerStore, QueuedAlert, RenewReply, ReserveReply,
    Retention, SampleStore, Scope, SettleReply, Settlement, Store, StoreError, Usage, scripts,
};
use crate::domain::budget::ledger::{LedgerRow, Period};
use crate::domain::budget::{ChargePlan, ChargeReply};
use crate::domain::layout;
use crate::domain::mix::EstimatorSample;
use crate::domain::{LevelPlan, Readings, ReservePlan, TenantId};
use pool::Connections;
use redis::Script;
use settle::SettleMode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// How to reach Redis.
#[derive(Clone, Debug)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]` or `rediss://` for TLS.
    pub url: String,
    /// Connection strategy.
    pub pool: PoolKind,
    /// Multiplexed connections, or the deadpool pool's maximum size.
    pub connections: usize,
    /// Deadline of one store call.
    pub timeout: Duration,
    /// Certificates for `rediss://` beyond the public roots.
    pub tls: RedisTls,
    /// A Redis Cluster's seed nodes (`redis://host:port`, auth and TLS as for
    /// `url`, which is then unused): non-empty selects cluster mode.
    pub cluster_nodes: Vec<String>,
}

impl RedisSettings {
    /// True when the settings name a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        !self.cluster_nodes.is_empty()
    }

    /// Where Redis is, passwords hidden: the URL, or the cluster's nodes.
    pub fn shown(&self) -> String {
        match self.is_cluster() {
            false => redact_url(&self.url),
            true => {
                let nodes: Vec<String> = self.cluster_nodes.iter().map(|n| redact_url(n)).collect();
                format!("Redis Cluster {}", nodes.join(","))
            }
        }
    }
}

/// Budget state in Redis.
pub struct RedisStore {
    connections: Arc<Connections>,
    keys: Keys,
    retention: Retention,
    timeout: Duration,
    reserve: Script,
    reserve_first: Script,
    settle: Script,
    renew: Script,
    status: Script,
    charge: Script,
    global_lease: Script,
    alert_claim: Script,
    alert_done: Script,
    alert_index: Script,
    line: Script,
    /// For the lines' subscription (one Redis only: none on a cluster).
    client: Option<redis::Client>,
    url: String,
    /// Redis answered the version check and loaded the scripts.
    verified: Arc<AtomicBool>,
}

impl RedisStore {
    /// Sets up the connections, then checks the Redis version and loads the
    /// scripts. Only wrong settings (a malformed URL, TLS files) and a Redis
    /// too old are errors: an unreachable Redis is not — the connections are
    /// made lazily and reconnect by themselves, [`RedisStore::reachable`] says
    /// false, and the first successful [`Store::probe`] does the checks.
    pub async fn connect(
        settings: &RedisSettings,
        keys: Keys,
        retention: Retention,
    ) -> Result<Self, StoreError> {
        let url = settings.shown();
        if settings.is_cluster() {
            let client = open_cluster_client(&settings.cluster_nodes, &settings.tls)?;
            let connections = Connections::cluster(&client, settings.timeout);
            return Self::with_connections(
                connections,
                settings,
                keys.clustered(),
                retention,
                url,
                None,
            )
            .await;
        }
        if settings.pool == PoolKind::Deadpool && !settings.tls.is_empty() {
            // deadpool-redis rebuilds its clients from the URL and would drop
            // the certificates: refuse rather than connect without them.
            return Err(StoreError::Settings(
                "[store] tls_ca/tls_cert/tls_key need pool = \"multiplexed\" (deadpool-redis \
                 cannot carry the certificates)"
                    .into(),
            ));
        }
        let client = open_client(&settings.url, &settings.tls)?;
        let connections = Connections::open(&client, settings, &url)?;
        Self::with_connections(connections, settings, keys, retention, url, Some(client)).await
    }

    /// The store on `connections`, checked as [`RedisStore::connect`] says.
    async fn with_connections(
        connections: Connections,
        settings: &RedisSettings,
        keys: Keys,
        retention: Retention,
        url: String,
        client: Option<redis::Client>,
    ) -> Result<Self, StoreError> {
        let store = RedisStore {
            connections: Arc::new(connections),
            keys,
            retention,
            timeout: settings.timeout,
            reserve: Script::new(scripts::RESERVE),
            reserve_first: Script::new(scripts::RESERVE_FIRST),
            settle: Script::new(scripts::SETTLE),
            renew: Script::new(scripts::RENEW),
            status: Script::new(scripts::STATUS),
            charge: Script::new(scripts::CHARGE),
            global_lease: Script::new(scripts::GLOBAL_LEASE),
            alert_claim: Script::new(scripts::ALERT_CLAIM),
            alert_done: Script::new(scripts::ALERT_DONE),
            alert_index: Script::new(scripts::ALERT_INDEX),
            line: Script::new(scripts::LINE),
            client,
            url,
            verified: Arc::new(AtomicBool::new(false)),
        };
        match store.verify().await {
            Ok(()) => {}
            Err(e) if e.is_transient() => tracing::warn!(
                error = %e,
                "Redis does not answer yet; serving by the failure policy until it does"
            ),
            Err(e) => return Err(e),
        }
        Ok(store)
    }

    /// The same store with its budget scripts reading the time (µs, a decimal
    /// integer) from the Redis string `clock_key` instead of Redis `TIME`: a
    /// clock a test moves by hand, so this store and a
    /// [`crate::store::memory::MemoryStore`] on a [`crate::domain::ManualClock`]
    /// see the same instants (the differential test). Never for serving: the
    /// scripts then read a key they are not given in `KEYS`.
    ///
    /// On a cluster each slot reads its own clock: `clock_key` followed by the
    /// hash tag of the script's first key (`suite:clock{g}`), which the test
    /// sets for every tag it uses.
    pub fn with_clock_key(mut self, clock_key: &str) -> Self {
        let cluster = self.keys.is_clustered();
        let clocked = |script: &str| {
            let clock = match cluster {
                false => format!(
                    "local function clock_us() return tonumber(redis.call('GET', '{clock_key}')) end"
                ),
                true => format!(
                    "local function clock_us() return tonumber(redis.call('GET', '{clock_key}' .. \
                     (string.match(KEYS[1], '{{[^}}]*}}') or ''))) end"
                ),
            };
            Script::new(&script.replacen(layout::SERVER_CLOCK, &clock, 1))
        };
        self.reserve = clocked(scripts::RESERVE);
        self.reserve_first = clocked(scripts::RESERVE_FIRST);
        self.settle = clocked(scripts::SETTLE);
        self.renew = clocked(scripts::RENEW);
        self.status = clocked(scripts::STATUS);
        self.charge = clocked(scripts::CHARGE);
        self.global_lease = clocked(scripts::GLOBAL_LEASE);
        self.alert_claim = clocked(scripts::ALERT_CLAIM);
        self.alert_done = clocked(scripts::ALERT_DONE);
        self.alert_index = clocked(scripts::ALERT_INDEX);
        self.line = clocked(scripts::LINE);
        self
    }
}

impl RedisStore {
    /// The keys this store uses.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }
}

impl Store for RedisStore {
    async fn reserve(&self, plan: &ReservePlan) -> Result<ReserveReply, StoreError> {
        self.reserve_call(plan).await
    }

    async fn reserve_first(&self, plans: &[ReservePlan]) -> Result<Vec<ReserveReply>, StoreError> {
        self.reserve_first_call(plans).await
    }

    async fn commit(&self, s: Settlement<'_>, usage: Usage) -> Result<SettleReply, StoreError> {
        self.settle_call(s, SettleMode::Commit, usage).await
    }

    async fn refund(&self, s: Settlement<'_>) -> Result<SettleReply, StoreError> {
        self.settle_call(s, SettleMode::Refund, Usage::new(0, 0))
            .await
    }

    async fn renew(&self, s: Settlement<'_>, ttl_ms: u64) -> Result<RenewReply, StoreError> {
        self.renew_call(s, ttl_ms).await
    }

    async fn status(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> Result<Readings, StoreError> {
        self.status_call(scope, levels, exact).await
    }

    async fn charge(&self, plan: &ChargePlan) -> Result<ChargeReply, StoreError> {
        self.charge_call(plan).await
    }

    fn shadow(&self) -> Self {
        RedisStore {
            connections: self.connections.clone(),
            keys: self.keys.shadow(),
            // Quotas in shadow keep no ledger: the enforced store's is the record.
            retention: Retention {
                ledger: None,
                alert_queue: 0,
                ..self.retention
            },
            timeout: self.timeout,
            reserve: self.reserve.clone(),
            reserve_first: self.reserve_first.clone(),
            settle: self.settle.clone(),
            renew: self.renew.clone(),
            status: self.status.clone(),
            charge: self.charge.clone(),
            global_lease: self.global_lease.clone(),
            alert_claim: self.alert_claim.clone(),
            alert_done: self.alert_done.clone(),
            alert_index: self.alert_index.clone(),
            line: self.line.clone(),
            client: self.client.clone(),
            url: self.url.clone(),
            verified: self.verified.clone(),
        }
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.probe_now().await
    }

    fn describe(&self) -> String {
        format!(
            "redis store at {} ({}, key prefix {:?})",
            self.url,
            self.connections.describe(),
            self.keys.prefix()
        )
    }
}

impl SampleStore for RedisStore {
    async fn estimator_samples(
        &self,
        keys: &[String],
    ) -> Result<Vec<Vec<EstimatorSample>>, StoreError> {
        self.samples_call(keys).await
    }

    async fn output_samples(
        &self,
        pairs: &[(String, String)],
    ) -> Result<Vec<Vec<u64>>, StoreError> {
        self.outputs_call(pairs).await
    }
}

impl LedgerStore for RedisStore {
    async fn ledger(
        &self,
        tenant: &TenantId,
        periods: &[Period],
    ) -> Result<Vec<Vec<LedgerRow>>, StoreError> {
        self.ledger_call(tenant, periods).await
    }

    async fn ledger_keys(&self, hourly: bool) -> Result<Vec<(TenantId, Period)>, StoreError> {
        self.ledger_keys_call(hourly).await
    }
}

impl AlertStore for RedisStore {
    async fn claim_alerts(
        &self,
        max: usize,
        claim_ms: u64,
    ) -> Result<Vec<QueuedAlert>, StoreError> {
        self.claim_alerts_call(max, claim_ms).await
    }

    async fn finish_alert(&self, alert: &QueuedAlert, done: AlertDone) -> Result<(), StoreError> {
        self.finish_alert_call(alert, done).await
    }

    async fn alert_backlog(&self) -> Result<AlertBacklog, StoreError> {
        self.alert_backlog_call().await
    }

    async fn reindex_alerts(&self) -> Result<usize, StoreError> {
        self.reindex_alerts_call().await
    }

    async fn note_alert(&self, line: String, keep: usize) -> Result<(), StoreError> {
        self.note_alert_call(line, keep).await
    }

    async fn recent_alerts(&self, n: usize) -> Result<Vec<String>, StoreError> {
        self.recent_alerts_call(n).await
    }
}

#[cfg(test)]
mod tests {
    //! Wrong settings are settings errors on every path to a connection: the
    //! client, the pools, and the lazy connection's first handshake (with no
    //! Redis listening, so nothing transient can hide them).
    use super::*;
    use crate::store::keys::DEFAULT_PREFIX;

    fn settings(url: &str, pool: PoolKind, tls: RedisTls) -> RedisSettings {
        RedisSettings {
            url: url.into(),
            pool,
            connections: 2,
            timeout: Duration::from_millis(200),
            tls,
            cluster_nodes: Vec::new(),
        }
    }

    async fn connect(settings: &RedisSettings) -> Result<RedisStore, StoreError> {
        let retention = Retention {
            record_ms: 1000,
            idempotency_ms: 1000,
            samples: 10,
            ledger: None,
            alert_queue: 0,
        };
        RedisStore::connect(settings, Keys::new(DEFAULT_PREFIX).unwrap(), retention).await
    }

    /// A local port nothing listens on.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    fn assert_settings(result: Result<RedisStore, StoreError>, says: &str) {
        match result {
            Err(e @ StoreError::Settings(_)) => assert!(e.to_string().contains(says), "{e}"),
            Err(e) => panic!("a settings error, not {e:?}"),
            Ok(_) => panic!("refused"),
        }
    }

    #[tokio::test]
    async fn a_malformed_url_or_a_missing_tls_file_is_a_settings_error() {
        for pool in [PoolKind::Multiplexed, PoolKind::Deadpool] {
            let bad_url = settings("redis://127.0.0.1:notaport/0", pool, RedisTls::default());
            assert_settings(connect(&bad_url).await, "invalid Redis URL");
        }
        let missing = RedisTls {
            ca: Some("/nonexistent/ca.pem".into()),
            ..RedisTls::default()
        };
        let url = format!("rediss://127.0.0.1:{}/0", closed_port());
        let tls = settings(&url, PoolKind::Multiplexed, missing.clone());
        assert_settings(connect(&tls).await, "cannot read the Redis TLS CA");
        let deadpool = settings(&url, PoolKind::Deadpool, missing);
        assert_settings(connect(&deadpool).await, "pool = \"multiplexed\"");
    }

    #[tokio::test]
    async fn an_unreachable_redis_is_no_error_but_a_key_that_is_not_the_certificates_is() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = format!("redis://127.0.0.1:{}/0", closed_port());
        let store = connect(&settings(&url, PoolKind::Multiplexed, RedisTls::default()))
            .await
            .expect("an unreachable Redis is no start-up error");
        assert!(!store.reachable());
        assert!(store.probe().await.is_err_and(|e| e.is_transient()));

        let dir = std::env::temp_dir().join(format!("ctxb-mismatch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["gateway".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let other_key = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.join("client.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("other.key"), other_key.serialize_pem()).unwrap();
        let mismatched = RedisTls {
            ca: None,
            cert: Some(dir.join("client.pem")),
            key: Some(dir.join("other.key")),
        };
        let url = format!("rediss://127.0.0.1:{}/0", closed_port());
        let result = connect(&settings(&url, PoolKind::Multiplexed, mismatched)).await;
        let _ = std::fs::remove_dir_all(&dir);
        assert_settings(result, "refused the service");
    }
}
