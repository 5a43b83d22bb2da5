//! What a Redis-backed replica starts with: the live configuration in Redis
//! (seeded from the file when Redis holds none), or — while Redis does not
//! answer — the file's, replaced by Redis's once it does.

use super::ServeError;
use crate::config::{ConfigDoc, EnvoySection, ExtProcSection, Settings};
use crate::domain::Limits;
use crate::reload::{self, Live};
use crate::store::Store;
use crate::store::config_repo::ConfigStore;
use std::sync::Arc;

/// What a Redis-backed replica found when it started.
pub struct RedisStart {
    /// Where the configuration lives.
    pub config: ConfigStore,
    /// Redis answered at start-up.
    pub reachable: bool,
    /// The tiers, global limits and overrides were loaded from Redis (else the
    /// replica decides with the file's until Redis answers, then loads them).
    pub loaded: bool,
}

/// What a Redis-backed replica starts with: the configuration in Redis when
/// it answers (seeded from the file if empty), else the file's until it does.
pub(super) async fn redis_start(
    mut settings: Settings,
    cfg: ConfigStore,
    reachable: bool,
) -> Result<(Settings, RedisStart), ServeError> {
    let mut loaded = false;
    if reachable {
        match startup_limits(&cfg, &settings).await {
            Ok((limits, envoy, ext_proc)) => {
                settings.limits = Arc::new(limits);
                settings.envoy = envoy;
                settings.ext_proc = ext_proc;
                loaded = true;
            }
            Err(ServeError::Store(e)) if e.is_transient() => {
                tracing::warn!(error = %e, "cannot read the configuration in Redis yet");
            }
            Err(e) => return Err(e),
        }
    }
    let start = RedisStart {
        config: cfg,
        reachable,
        loaded,
    };
    Ok((settings, start))
}

/// The limits and `[envoy]` map a Redis-backed replica starts with: Redis's
/// configuration, seeded first from the file (or the built-in defaults) if
/// Redis holds no tier yet.
async fn startup_limits(
    cfg: &ConfigStore,
    settings: &Settings,
) -> Result<(Limits, EnvoySection, ExtProcSection), ServeError> {
    let source = settings
        .config_path
        .as_ref()
        .map_or("the built-in defaults".to_string(), |p| {
            p.display().to_string()
        });
    let actor = format!("ctxbudget serve (seed from {source})");
    match cfg.seed(&settings.seed.documents(), &actor).await? {
        Some(version) => tracing::info!(
            "Redis held no tiers: seeded it from {source} (configuration version {version})"
        ),
        None => tracing::info!(
            "using the tiers, global limits and overrides stored in Redis; those of {source} are ignored \
             (change them with `ctxbudget tiers|global|overrides`)"
        ),
    }
    let doc = ConfigDoc::from_stored(cfg.load().await?)?;
    if let Some(file_map) = &settings.seed.envoy
        && doc.envoy.as_ref() != Some(file_map)
    {
        tracing::warn!(
            "the [envoy] map of {source} differs from the one in Redis, which is used (change \
             it with `ctxbudget envoy set`)"
        );
    }
    let limits = doc.limits().map_err(|e| {
        ServeError::Settings(format!(
            "the configuration in Redis (version {}) is invalid: {e}; fix it with `ctxbudget tiers set`",
            doc.version
        ))
    })?;
    Ok((
        limits,
        doc.envoy.unwrap_or_default(),
        doc.ext_proc.unwrap_or_default(),
    ))
}

/// For a replica that started before Redis answered: seeds and loads the
/// configuration once Redis answers (until then it decides with the file's),
/// then follows its changes.
pub(super) async fn load_when_reachable<S: Store>(
    live: Live<S>,
    cfg: ConfigStore,
    settings: Settings,
) {
    let mut backoff = std::time::Duration::from_millis(100);
    loop {
        match startup_limits(&cfg, &settings).await {
            Ok((limits, envoy, ext_proc)) => {
                tracing::info!(
                    version = limits.version,
                    "Redis answers: applied configuration version {}",
                    limits.version
                );
                live.apply(limits, &envoy, &ext_proc);
                break;
            }
            Err(ServeError::Store(e)) if e.is_transient() => {
                tracing::debug!(error = %e, "the configuration in Redis is not reachable yet");
            }
            Err(e) => {
                // Invalid configuration in Redis: keep the file's and follow
                // changes, so a fix through the CLI applies.
                tracing::error!(error = %e, "cannot apply the configuration in Redis; keeping the file's");
                break;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_millis(500));
    }
    reload::watch_redis(live, cfg).await;
}
