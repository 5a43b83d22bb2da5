//! Configuration changes without a restart.
//!
//! - With Redis, every replica listens on the configuration channel and, as a
//!   safety net for a lost message, compares the stored version with its own
//!   every second; either way it loads, validates and swaps in the new limits.
//!   Requests in flight finish under the limits they started with; none fails.
//! - In memory mode, SIGHUP re-reads the configuration file.
//! - In both modes, SIGHUP re-reads the file's caller tokens (`[auth]`).
//!
//! A configuration that does not validate is logged and ignored: the replica
//! keeps the last good one.

use crate::app::Auth;
use crate::config::{
    AlertSettings, ConfigDoc, EnvoySection, ExtProcSection, FileConfig, FileDocs, Flags,
};
use crate::domain::Limits;
use crate::engine::Engine;
use crate::gateway::LiveMap;
use crate::gateway::ext_proc::LiveReading;
use crate::store::Store;
use crate::store::config_repo::ConfigStore;
use futures_util::StreamExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The last configuration version found invalid (logged once).
static REJECTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// How often the stored version is compared with the applied one.
pub const VERSION_CHECK: Duration = Duration::from_secs(1);

/// What a configuration is applied to: the engine's limits and the Envoy
/// service's descriptor map, validated together.
pub struct Live<S> {
    /// The engine, whose limits change.
    pub engine: Arc<Engine<S>>,
    /// The Envoy service's `[envoy]` map.
    pub envoy_map: Arc<LiveMap>,
    /// The external processor's `[ext_proc]`.
    pub ext_proc: Arc<LiveReading>,
    /// `[alerts]`: where threshold alerts go (re-read from the file on SIGHUP).
    pub alerts: Arc<tokio::sync::watch::Sender<AlertSettings>>,
    /// The file's documents in force, on a replica whose configuration is
    /// its file (`None` with Redis).
    pub file_docs: Option<Arc<FileDocs>>,
}

impl<S> Clone for Live<S> {
    fn clone(&self) -> Self {
        Live {
            engine: self.engine.clone(),
            envoy_map: self.envoy_map.clone(),
            ext_proc: self.ext_proc.clone(),
            alerts: self.alerts.clone(),
            file_docs: self.file_docs.clone(),
        }
    }
}

impl<S: Store> Live<S> {
    /// Puts `limits` and `envoy` in force (no longer provisional). The map
    /// goes first, so the Envoy service is never left with the file's map
    /// once the limits are the store's; a descriptor mapped in between meets
    /// the old limits, as any request racing a change may.
    pub fn apply(&self, limits: Limits, envoy: &EnvoySection, ext_proc: &ExtProcSection) {
        self.envoy_map.replace(envoy);
        self.ext_proc.replace(ext_proc);
        self.engine.set_limits(Arc::new(limits));
    }
}

/// Loads the configuration from Redis and applies it if it validates.
/// Returns the version now applied.
pub async fn apply_from_redis<S: Store>(live: &Live<S>, cfg: &ConfigStore) -> Option<u64> {
    let engine = &live.engine;
    let doc = match cfg.load().await.and_then(ConfigDoc::from_stored) {
        Ok(doc) => doc,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the configuration; keeping the current one");
            return None;
        }
    };
    match doc.limits() {
        Ok(limits) => {
            let version = limits.version;
            if version != engine.limits().version {
                tracing::info!(
                    version,
                    tiers = limits.tiers.len(),
                    overrides = limits.overrides.len(),
                    "applied configuration version {version}"
                );
            }
            live.apply(
                limits,
                &doc.envoy.clone().unwrap_or_default(),
                &doc.ext_proc.clone().unwrap_or_default(),
            );
            Some(version)
        }
        Err(e) => {
            // Once per bad version: the version check would repeat it every second.
            if REJECTED.swap(doc.version, std::sync::atomic::Ordering::Relaxed) != doc.version {
                tracing::error!(
                    version = doc.version,
                    error = %e,
                    "configuration version {} is invalid; keeping version {} (fix it with \
                     `ctxbudget tiers set` or `ctxbudget models set` for the field the error \
                     names, or re-seed an emptied Redis with `ctxbudget tiers import`)",
                    doc.version,
                    engine.limits().version
                );
            }
            None
        }
    }
}

/// Follows configuration changes in Redis until the task is aborted.
pub async fn watch_redis<S: Store>(live: Live<S>, cfg: ConfigStore) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // On a cluster there is no subscription: the version is checked every second.
        let subscription = match cfg.client().map(|c| c.get_async_pubsub()) {
            None => None,
            Some(pubsub) => match pubsub.await {
                Ok(mut pubsub) => match pubsub.subscribe(cfg.channel()).await {
                    Ok(()) => Some(pubsub.into_on_message()),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot subscribe to configuration changes; checking the version every second");
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to configuration changes; checking the version every second");
                    None
                }
            },
        };
        // A change may have been missed while (re)subscribing.
        apply_if_newer(&live, &cfg).await;
        let mut tick = tokio::time::interval(VERSION_CHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        match subscription {
            Some(mut messages) => loop {
                tokio::select! {
                    message = messages.next() => match message {
                        Some(_) => {
                            apply_from_redis(&live, &cfg).await;
                            backoff = Duration::from_millis(100);
                        }
                        None => {
                            tracing::warn!("configuration subscription lost; resubscribing");
                            break;
                        }
                    },
                    _ = tick.tick() => apply_if_newer(&live, &cfg).await,
                }
            },
            None => {
                // Without a subscription, poll until the backoff says to retry it.
                let until = tokio::time::Instant::now() + backoff.max(VERSION_CHECK);
                while tokio::time::Instant::now() < until {
                    tick.tick().await;
                    apply_if_newer(&live, &cfg).await;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

async fn apply_if_newer<S: Store>(live: &Live<S>, cfg: &ConfigStore) {
    match cfg.version().await {
        Ok(v) if v != live.engine.limits().version => {
            apply_from_redis(live, cfg).await;
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "configuration version check failed"),
    }
}

/// On every SIGHUP, until the task is aborted: re-reads the configuration
/// file's caller tokens, and reloads the limits — from Redis in Redis mode,
/// from the file in memory mode.
pub async fn on_sighup<S: Store>(
    live: Live<S>,
    file: Option<PathBuf>,
    redis: Option<ConfigStore>,
    auth: Arc<Auth>,
) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            return;
        };
        while hup.recv().await.is_some() {
            reload_file(&live, file.as_deref(), redis.is_none(), &auth);
            if let Some(cfg) = &redis {
                apply_from_redis(&live, cfg).await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (live, file, redis, auth);
        std::future::pending::<()>().await;
    }
}

/// Re-reads the file (or the built-in defaults): its caller tokens always, its
/// tiers, global limits and overrides when `limits` (memory mode; with Redis
/// they live there). Other settings (listen address, store, TLS) need a
/// restart. A file that does not validate changes nothing.
pub fn reload_file<S: Store>(
    live: &Live<S>,
    file: Option<&std::path::Path>,
    limits: bool,
    auth: &Auth,
) {
    let mut config = FileConfig::built_in();
    if let Some(path) = file {
        match FileConfig::read(path) {
            Ok(f) => config = config.overlay(f),
            Err(e) => {
                tracing::error!(error = %e, "reload failed; keeping the current configuration");
                return;
            }
        }
    }
    match config.settings(Flags::default()) {
        Ok(settings) => {
            // Refused (and logged) when it would turn authentication off.
            let _ = auth.replace(settings.tokens);
            let alerts = settings.alerts;
            live.alerts.send_if_modified(|now| {
                let changed = *now != alerts;
                if changed {
                    tracing::info!(receiver = ?alerts.webhook_url, "reloaded [alerts]");
                    *now = alerts;
                }
                changed
            });
            if limits {
                let mut limits = settings.limits.as_ref().clone();
                if let Some(docs) = &live.file_docs {
                    limits.version = docs.replace(settings.seed);
                }
                tracing::info!(
                    file = ?file,
                    tiers = limits.tiers.len(),
                    overrides = limits.overrides.len(),
                    "reloaded tiers, global limits and overrides (other settings apply at restart)"
                );
                live.apply(limits, &settings.envoy, &settings.ext_proc);
            }
        }
        Err(e) => tracing::error!(error = %e, "reload failed; keeping the current configuration"),
    }
}
