//! Configuration: the built-in defaults (`config/ctxbudget.example.toml`), a TOML
//! file, environment variables and flags, in rising precedence, turned into
//! validated domain values. Unknown fields are errors, and every error names the
//! field at fault.
//!
//! - [`sections`]: the file's schema, and the server, store and reservations
//!   sections.
//! - [`rates`]: rates and periods as written; [`level`]: one level's limits.
//! - [`limits`]: tiers as written, and every limit section → domain limits.
//! - [`models`]: model groups, tiers' per-group limits and priorities as written.
//! - [`overrides`]: tenants' overrides as written.
//! - [`estimation`], [`resilience`], [`auth`]: those sections, and how they
//!   validate into the settings of the estimator, the engine (its breaker and
//!   failure policy) and the gRPC layer.
//! - [`settings`]: [`Settings`], built section by section.
//! - [`input`]: operator documents (TOML or JSON) with errors naming fields.
//! - [`live`]: the live configuration's documents (kept in Redis by
//!   `store::config_repo`) as sections.

pub mod alerts;
pub mod auth;
pub mod dims;
pub mod envoy;
pub mod estimation;
pub mod ext_proc;
mod input;
pub mod level;
pub mod limits;
pub mod live;
pub mod models;
pub mod money;
pub mod overrides;
pub mod rates;
pub mod resilience;
pub mod sections;
mod server;
pub mod settings;
pub mod telemetry;

pub use alerts::{AlertSettings, AlertsSection};
pub use auth::{AuthSection, MIN_TOKEN_LEN, Role, TokenSection, read_token_files, validate_tokens};
pub use envoy::EnvoySection;
pub use estimation::EstimatorSection;
pub use ext_proc::{ExtProcSection, OtherRequests};
pub use input::{Document, DocumentError, parse_document};
pub use level::LevelSection;
pub use limits::{LimitSections, ShadowSection, TierSection, build_limits};
pub use live::{ConfigDoc, FileDocs, LiveDocs};
pub use models::{ModelLimitsSection, ModelSection, PrioritiesSection};
pub use money::{MoneySection, PriceSection};
pub use overrides::{LevelOverrideSection, OverrideSection, ShadowOverrideSection, UNLIMITED};
pub use rates::rates;
pub use rates::{Period, PeriodError, RateSection, period_seconds};
pub use resilience::ResilienceSection;
pub use sections::{
    FileConfig, HttpSection, QueueSection, ReservationsSection, ServerSection, StoreSection,
};
pub use settings::{AdmissionSettings, Settings, TlsFiles};
pub use telemetry::TelemetrySection;

use crate::domain::{Limits, LimitsError};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

/// Sections whose keys a file may set one by one, the others keeping their
/// built-in values.
pub const KEYED_SECTIONS: [&str; 5] =
    ["server", "store", "reservations", "resilience", "estimator"];

/// The defaults, built into the binary: exactly the example file.
pub const BUILT_IN: &str = include_str!("../../../../config/ctxbudget.example.toml");

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
    /// `--http-listen`.
    pub http_listen: Option<SocketAddr>,
    /// `--redis-url`.
    pub redis_url: Option<String>,
    /// `--redis-cluster-nodes` (empty: not given).
    pub redis_cluster_nodes: Vec<String>,
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
        self.http = other.http.or(self.http);
        self.store = other.store.or(self.store);
        self.reservations = other.reservations.or(self.reservations);
        self.global = other.global.or(self.global);
        self.models = other.models.or(self.models);
        self.prices = other.prices.or(self.prices);
        self.money = other.money.or(self.money);
        self.priorities = other.priorities.or(self.priorities);
        self.tiers = other.tiers.or(self.tiers);
        self.estimator = other.estimator.or(self.estimator);
        self.overrides = other.overrides.or(self.overrides);
        self.resilience = other.resilience.or(self.resilience);
        self.auth = other.auth.or(self.auth);
        self.envoy = other.envoy.or(self.envoy);
        self.ext_proc = other.ext_proc.or(self.ext_proc);
        self.alerts = other.alerts.or(self.alerts);
        self.queue = other.queue.or(self.queue);
        self.telemetry = other.telemetry.or(self.telemetry);
        self
    }

    /// The limits this file defines, validated.
    pub fn limits(&self) -> Result<Limits, ConfigError> {
        let (no_models, no_tiers, no_overrides) =
            (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let no_prices = BTreeMap::new();
        let sections = LimitSections {
            global: self.global.as_ref(),
            models: self.models.as_ref().unwrap_or(&no_models),
            prices: self.prices.as_ref().unwrap_or(&no_prices),
            tiers: self.tiers.as_ref().unwrap_or(&no_tiers),
            overrides: self.overrides.as_ref().unwrap_or(&no_overrides),
            envoy: self.envoy.as_ref(),
            ext_proc: self.ext_proc.as_ref(),
        };
        Ok(build_limits(sections, 0)?)
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
    use crate::domain::Dimension;
    use crate::domain::Rate;
    use crate::engine::FailurePolicy;
    use std::time::Duration;

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
            free.user.rates[Dimension::Requests],
            vec![Rate {
                limit: 10,
                period_secs: 60,
                window: None,
                alert_at: Default::default(),
            }]
        );
        assert_eq!(
            free.user.rates[Dimension::Tokens],
            vec![Rate {
                limit: 50_000,
                period_secs: 60,
                window: None,
                alert_at: Default::default(),
            }]
        );
        assert_eq!(free.user.concurrency, Some(1));
        assert_eq!(free.max_context_tokens, 32_000);
        let pro = s.limits.tier("pro").unwrap();
        assert_eq!(
            (
                pro.user.rates[Dimension::Requests][0].limit,
                pro.user.rates[Dimension::Tokens][0].limit
            ),
            (60, 500_000)
        );
        assert_eq!(
            (pro.user.concurrency, pro.max_context_tokens),
            (Some(5), 128_000)
        );
        let ent = s.limits.tier("enterprise").unwrap();
        assert_eq!(
            (
                ent.user.rates[Dimension::Requests][0].limit,
                ent.user.rates[Dimension::Tokens][0].limit
            ),
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
        let ttl = "[tiers.x]\nmax_context_tokens = 10\ndefault_max_output_tokens = 1\nsession_ttl = \"2w\"\n";
        let err = FileConfig::parse(ttl, "f").unwrap().limits().unwrap_err();
        assert!(err.to_string().contains("tiers.x.session_ttl"), "{err}");
    }

    #[test]
    fn a_tier_has_a_session_level_whose_keys_live_a_day_unless_told() {
        let text = "[tiers.x]\nmax_context_tokens = 10\ndefault_max_output_tokens = 1\n\
                    session = { requests = [{ limit = 5, period = \"1h\" }], concurrency = 2 }\n\
                    [tiers.y]\nmax_context_tokens = 10\ndefault_max_output_tokens = 1\n\
                    session_ttl = \"30m\"\n\
                    [tiers.y.models.g]\nsession = { tokens = [{ limit = 9, period = \"1m\" }] }\n\
                    [models.g]\nmatch = [\"g*\"]\n";
        let limits = FileConfig::parse(text, "f").unwrap().limits().unwrap();
        let x = limits.tier("x").unwrap();
        assert_eq!(
            (
                x.session.rates[Dimension::Requests][0].limit,
                x.session.concurrency
            ),
            (5, Some(2))
        );
        assert_eq!(x.session_ttl_secs, 86_400);
        let y = limits.tier("y").unwrap();
        assert_eq!(y.session_ttl_secs, 1_800);
        assert_eq!(y.models["g"].session.rates[Dimension::Tokens][0].limit, 9);
    }

    #[test]
    fn periods_parse() {
        assert_eq!(period_seconds("90s"), Ok(90));
        assert_eq!(period_seconds("1d"), Ok(86_400));
        assert_eq!(period_seconds("45"), Ok(45));
        assert!(period_seconds("1w").is_err());
        assert!(period_seconds("m").is_err());
    }
}
