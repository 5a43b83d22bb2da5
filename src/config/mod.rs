//! Configuration: the built-in defaults (`config/ctxbudget.example.toml`), a TOML
//! file, environment variables and flags, in rising precedence, turned into
//! validated domain values. Unknown fields are errors, and every error names the
//! field at fault.
//!
//! Size: past 400 lines because `FileConfig::settings` still turns every
//! section into settings in one place; splitting it per section is issue 11.

mod input;
mod overrides;
mod sections;

pub use input::{Document, parse_document};
pub use overrides::{LevelOverrideSection, OverrideSection, ShadowOverrideSection, UNLIMITED};
pub use sections::*;

use crate::domain::plan::LeasePolicy;
use crate::domain::{Limits, LimitsError};
use crate::store::Retention;
use crate::store::redis::PoolKind;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Sections whose keys a file may set one by one, the others keeping their
/// built-in values.
pub const KEYED_SECTIONS: [&str; 5] =
    ["server", "store", "reservations", "resilience", "estimator"];

/// The defaults, built into the binary: exactly the example file.
pub const BUILT_IN: &str = include_str!("../../config/ctxbudget.example.toml");

/// Validated settings the server runs with. `Debug` hides the Redis password.
#[derive(Clone)]
pub struct Settings {
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// Redis URL; `None` selects the in-memory store.
    pub redis_url: Option<String>,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Redis connection strategy.
    pub pool: PoolKind,
    /// Redis connections.
    pub connections: usize,
    /// Certificates for `rediss://`.
    pub redis_tls: crate::store::redis::RedisTls,
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
    /// The configuration file read, if any (SIGHUP re-reads it).
    pub config_path: Option<PathBuf>,
    /// The tiers, global limits and overrides as written: what seeds Redis
    /// when it holds no configuration yet.
    pub seed: crate::store::config::ConfigDoc,
    /// What happens when the store fails.
    pub policy: FailurePolicy,
    /// Replicas sharing the store (`local` divides limits by it).
    pub replicas: u64,
    /// The store's circuit breaker.
    pub breaker: crate::engine::BreakerSettings,
    /// Largest request accepted, in bytes.
    pub max_message_bytes: usize,
    /// Model rules for counting.
    pub models: crate::estimator::ModelRules,
    /// The adaptive multiplier.
    pub adaptive: crate::estimator::AdaptiveSettings,
    /// Long prompts counted at once.
    pub count_workers: usize,
    /// Tokens callers must present (empty: no authentication).
    pub tokens: Vec<crate::api::auth::TokenSection>,
    /// TLS for the gRPC listener.
    pub tls: Option<TlsFiles>,
}

/// The PEM files of the gRPC listener's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// CA that signs client certificates; set: mutual TLS.
    pub client_ca: Option<PathBuf>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field(
                "redis_url",
                &self
                    .redis_url
                    .as_deref()
                    .map(crate::store::redis::redact_url),
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

/// Configuration could not be read or is invalid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value breaks a rule.
    #[error("invalid configuration: {0}")]
    Invalid(#[from] LimitsError),
}

/// Flags from the command line or environment.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--redis-url`.
    pub redis_url: Option<String>,
    /// `--key-prefix`.
    pub key_prefix: Option<String>,
}

impl FileConfig {
    /// Parses TOML text; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: without_source_lines(&e.to_string()),
        })
    }

    /// Reads and parses a file. In the settings sections ([`KEYED_SECTIONS`])
    /// every key the file leaves out keeps its built-in value, so a file may
    /// set one lease length without restating the rest; the limits sections
    /// (`[global]`, `[tiers]`, `[overrides]`) and `[auth]` a file defines
    /// replace the built-in ones wholly.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let parse_error = |message: String| ConfigError::Parse {
            path: shown.clone(),
            message,
        };
        let mut file: toml::Table =
            toml::from_str(&text).map_err(|e| parse_error(without_source_lines(&e.to_string())))?;
        let built_in: toml::Table =
            toml::from_str(BUILT_IN).expect("the built-in configuration parses");
        for name in KEYED_SECTIONS {
            if let (Some(toml::Value::Table(section)), Some(toml::Value::Table(defaults))) =
                (file.get_mut(name), built_in.get(name))
            {
                for (key, value) in defaults {
                    section.entry(key.clone()).or_insert_with(|| value.clone());
                }
            }
        }
        serde_path_to_error::deserialize(toml::Value::Table(file)).map_err(|e| {
            let message = without_source_lines(&e.inner().to_string());
            parse_error(format!("{}: {message}", e.path()))
        })
    }

    /// The built-in defaults.
    pub fn built_in() -> Self {
        Self::parse(BUILT_IN, "built-in defaults").expect("the built-in configuration parses")
    }

    /// `self` with every section `other` defines replaced by `other`'s.
    pub fn overlay(mut self, other: FileConfig) -> Self {
        self.server = other.server.or(self.server);
        self.store = other.store.or(self.store);
        self.reservations = other.reservations.or(self.reservations);
        self.global = other.global.or(self.global);
        self.tiers = other.tiers.or(self.tiers);
        self.estimator = other.estimator.or(self.estimator);
        self.overrides = other.overrides.or(self.overrides);
        self.resilience = other.resilience.or(self.resilience);
        self.auth = other.auth.or(self.auth);
        self
    }

    /// The limits this file defines, validated.
    pub fn limits(&self) -> Result<Limits, ConfigError> {
        let empty = BTreeMap::new();
        Ok(build_limits(
            self.global.as_ref(),
            self.tiers.as_ref().unwrap_or(&empty),
            self.overrides.as_ref().unwrap_or(&BTreeMap::new()),
            0,
        )?)
    }

    /// Validated settings, with `overrides` applied last.
    pub fn settings(self, overrides: Flags) -> Result<Settings, ConfigError> {
        let limits = self.limits()?;
        let seed = crate::store::config::ConfigDoc {
            version: 0,
            global: self.global.clone(),
            tiers: self.tiers.clone().unwrap_or_default(),
            overrides: self.overrides.clone().unwrap_or_default(),
        };
        let defaults = Self::built_in();
        let server = self.server.or(defaults.server).expect("built-in [server]");
        let store = self.store.or(defaults.store).expect("built-in [store]");
        let res = self
            .reservations
            .or(defaults.reservations)
            .expect("built-in [reservations]");
        let redis_url = overrides
            .redis_url
            .or(store.redis_url)
            .filter(|u| !u.trim().is_empty());
        let key_prefix = overrides.key_prefix.unwrap_or(store.key_prefix);
        crate::store::keys::Keys::new(&key_prefix)
            .map_err(|problem| LimitsError::new("store.key_prefix", problem))?;
        let within = |field: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(LimitsError::new(
                    field,
                    format!("must be between {min} and {max}, got {value}"),
                ))
            }
        };
        const DAY_MS: u64 = 86_400_000;
        within("store.timeout_ms", store.timeout_ms, 1, 60_000)?;
        within("store.connections", store.connections as u64, 1, 256)?;
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
        )?;
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
        within("estimator.window", est.window as u64, 1, 10_000)?;
        within(
            "estimator.min_samples",
            est.min_samples as u64,
            1,
            est.window as u64,
        )?;
        within("estimator.workers", est.workers as u64, 0, 1024)?;
        let ok = |v: f64| v.is_finite() && (0.1..=100.0).contains(&v);
        if !(ok(est.min_multiplier)
            && ok(est.max_multiplier)
            && est.min_multiplier <= est.max_multiplier)
        {
            return Err(LimitsError::new(
                "estimator.min_multiplier",
                "min_multiplier and max_multiplier must be between 0.1 and 100, min ≤ max",
            )
            .into());
        }
        if !(est.min_multiplier..=est.max_multiplier).contains(&est.initial_multiplier) {
            return Err(LimitsError::new(
                "estimator.initial_multiplier",
                "must be between min_multiplier and max_multiplier",
            )
            .into());
        }
        let models = est.model_rules()?;
        let adaptive = crate::estimator::AdaptiveSettings {
            window: est.window,
            min_samples: est.min_samples,
            initial: est.initial_multiplier,
            min: est.min_multiplier,
            max: est.max_multiplier,
        };
        let resilience = self
            .resilience
            .or(defaults.resilience)
            .expect("built-in [resilience]");
        within("resilience.replicas", resilience.replicas, 1, 10_000)?;
        within(
            "resilience.breaker_min_calls",
            u64::from(resilience.breaker_min_calls),
            1,
            1_000_000,
        )?;
        within(
            "resilience.breaker_probes",
            u64::from(resilience.breaker_probes),
            1,
            1000,
        )?;
        within(
            "resilience.breaker_close_after",
            u64::from(resilience.breaker_close_after),
            1,
            1000,
        )?;
        within(
            "resilience.breaker_window_ms",
            resilience.breaker_window_ms,
            100,
            3_600_000,
        )?;
        within(
            "resilience.breaker_cool_down_ms",
            resilience.breaker_cool_down_ms,
            10,
            3_600_000,
        )?;
        if !(resilience.breaker_failure_rate > 0.0 && resilience.breaker_failure_rate <= 1.0) {
            return Err(LimitsError::new(
                "resilience.breaker_failure_rate",
                "must be above 0 and at most 1",
            )
            .into());
        }
        let breaker = crate::engine::BreakerSettings {
            window: Duration::from_millis(resilience.breaker_window_ms),
            min_calls: resilience.breaker_min_calls,
            failure_rate: resilience.breaker_failure_rate,
            cool_down: Duration::from_millis(resilience.breaker_cool_down_ms),
            probes: resilience.breaker_probes,
            close_after: resilience.breaker_close_after,
        };
        let tokens = self.auth.unwrap_or_default().tokens;
        crate::api::auth::validate(&tokens)
            .map_err(|(field, problem)| LimitsError::new(format!("auth.tokens{field}"), problem))?;
        let tls = match (server.tls_cert, server.tls_key, server.tls_client_ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), client_ca) => Some(TlsFiles {
                cert,
                key,
                client_ca,
            }),
            _ => {
                return Err(LimitsError::new(
                    "server.tls_cert",
                    "TLS needs both tls_cert and tls_key (tls_client_ca adds mutual TLS on top)",
                )
                .into());
            }
        };
        let count_workers = match est.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        Ok(Settings {
            listen: overrides.listen.unwrap_or(server.listen),
            redis_url,
            key_prefix,
            pool: store.pool,
            connections: store.connections,
            redis_tls: crate::store::redis::RedisTls {
                ca: store.tls_ca,
                cert: store.tls_cert,
                key: store.tls_key,
            },
            store_timeout: Duration::from_millis(store.timeout_ms),
            leases: LeasePolicy {
                default_ttl_ms: res.default_lease_ttl_ms,
                max_ttl_ms: res.max_lease_ttl_ms,
            },
            retention: Retention {
                record_ms: res.retention_ms,
                idempotency_ms: res.idempotency_ttl_ms,
                samples: est.window,
            },
            retry_jitter_ms: res.retry_jitter_ms,
            concurrency_retry_ms: res.concurrency_retry_ms,
            limits: Arc::new(limits),
            max_message_bytes: server.max_message_bytes,
            config_path: None,
            seed,
            policy: resilience.policy,
            replicas: resilience.replicas,
            breaker,
            models,
            adaptive,
            count_workers,
            tokens,
            tls,
        })
    }
}

/// A TOML error without the excerpt of the file it quotes (`3 | token = …`):
/// the file may hold secrets, and the error reaches logs. The line and column
/// and the message stay.
fn without_source_lines(message: &str) -> String {
    message
        .lines()
        .filter(|line| {
            let rest = line
                .trim_start()
                .trim_start_matches(|c: char| c.is_ascii_digit());
            !rest.trim_start().starts_with('|')
        })
        .filter(|line| !line.trim().is_empty())
        .collect::<Vec<_>>()
        .join(": ")
}

/// Loads the built-in defaults overlaid with `path` (if any) and `overrides`.
pub fn load(path: Option<&Path>, overrides: Flags) -> Result<Settings, ConfigError> {
    let mut file = FileConfig::built_in();
    if let Some(path) = path {
        file = file.overlay(FileConfig::read(path)?);
    }
    let mut settings = file.settings(overrides)?;
    settings.config_path = path.map(Path::to_path_buf);
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Rate;

    #[test]
    fn a_file_may_set_settings_keys_one_by_one() {
        let dir = std::env::temp_dir().join(format!("ctxbudget-keyed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        let read = |text: &str| {
            std::fs::write(&path, text).unwrap();
            FileConfig::read(&path)
        };
        let file = read(
            "[reservations]\ndefault_lease_ttl_ms = 5000\n[resilience]\npolicy = \"fail_closed\"\n",
        )
        .expect("the other keys keep their defaults");
        let s = FileConfig::built_in()
            .overlay(file)
            .settings(Flags::default())
            .unwrap();
        assert_eq!(s.leases.default_ttl_ms, 5000);
        assert_eq!(s.leases.max_ttl_ms, 900_000, "the built-in maximum");
        assert_eq!(s.policy, FailurePolicy::FailClosed);
        assert_eq!(
            s.breaker.cool_down,
            Duration::from_secs(1),
            "the built-in cool-down"
        );
        let err = read("[reservations]\nretention_ms = \"long\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("reservations.retention_ms"),
            "names the field: {err}"
        );
        let err = read("[reservations]\nretention = 5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("retention"), "names the unknown key: {err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parse_errors_do_not_quote_the_file() {
        let secret = "s3cret-token-0123456789";
        for text in [
            format!("[[auth.tokens]]\nname = \"a\"\ntokn = \"{secret}\"\n"),
            format!("[[auth.tokens]]\nname = \"a\"\ntoken = {secret}\n"),
        ] {
            let err = FileConfig::parse(&text, "f.toml").unwrap_err().to_string();
            assert!(!err.contains(secret), "{err}");
            assert!(err.contains("line 3"), "keeps the position: {err}");
        }
    }

    #[test]
    fn built_in_tiers_are_the_documented_ones() {
        let s = FileConfig::built_in().settings(Flags::default()).unwrap();
        let free = s.limits.tier("free").unwrap();
        assert_eq!(
            free.user.requests,
            vec![Rate {
                limit: 10,
                period_secs: 60
            }]
        );
        assert_eq!(
            free.user.tokens,
            vec![Rate {
                limit: 50_000,
                period_secs: 60
            }]
        );
        assert_eq!(free.user.concurrency, Some(1));
        assert_eq!(free.max_context_tokens, 32_000);
        let pro = s.limits.tier("pro").unwrap();
        assert_eq!(
            (pro.user.requests[0].limit, pro.user.tokens[0].limit),
            (60, 500_000)
        );
        assert_eq!(
            (pro.user.concurrency, pro.max_context_tokens),
            (Some(5), 128_000)
        );
        let ent = s.limits.tier("enterprise").unwrap();
        assert_eq!(
            (ent.user.requests[0].limit, ent.user.tokens[0].limit),
            (300, 2_000_000)
        );
        assert_eq!(
            (ent.user.concurrency, ent.max_context_tokens),
            (Some(20), 256_000)
        );
        assert!(s.redis_url.is_none(), "in-memory by default");
    }

    #[test]
    fn errors_name_the_field() {
        let bad = "[tiers.x]\nmax_context_tokens = 10\ndefault_max_output_tokens = 1\nuser = { tokens = [{ limit = 5, period = \"2w\" }] }\n";
        let err = FileConfig::parse(bad, "f").unwrap().limits().unwrap_err();
        assert!(
            err.to_string().contains("tiers.x.user.tokens[0].period"),
            "{err}"
        );
        let unknown = "[store]\nredis_urll = \"x\"\n";
        let err = FileConfig::parse(unknown, "f").unwrap_err();
        assert!(err.to_string().contains("redis_urll"), "{err}");
        let negative = "[global]\nconcurrency = -1\n";
        assert!(FileConfig::parse(negative, "f").is_err());
    }

    #[test]
    fn periods_parse() {
        assert_eq!(parse_period("90s"), Ok(90));
        assert_eq!(parse_period("1d"), Ok(86_400));
        assert_eq!(parse_period("45"), Ok(45));
        assert!(parse_period("1w").is_err());
        assert!(parse_period("m").is_err());
    }
}
