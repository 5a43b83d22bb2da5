//! The Redis store: state shared by every replica, changed only by the Lua
//! scripts in `lua/`, one EVALSHA per call.
//!
//! Connections: by default a few multiplexed [`ConnectionManager`]s, used round
//! robin. Each pipelines every concurrent call onto one socket and reconnects by
//! itself after Redis restarts. The alternative, a deadpool-redis pool
//! (`pool = "deadpool"`), checks every connection out with a PING, one extra round
//! trip per call; `ctxbudget bench` measures both. Scripts are loaded at connect
//! time and re-loaded transparently on NOSCRIPT (Redis restarted or flushed) by
//! [`redis::Script::invoke_async`]. A Redis that does not answer at start-up
//! is no error: connections are made lazily and the breaker's probe checks it.
//!
//! - [`errors`]: Redis errors as store errors (transient, maybe applied, wrong settings).
//! - [`wire`]: the scripts' argument encoding and reply decoding.
//!
//! Size: still past 400 lines — connection set-up and the `Store`
//! implementation share this file until issue 11 splits them along their jobs.

mod errors;
mod wire;

pub use errors::redact_url;

use super::keys::{Keys, lease_field};
use super::state;
use super::{
    Reclaimed, RenewReply, ReserveReply, Retention, Scope, SettleReply, Settled, Settlement, Store,
    StoreError, scripts,
};
use crate::domain::budget::layout;
use crate::domain::{LevelPlan, Readings, ReservePlan};
use errors::{Classify, classify, classify_answered, pool_error};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, RedisError, Script, ScriptInvocation, Value};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use wire::{DOUBLES, Spec, doubles, int_at, record_tail, state_at, string_at, unexpected};

/// How the service holds its Redis connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// Multiplexed connections that pipeline concurrent calls (the default).
    #[default]
    Multiplexed,
    /// A deadpool-redis pool: one call per connection at a time.
    Deadpool,
}

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
}

/// PEM files for `rediss://`: a private CA, and a client certificate when
/// Redis requires one (`tls-auth-clients yes`). Without them, `rediss://`
/// trusts the public (webpki) roots.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct RedisTls {
    /// CA that signed Redis's certificate.
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate.
    pub cert: Option<std::path::PathBuf>,
    /// Its private key.
    pub key: Option<std::path::PathBuf>,
}

impl RedisTls {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

/// A client for `url` with TCP_NODELAY and `tls`'s certificates. Errors name
/// the URL with its password hidden.
pub fn open_client(url: &str, tls: &RedisTls) -> Result<redis::Client, StoreError> {
    let shown = redact_url(url);
    let invalid =
        |e: &dyn std::fmt::Display| StoreError::Settings(format!("invalid Redis URL {shown}: {e}"));
    // TCP_NODELAY: redis-rs leaves Nagle on, and pipelined calls then stall
    // on delayed ACKs (tens of ms at p99 under light load).
    let info = url.into_connection_info().map_err(|e| invalid(&e))?;
    let nodelay = info.tcp_settings().clone().set_nodelay(true);
    let info = info.set_tcp_settings(nodelay);
    if tls.is_empty() {
        return redis::Client::open(info).map_err(|e| invalid(&e));
    }
    if !url.starts_with("rediss://") {
        return Err(StoreError::Settings(format!(
            "TLS files are configured but {shown} is not a rediss:// URL"
        )));
    }
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            StoreError::Settings(format!(
                "cannot read the Redis TLS {what} {}: {e}",
                path.display()
            ))
        })
    };
    let client_tls = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read("certificate", cert)?,
            client_key: read("key", key)?,
        }),
        (None, None) => None,
        _ => {
            return Err(StoreError::Settings(
                "a Redis client certificate needs both tls_cert and tls_key".into(),
            ));
        }
    };
    let root_cert = tls.ca.as_deref().map(|ca| read("CA", ca)).transpose()?;
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| StoreError::Settings(format!("{shown}: TLS set-up: {e}")))
}

enum Connections {
    Multiplexed {
        conns: Vec<ConnectionManager>,
        next: AtomicUsize,
    },
    Deadpool(deadpool_redis::Pool),
}

/// Budget state in Redis.
pub struct RedisStore {
    connections: Arc<Connections>,
    keys: Keys,
    retention: Retention,
    timeout: Duration,
    reserve: Script,
    settle: Script,
    renew: Script,
    status: Script,
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
        let url = redact_url(&settings.url);
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
        let info = client.get_connection_info().clone();
        let count = settings.connections.max(1);
        let connections = match settings.pool {
            PoolKind::Multiplexed => {
                // The store deadline (`timeout`) governs every call; redis-rs's own
                // 500 ms response timeout would cut calls short under it.
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(None)
                    .set_connection_timeout(Some(settings.timeout.max(Duration::from_secs(1))))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(2));
                let conns = (0..count)
                    .map(|_| {
                        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| StoreError::Settings(format!("{url}: {e}")))?;
                Connections::Multiplexed {
                    conns,
                    next: AtomicUsize::new(0),
                }
            }
            PoolKind::Deadpool => {
                let mut cfg = deadpool_redis::Config::from_connection_info(info);
                cfg.pool = Some(deadpool_redis::PoolConfig::new(count));
                let pool = cfg
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .map_err(|e| StoreError::Settings(format!("{url}: {e}")))?;
                Connections::Deadpool(pool)
            }
        };
        let store = RedisStore {
            connections: Arc::new(connections),
            keys,
            retention,
            timeout: settings.timeout,
            reserve: Script::new(scripts::RESERVE),
            settle: Script::new(scripts::SETTLE),
            renew: Script::new(scripts::RENEW),
            status: Script::new(scripts::STATUS),
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
    pub fn with_clock_key(mut self, clock_key: &str) -> Self {
        let clocked = |script: &str| {
            let clock = format!(
                "local function clock_us() return tonumber(redis.call('GET', '{clock_key}')) end"
            );
            Script::new(&script.replacen(layout::SERVER_CLOCK, &clock, 1))
        };
        self.reserve = clocked(scripts::RESERVE);
        self.settle = clocked(scripts::SETTLE);
        self.renew = clocked(scripts::RENEW);
        self.status = clocked(scripts::STATUS);
        self
    }

    /// PINGs every connection until it answers, for a bounded time: the
    /// breaker's probe, and at start-up, so every connection is made before
    /// the first call.
    async fn ping_all(&self, classify: Classify) -> Result<(), StoreError> {
        // A connection that broke fails its first command and reconnects in
        // the background (with a short backoff): PING each until it answers,
        // for a bounded time, so the breaker half-opens only once every
        // connection real calls will use is back.
        let attempt = self.timeout.max(Duration::from_millis(200));
        let deadline = tokio::time::Instant::now() + (attempt * 3).max(PROBE_WINDOW);
        match self.connections.as_ref() {
            Connections::Multiplexed { conns, .. } => {
                let pings = conns.iter().map(|conn| async move {
                    ping_until(deadline, attempt, || {
                        let mut conn = conn.clone();
                        async move { redis::cmd("PING").query_async::<()>(&mut conn).await }
                    })
                    .await
                });
                for result in futures_util::future::join_all(pings).await {
                    result.map_err(|e| classify(&self.url, e))?;
                }
            }
            Connections::Deadpool(pool) => {
                // Checking a connection out PINGs it and replaces a broken one.
                ping_until(deadline, attempt, || async {
                    let mut conn = pool.get().await.map_err(pool_error)?;
                    redis::cmd("PING").query_async::<()>(&mut conn).await
                })
                .await
                .map_err(|e| classify(&self.url, e))?;
            }
        }
        Ok(())
    }

    /// Whether Redis has answered the version check and loaded the scripts.
    pub fn reachable(&self) -> bool {
        self.verified.load(Ordering::Relaxed)
    }

    /// The version check and script load, once per store.
    async fn verify(&self) -> Result<(), StoreError> {
        if self.reachable() {
            return Ok(());
        }
        // Redis answering with a refusal (a wrong password, a TLS handshake
        // it rejects) is a settings error, not an outage. Each step is bounded.
        self.ping_all(classify_answered).await?;
        let within = self.timeout.max(Duration::from_secs(1));
        tokio::time::timeout(within, self.check_version(classify_answered))
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "{} did not answer INFO within {} ms",
                    self.url,
                    within.as_millis()
                ))
            })??;
        self.load_scripts(classify_answered).await?;
        self.verified.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The scripts declare flags with a `#!lua` line, which Redis understands
    /// from 7.0 on; an older server is refused with a clear message.
    async fn check_version(&self, classify: Classify) -> Result<(), StoreError> {
        let info: String = match self.connections.as_ref() {
            Connections::Multiplexed { conns, .. } => {
                redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut conns[0].clone())
                    .await
            }
            Connections::Deadpool(pool) => {
                let mut conn = pool
                    .get()
                    .await
                    .map_err(pool_error)
                    .map_err(|e| classify(&self.url, e))?;
                redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut conn)
                    .await
            }
        }
        .map_err(|e| classify(&self.url, e))?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(str::trim)
            .unwrap_or("unknown");
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if major < 7 {
            return Err(StoreError::Protocol(format!(
                "{} runs Redis {version}; ctxbudget needs Redis 7.0 or newer",
                self.url
            )));
        }
        Ok(())
    }

    /// Loads every script (startup, and a cheap readiness probe).
    async fn load_scripts(&self, classify: Classify) -> Result<(), StoreError> {
        for script in [&self.reserve, &self.settle, &self.renew, &self.status] {
            let load = async {
                match self.connections.as_ref() {
                    Connections::Multiplexed { conns, .. } => {
                        script
                            .prepare_invoke()
                            .load_async(&mut conns[0].clone())
                            .await
                    }
                    Connections::Deadpool(pool) => {
                        let mut conn = pool.get().await.map_err(pool_error)?;
                        script.prepare_invoke().load_async(&mut conn).await
                    }
                }
            };
            tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), load)
                .await
                .map_err(|_| {
                    StoreError::Unavailable(format!("{}: loading scripts timed out", self.url))
                })?
                .map_err(|e| classify(&self.url, e))?;
        }
        Ok(())
    }

    /// Runs one script invocation under the store deadline.
    ///
    /// The redis-rs call is boxed: its future is about 7 KB, and unboxed every
    /// future above it (store, engine, handler, tonic's own box) held it, some
    /// twice, so each call copied tens of KB on the way down (`perf`: 11% of the
    /// service's CPU in `memmove`).
    async fn run(&self, invocation: &ScriptInvocation<'_>) -> Result<Vec<Value>, StoreError> {
        let call = Box::pin(async {
            match self.connections.as_ref() {
                Connections::Multiplexed { conns, next } => {
                    let i = next.fetch_add(1, Ordering::Relaxed) % conns.len();
                    invocation
                        .invoke_async::<Vec<Value>>(&mut conns[i].clone())
                        .await
                }
                Connections::Deadpool(pool) => {
                    let mut conn = pool.get().await.map_err(pool_error)?;
                    invocation.invoke_async::<Vec<Value>>(&mut conn).await
                }
            }
        });
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| classify(&self.url, e)),
            Err(_) => Err(StoreError::Unanswered(format!(
                "{} did not answer within {} ms",
                self.url,
                self.timeout.as_millis()
            ))),
        }
    }

    /// Runs a plain pipeline (no scripts) under the store deadline; boxed as in `run`.
    async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, StoreError> {
        let call = Box::pin(async {
            match self.connections.as_ref() {
                Connections::Multiplexed { conns, next } => {
                    let i = next.fetch_add(1, Ordering::Relaxed) % conns.len();
                    pipe.query_async::<T>(&mut conns[i].clone()).await
                }
                Connections::Deadpool(pool) => {
                    let mut conn = pool.get().await.map_err(pool_error)?;
                    pipe.query_async::<T>(&mut conn).await
                }
            }
        });
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| classify(&self.url, e)),
            Err(_) => Err(StoreError::Unanswered(format!(
                "{} did not answer within {} ms",
                self.url,
                self.timeout.as_millis()
            ))),
        }
    }

    /// The levels of a settlement as KEYS, with their level bits or bucket specs.
    fn settlement_keys(&self, s: &Settlement<'_>, inv: &mut ScriptInvocation<'_>) {
        for lp in s.levels {
            inv.key(self.keys.level(lp.level, &s.id.tenant, s.id.user.as_ref()));
        }
        inv.key(self.keys.record(s.id));
    }
}

impl Store for RedisStore {
    async fn reserve(&self, plan: &ReservePlan) -> Result<ReserveReply, StoreError> {
        let id = &plan.id;
        let mut inv = self.reserve.prepare_invoke();
        for lp in &plan.levels {
            inv.key(self.keys.level(lp.level, &id.tenant, id.user.as_ref()));
        }
        inv.key(self.keys.record(id));
        let idem_ttl = match &plan.idempotency_key {
            Some(k) => {
                inv.key(self.keys.idempotency(&id.tenant, k));
                self.retention.idempotency_ms
            }
            None => 0,
        };
        let mut spec = Spec::default();
        spec.push(plan.levels.len() as f64)
            .push(plan.prompt_tokens as f64)
            .push(plan.max_output_tokens as f64)
            .push(plan.min_output_tokens as f64)
            .push(plan.lease_ttl_ms as f64 * 1000.0)
            .push(plan.estimated_prompt_tokens as f64);
        for lp in &plan.levels {
            spec.push(lp.buckets.len() as f64)
                .push(lp.concurrency.map_or(-1.0, |c| c as f64))
                .buckets(lp);
        }
        inv.arg(&spec.0)
            .arg(lease_field(id))
            .arg(plan.lease_ttl_ms + self.retention.record_ms)
            .arg(idem_ttl)
            .arg(record_tail(plan))
            .arg(DOUBLES)
            .arg(doubles(spec.count()));
        for lp in &plan.levels {
            inv.arg(doubles(3 + 3 * lp.buckets.len()));
        }
        let reply = self.run(&inv).await?;
        let nlev = plan.levels.len();
        let tag = int_at(&reply, 0)?;
        match tag {
            3 => return Ok(ReserveReply::IdempotencyConflict),
            4 => {
                return Ok(ReserveReply::IdempotencySpent {
                    settled: string_at(&reply, 1)? != "R",
                });
            }
            _ => {}
        }
        let now = int_at(&reply, 1)? as f64;
        let granted_output = int_at(&reply, 2)?.max(0) as u64;
        let states = (0..nlev)
            .map(|i| state_at(&reply, 3 + i))
            .collect::<Result<Vec<_>, _>>()?;
        let readings = state::readings(&plan.levels, &states, &[], now);
        // A reply may end with the reclaimed leases, packed 17 bits per level.
        let extras = match tag {
            1 => 0,
            0 => 1,
            _ => 3,
        };
        let base = 3 + nlev + extras;
        let packed = match reply.len() {
            n if n == base => 0,
            n if n == base + 1 => int_at(&reply, base)?.max(0) as u64,
            n => {
                return Err(StoreError::Protocol(format!(
                    "reserve script replied with {n} values, expected {base} or {} (is \
                     lua/reserve.lua out of step with this binary?)",
                    base + 1
                )));
            }
        };
        let mut reclaimed = Reclaimed::default();
        for (i, lp) in plan.levels.iter().enumerate() {
            reclaimed.add(lp.level, (packed >> (17 * i)) & 0x1_ffff);
        }
        Ok(match tag {
            1 => ReserveReply::Allowed {
                readings,
                granted_output,
                reclaimed,
            },
            0 => ReserveReply::Denied {
                readings,
                denied_mask: int_at(&reply, 3 + nlev)? as u64,
                reclaimed,
            },
            2 => ReserveReply::Replayed {
                nonce: string_at(&reply, 3 + nlev)?,
                tokens: int_at(&reply, 4 + nlev)? as u64,
                lease_expires_in_ms: int_at(&reply, 5 + nlev)?.max(0) as u64,
                readings,
                reclaimed,
            },
            other => return Err(unexpected("reserve", other)),
        })
    }

    async fn commit(
        &self,
        s: Settlement<'_>,
        actual_tokens: u64,
        actual_prompt_tokens: u64,
    ) -> Result<SettleReply, StoreError> {
        self.settle_call(s, 1.0, actual_tokens, actual_prompt_tokens)
            .await
    }

    async fn refund(&self, s: Settlement<'_>) -> Result<SettleReply, StoreError> {
        self.settle_call(s, 2.0, 0, 0).await
    }

    async fn estimator_samples(&self, keys: &[String]) -> Result<Vec<Vec<f64>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.cmd("LRANGE")
                .arg(self.keys.estimator(k))
                .arg(0)
                .arg(-1);
        }
        let lists: Vec<Vec<Vec<u8>>> = self.query(&pipe).await?;
        Ok(lists
            .into_iter()
            .map(|list| {
                list.iter()
                    .filter_map(|b| b.as_slice().try_into().ok().map(f64::from_le_bytes))
                    .collect()
            })
            .collect())
    }

    async fn renew(&self, s: Settlement<'_>, ttl_ms: u64) -> Result<RenewReply, StoreError> {
        let mut inv = self.renew.prepare_invoke();
        self.settlement_keys(&s, &mut inv);
        let mut spec = Spec::default();
        spec.push(s.levels.len() as f64)
            .push(ttl_ms as f64 * 1000.0);
        for lp in s.levels {
            spec.push(f64::from(lp.level.bit()));
        }
        inv.arg(&spec.0)
            .arg(lease_field(s.id))
            .arg(self.retention.record_ms)
            .arg(s.id.owner_tag().to_le_bytes().as_slice())
            .arg(DOUBLES);
        let reply = self.run(&inv).await?;
        Ok(match int_at(&reply, 0)? {
            1 => RenewReply::Renewed {
                expires_in_ms: int_at(&reply, 1)? as u64,
            },
            0 => RenewReply::AlreadySettled,
            2 => RenewReply::Expired,
            -1 => RenewReply::NotFound,
            other => return Err(unexpected("renew", other)),
        })
    }

    async fn status(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> Result<Readings, StoreError> {
        let mut inv = self.status.prepare_invoke();
        for lp in levels {
            inv.key(self.keys.level(lp.level, scope.tenant, scope.user));
        }
        let mut spec = Spec::default();
        spec.push(levels.len() as f64);
        for lp in levels {
            spec.push(lp.concurrency.map_or(-1.0, |c| c as f64));
        }
        inv.arg(&spec.0)
            .arg(DOUBLES)
            .arg(if exact { "1" } else { "0" });
        let reply = self.run(&inv).await?;
        let now = int_at(&reply, 0)? as f64;
        let mut states = Vec::with_capacity(levels.len());
        let mut leases = Vec::with_capacity(levels.len());
        for i in 0..levels.len() {
            states.push(state_at(&reply, 1 + 3 * i)?);
            let n = int_at(&reply, 2 + 3 * i)? as f64;
            let e = int_at(&reply, 3 + 3 * i)? as f64;
            leases.push(Some((n, e)));
        }
        Ok(state::readings(levels, &states, &leases, now))
    }

    fn shadow(&self) -> Self {
        RedisStore {
            connections: self.connections.clone(),
            keys: self.keys.shadow(),
            retention: self.retention,
            timeout: self.timeout,
            reserve: self.reserve.clone(),
            settle: self.settle.clone(),
            renew: self.renew.clone(),
            status: self.status.clone(),
            url: self.url.clone(),
            verified: self.verified.clone(),
        }
    }

    async fn probe(&self) -> Result<(), StoreError> {
        match self.reachable() {
            true => self.ping_all(classify).await,
            // A store that was unreachable at start-up is checked now.
            false => self.verify().await,
        }
    }

    fn describe(&self) -> String {
        let pool = match self.connections.as_ref() {
            Connections::Multiplexed { conns, .. } => {
                format!("{} multiplexed connections", conns.len())
            }
            Connections::Deadpool(pool) => format!("deadpool of {}", pool.status().max_size),
        };
        format!(
            "redis store at {} ({pool}, key prefix {:?})",
            self.url,
            self.keys.prefix()
        )
    }
}

impl RedisStore {
    async fn settle_call(
        &self,
        s: Settlement<'_>,
        mode: f64,
        actual: u64,
        actual_prompt: u64,
    ) -> Result<SettleReply, StoreError> {
        let mut inv = self.settle.prepare_invoke();
        self.settlement_keys(&s, &mut inv);
        inv.key(self.keys.estimator(&s.id.estimator));
        let mut spec = Spec::default();
        spec.push(s.levels.len() as f64)
            .push(mode)
            .push(actual as f64)
            .push(actual_prompt as f64)
            .push(self.retention.samples as f64);
        for lp in s.levels {
            spec.push(f64::from(lp.level.bit()))
                .push(lp.buckets.len() as f64)
                .buckets(lp);
        }
        inv.arg(&spec.0)
            .arg(lease_field(s.id))
            .arg(self.retention.record_ms)
            .arg(s.id.owner_tag().to_le_bytes().as_slice())
            .arg(DOUBLES);
        let reply = self.run(&inv).await?;
        let settled = |state: &str, amount: i64| match state {
            "F" => Settled::Refunded(amount.max(0) as u64),
            _ => Settled::Committed(amount),
        };
        let mode = if mode == 2.0 { "F" } else { "C" };
        Ok(match int_at(&reply, 0)? {
            1 => SettleReply::Applied {
                settled: settled(mode, int_at(&reply, 1)?),
                estimated_prompt_tokens: int_at(&reply, 2)?.max(0) as u64,
            },
            0 => SettleReply::AlreadySettled(settled(&string_at(&reply, 1)?, int_at(&reply, 2)?)),
            -1 => SettleReply::NotFound,
            other => return Err(unexpected("settle", other)),
        })
    }
}

/// The shortest time a probe keeps trying a connection.
const PROBE_WINDOW: Duration = Duration::from_millis(1500);

/// Runs `ping` until it succeeds or `deadline` passes, each attempt cut at
/// `attempt`; the last error if it never answered.
async fn ping_until<F, Fut>(
    deadline: tokio::time::Instant,
    attempt: Duration,
    mut ping: F,
) -> Result<(), RedisError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), RedisError>>,
{
    loop {
        let err = match tokio::time::timeout(attempt, ping()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no PING reply within {} ms", attempt.as_millis()),
            )),
        };
        if tokio::time::Instant::now() + Duration::from_millis(50) >= deadline {
            return Err(err);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
