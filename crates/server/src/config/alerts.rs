//! `[alerts]`: where threshold alerts go (a webhook), how they are signed,
//! and how long the store keeps trying (docs/operations.md#threshold-alerts).
//! The thresholds themselves are `alert_at` on each limit (live quotas).
//!
//! ```toml
//! [alerts]
//! webhook_url = "https://hooks.example.com/ctxbudget"
//! secret = "…"              # HMAC-SHA256 key of x-ctxbudget-signature
//! timeout_ms = 5000         # one POST
//! max_queued = 1000         # per tenant; a crossing past it is dropped and counted
//! max_age = "24h"           # an alert not delivered by then is dropped and counted
//! max_backoff_ms = 60000    # the longest wait between two tries
//! ```

use super::input::within;
use super::rates::Period;
use crate::domain::LimitsError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[alerts]` as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsSection {
    /// The receiver: an `http://` or `https://` URL; none: alerts are only
    /// logged and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
    /// The key of the body's HMAC-SHA256 signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// How long one POST may take (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The most alerts one tenant's queue holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u64>,
    /// How long an undelivered alert is kept trying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Period>,
    /// The longest wait between two tries (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff_ms: Option<u64>,
}

/// `[alerts]` validated.
#[derive(Clone, PartialEq)]
pub struct AlertSettings {
    /// The receiver, if any.
    pub webhook_url: Option<String>,
    /// The signing key, if any.
    pub secret: Option<String>,
    /// One POST's deadline.
    pub timeout: Duration,
    /// The most alerts one tenant's queue holds.
    pub max_queued: usize,
    /// How long an undelivered alert is kept trying.
    pub max_age: Duration,
    /// The longest wait between two tries.
    pub max_backoff: Duration,
}

/// The secret stays out of logs.
impl std::fmt::Debug for AlertSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlertSettings")
            .field("webhook_url", &self.webhook_url)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .field("max_queued", &self.max_queued)
            .field("max_age", &self.max_age)
            .field("max_backoff", &self.max_backoff)
            .finish()
    }
}

impl Default for AlertSettings {
    fn default() -> Self {
        AlertsSection::default()
            .settings()
            .expect("the defaults are valid")
    }
}

impl AlertsSection {
    /// The settings, checked.
    pub fn settings(&self) -> Result<AlertSettings, LimitsError> {
        if let Some(url) = &self.webhook_url {
            let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
            if !scheme_ok || url.parse::<tonic::codegen::http::Uri>().is_err() {
                return Err(LimitsError::new(
                    "alerts.webhook_url",
                    format!("{url:?} is not an http:// or https:// URL"),
                ));
            }
        }
        if self.secret.as_ref().is_some_and(String::is_empty) {
            return Err(LimitsError::new(
                "alerts.secret",
                "is empty: give a key, or leave it out to send unsigned alerts",
            ));
        }
        let timeout_ms = self.timeout_ms.unwrap_or(5_000);
        within("alerts.timeout_ms", timeout_ms, 100, 60_000)?;
        let max_queued = self.max_queued.unwrap_or(1_000);
        within("alerts.max_queued", max_queued, 1, 100_000)?;
        let max_age = match &self.max_age {
            Some(p) => p
                .seconds()
                .map_err(|e| LimitsError::new("alerts.max_age", e.to_string()))?,
            None => 86_400,
        };
        within("alerts.max_age", max_age, 60, 30 * 86_400)?;
        let max_backoff_ms = self.max_backoff_ms.unwrap_or(60_000);
        within("alerts.max_backoff_ms", max_backoff_ms, 100, 3_600_000)?;
        Ok(AlertSettings {
            webhook_url: self.webhook_url.clone(),
            secret: self.secret.clone(),
            timeout: Duration::from_millis(timeout_ms),
            max_queued: max_queued as usize,
            max_age: Duration::from_secs(max_age),
            max_backoff: Duration::from_millis(max_backoff_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_is_an_http_url_and_bounds_hold() {
        let ok = AlertsSection {
            webhook_url: Some("http://127.0.0.1:9/hook".into()),
            secret: Some("k".into()),
            ..AlertsSection::default()
        };
        let s = ok.settings().unwrap();
        assert_eq!((s.max_queued, s.max_age.as_secs()), (1_000, 86_400));
        assert!(
            !format!("{s:?}").contains("\"k\""),
            "the secret stays out of logs"
        );
        for (bad, field) in [
            (
                AlertsSection {
                    webhook_url: Some("ftp://x".into()),
                    ..AlertsSection::default()
                },
                "alerts.webhook_url",
            ),
            (
                AlertsSection {
                    max_queued: Some(0),
                    ..AlertsSection::default()
                },
                "alerts.max_queued",
            ),
        ] {
            assert!(bad.settings().unwrap_err().to_string().contains(field));
        }
    }
}
